"""What the lakehouse DAGs share: defaults, and how a Spark job becomes tasks on the configured target.

The target is one setting of the Airflow deployment, `[spark] target` of its lakehouse.toml (`LAKEHOUSE_CONFIG`,
`LAKEHOUSE_PROFILE`; `LAKEHOUSE_TARGET` over it), local | emr, read
when the DAGs are parsed because it decides the operators (`spark_task` for one fixed job,
`mapped_spark_tasks` for the jobs a run decides on: one per work item, a group of tables, by dynamic task
mapping):
- local: a BashOperator running `spark-submit` of the project's CLI in the project's .venv;
- emr: EmrAddStepsOperator + a deferrable EmrStepSensor on the cluster whose id is the Airflow Variable
  `lakehouse_emr_cluster_id`, through the Airflow connection `aws_default`, with the code
  from Variable `lakehouse_code_uri` (an s3:// prefix holding lakehouse.zip and cli.py).
Nothing here imports Spark.

The Airflow Connections the configuration names (`[source] airflow_connection`, `[connect] airflow_connection`, a
secret's `{ airflow_connection = "id" }`) are read by each local task when it runs (`LakehouseBashOperator`) and
handed to its command as `AIRFLOW_CONN_<ID>` in the command's environment alone: .venv has no Airflow to ask, and
neither the command line, the rendered template fields nor the log carry them.
"""

from __future__ import annotations

import logging
import os
import shlex
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import Asset, TaskGroup
from airflow.sdk.definitions.deadline import AsyncCallback, DeadlineAlert, DeadlineReference

from pipelines.deploy.alerts import LakehouseNotifier
from pipelines.deploy.jobs import JOB_ENV, SparkJob
from pipelines.lake.catalog import WriterKind, change_feed_tables, lake_table, names
from pipelines.runtime.lake import Lake
from pipelines.runtime.settings import PROJECT_ROOT
from pipelines.runtime.spark_conf import PARENT_VARIABLE, ROOT_PARENT_VARIABLE

if TYPE_CHECKING:
    from airflow.sdk.definitions.mappedoperator import MappedOperator
    from airflow.sdk.definitions.xcom_arg import PlainXComArg

log = logging.getLogger(__name__)

START = datetime(2026, 1, 1)
DEFAULT_ARGS = {
    "owner": "data-platform",
    "retries": 2,
    "retry_delay": timedelta(minutes=1),
    "execution_timeout": timedelta(hours=1),
}

# Seconds: when set, every DAG's run is late after this long instead of its own `late_after` (read at parse
# time, as the deadline is part of the DAG; the tests' short runs, or a deployment wanting earlier notices).
# `off`: no deadline, for `dag.test()` / `airflow dags test`, which create their run running, never queued:
# Airflow 3.1.8 then cannot compute a queued-at deadline and refuses to create the run.
LATE_AFTER_VARIABLE = "LAKEHOUSE_LATE_AFTER"


def alerting(late_after: timedelta) -> dict:
    """The DAG arguments that make a failed or late run of it send a notice (`pipelines.deploy.alerts`), which
    every DAG of the project passes (`DAG(..., **alerting(...))`; tests/dags/test_dag_imports.py checks).

    Failed: the DAG's `on_failure_callback`, once per failed run, naming the task whose failure ended it (a
    task-level callback would page once per failed task, mapped ones included, for one broken run). Late: a
    Deadline Alert (Airflow 3.1's replacement of SLAs), `late_after` after the run was queued; the
    scheduler hands it to the triggerer only if the run has not succeeded by then. Queued, not the logical
    date: a manual run (the erasure's) has no logical date.
    """
    failed = {"on_failure_callback": LakehouseNotifier(event="failed")}
    setting = os.environ.get(LATE_AFTER_VARIABLE, "").strip()
    if setting == "off":
        return failed
    if setting:
        late_after = timedelta(seconds=float(setting))
    return {**failed, "deadline": DeadlineAlert(reference=DeadlineReference.DAGRUN_QUEUED_AT, interval=late_after,
                                                callback=AsyncCallback(LakehouseNotifier, kwargs={"event": "late"}))}


# The jobs that write the lake beside the stream (etl, table services, quality's Data Docs,
# erasure) take the one slot of this pool in turn: an erasure never interleaves with an etl
# cycle, nor with a compaction or clean of the tables it purges. `dags/airflow_local.sh`
# creates it (ensure_pool); any other deployment once: airflow pools set lakehouse_lake 1 "..." --include-deferred.
# Deferred tasks count: an EMR step's sensor waits deferred (in the triggerer, no worker slot) and still holds the
# slot, so that no other job's step starts on the lake while its step runs.
LAKE_POOL = "lakehouse_lake"
LAKE_POOL_DESCRIPTION = "Lakehouse jobs writing the lake beside the stream: one at a time"


def ensure_pool() -> None:
    """Create LAKE_POOL (one slot) in the Airflow database, or set it back to one slot."""
    from airflow.models.pool import Pool

    Pool.create_or_update_pool(LAKE_POOL, 1, LAKE_POOL_DESCRIPTION, include_deferred=True)


def connections_env() -> dict[str, str]:
    """Inside a task: `AIRFLOW_CONN_<ID>` of each Airflow Connection the deployment's configuration names, read now
    through the Task SDK (which masks their passwords in the task's log); one Airflow does not know is left out and
    named in the log (the command says so too, if it needs it)."""
    from pipelines.runtime.airflow_connections import task_environment
    from pipelines.runtime.config import airflow_connections, load_config

    env, missing = task_environment(airflow_connections(load_config().config))
    if missing:
        log.warning("Airflow Connections the configuration names and Airflow does not know: %s", ", ".join(missing))
    return env


class LakehouseBashOperator(BashOperator):
    """A BashOperator whose command also gets the configuration's Airflow Connections (`connections_env`), added to
    its environment when it runs: after rendering, so that no template field holds them."""

    def get_env(self, context) -> dict:
        return {**super().get_env(context), **connections_env()}


def job(name: str, *args: str) -> SparkJob:
    """A `lakehouse` command as a Spark job, with the deployment's environment.

    The jobs of these DAGs run beside the streaming writer: table services are external.
    """
    env = {k: os.environ[k] for k in JOB_ENV if os.environ.get(k)}
    return SparkJob(name, args, {**env, "LAKEHOUSE_TABLE_SERVICES": "external"})


def dag_lake() -> Lake:
    """The lake the DAGs are parsed for: the deployment's LAKEHOUSE_ROOT and LAKEHOUSE_TABLES, read at each parse,
    so that a changed declaration changes the DAGs' Assets and task lists at the next one. No Spark: the lake's
    session starts only when asked for, and the DAGs never ask."""
    return Lake.from_environment(app="lakehouse-airflow")


def table_asset(name: str, lake: Lake) -> Asset:
    """The Asset of a catalog table (`silver/orders`), named as the catalog names it."""
    return Asset(name=name, uri=_uri(lake_table(name, lake.declaration).path(lake.root)))


def etl_outputs(lake: Lake) -> list[Asset]:
    """The tables an etl cycle (or an erasure) changes that consumers read: the catalog's silver and gold
    tables with a change feed. DAGs scheduled on them run after each."""
    return [table_asset(name, lake) for name in change_feed_tables(lake.declaration) if not name.startswith("bronze/")]


def etl_inputs(lake: Lake) -> list[Asset]:
    """What every etl cycle reads: bronze's change logs (a first or a rebuilding cycle reads bronze's main
    tables and delete ledgers too). The task's OpenLineage inputs."""
    return [table_asset(name, lake) for name in names(lake.declaration, writer=WriterKind.CHANGELOG)]


def _macro(name: str) -> str:
    """A template calling the OpenLineage provider's macro `name` on the task instance, or empty where the
    provider is not installed or not configured (it registers its macros only when it has a transport)."""
    plugin = "macros.OpenLineageProviderPlugin"
    return f"{{{{ {plugin}.{name}(task_instance) if macros is defined and {plugin} is defined else '' }}}}"


# What a task tells its Spark job of itself (pipelines/runtime/spark_conf.py turns them into the listener's
# spark.openlineage.parent*/rootParent* options): the job's events then name the task's run as their parent
# and the DAG run as their root, the ids the provider gives the task's own events.
LINEAGE_ENV = {PARENT_VARIABLE: _macro("lineage_parent_id"), ROOT_PARENT_VARIABLE: _macro("lineage_root_parent_id")}


def _uri(path: str) -> str:
    return path if "://" in path else f"file://{path}"


def spark_task(spark_job: SparkJob, outlets: list[Asset] | None = None, doc_md: str | None = None,
               inlets: list[Asset] | None = None):
    """The task (local) or task group (emr: add the step, wait for it) that runs `spark_job`.

    `inlets` and `outlets` are what the OpenLineage provider reports as the task's inputs and outputs (a
    BashOperator has no extractor of its own); outlets are also the Assets the run marks as updated.
    """
    if _target() == "local":
        return LakehouseBashOperator(task_id=spark_job.name, bash_command=spark_job.local_bash(),
                            env={**spark_job.local_env(), **LINEAGE_ENV}, append_env=True, inlets=inlets or [],
                            outlets=outlets or [], doc_md=doc_md, pool=LAKE_POOL)
    from airflow.providers.amazon.aws.operators.emr import EmrAddStepsOperator
    from airflow.providers.amazon.aws.sensors.emr import EmrStepSensor

    cluster = "{{ var.value.lakehouse_emr_cluster_id }}"
    # Adding a step is not retried: a retry after a timeout would add the step twice
    # (apache/airflow#28704); the sensor retries. The sensor waits deferred, holding the pool's slot (the pool
    # counts deferred tasks) but no worker slot until the step ends.
    with TaskGroup(spark_job.name, tooltip=doc_md) as group:
        # The step's environment names the add_step task's run as the job's parent (rendered with the steps).
        with_parent = SparkJob(spark_job.name, spark_job.args, {**spark_job.env, **LINEAGE_ENV})
        EmrAddStepsOperator(task_id="add_step", job_flow_id=cluster, aws_conn_id="aws_default",
                            steps=[with_parent.emr_step("{{ var.value.lakehouse_code_uri }}")], doc_md=doc_md,
                            retries=0, pool=LAKE_POOL, inlets=inlets or []) >> \
            EmrStepSensor(task_id="wait_for_step", job_flow_id=cluster, aws_conn_id="aws_default",
                          step_id=f"{{{{ ti.xcom_pull(task_ids='{spark_job.name}.add_step')[0] }}}}",
                          poke_interval=60, deferrable=True, pool=LAKE_POOL, outlets=outlets or [])
    return group


def _label(decision: str) -> str:
    """A mapped task's label in the UI (map_index_template): its work item's, the tables its job covers, read from
    the decision's XCom (the mapped list itself: item i is map index i) when the task ends."""
    return f"{{{{ ti.xcom_pull(task_ids='{decision}')[ti.map_index]['label'] }}}}"


def mapped_spark_tasks(name: str, work: PlainXComArg, doc_md: str) -> MappedOperator | TaskGroup:
    """One Spark job per item of `work` (`{"label": ..., "tables": [...], "args": [the lakehouse command]}`), the
    list a task of the same run returns, each item a group of tables (`pipelines.services.due`: at most
    `tables_per_job`): dynamic task mapping, so the DAG keeps its few tasks whatever the table count, and an empty
    list starts no job (the mapped task is skipped). Each mapped task is labelled with the tables it covers. As
    `spark_task`: a task (local) or a group of a mapped add_step and a mapped wait_for_step (emr), every one in
    LAKE_POOL."""
    label = _label(work.operator.task_id)
    if _target() == "local":
        return LakehouseBashOperator.partial(task_id=name, env={**job(name).local_env(), **LINEAGE_ENV},
                                             append_env=True, doc_md=doc_md, pool=LAKE_POOL,
                                             map_index_template=label).expand(bash_command=work.map(local_command))
    from airflow.providers.amazon.aws.operators.emr import EmrAddStepsOperator
    from airflow.providers.amazon.aws.sensors.emr import EmrStepSensor

    cluster = "{{ var.value.lakehouse_emr_cluster_id }}"
    # As in spark_task: adding a step is not retried, the sensor waits deferred holding the pool's slot. Map index i of
    # either task is work item i: the sensor waits for the step its add_step of the same index added.
    with TaskGroup(name, tooltip=doc_md) as group:
        added = EmrAddStepsOperator.partial(task_id="add_step", job_flow_id=cluster, aws_conn_id="aws_default",
                                            doc_md=doc_md, retries=0, pool=LAKE_POOL, map_index_template=label
                                            ).expand(steps=work.map(emr_steps))
        EmrStepSensor.partial(task_id="wait_for_step", job_flow_id=cluster, aws_conn_id="aws_default",
                              poke_interval=60, deferrable=True, pool=LAKE_POOL, map_index_template=label
                              ).expand(step_id=added.output.map(added_step))
    return group


def _work_job(work: dict) -> SparkJob:
    """The job of a work item, named after its command and label (`services bronze/orders, bronze/customers`): the
    Spark application's and the EMR step's name."""
    return job(f"{work['args'][0]} {work['label']}", *work["args"])


def local_command(work: dict) -> str:
    """The bash command of a work item on the local target (resolved in the mapped task, on the worker)."""
    return _work_job(work).local_bash()


def emr_steps(work: dict) -> list[dict]:
    """The EMR step of a work item, with the code of the Variable `lakehouse_code_uri` as it is when the task runs
    (values a mapped task gets from an XCom are not templates: Airflow renders none of them)."""
    from airflow.sdk import Variable

    return [_work_job(work).emr_step(Variable.get("lakehouse_code_uri"))]


def added_step(step_ids: list[str]) -> str:
    """The id of the one step an add_step task added (what its sensor waits for)."""
    return step_ids[0]


def _target() -> str:
    """`[spark] target` of the deployment's configuration (its file, LAKEHOUSE_TARGET over it), read at parse time:
    it decides the operators."""
    from pipelines.runtime.config import load_config

    return load_config().config.spark.target


def stream_task(doc_md: str):
    """The task that runs `params.action` on the bronze stream of the configured target.

    Not in LAKE_POOL: the stream writes bronze beside every other job, and a stop may wait
    minutes for the batch in progress.
    """
    action = "{{ params.action }}"
    timing = {"retries": 1, "execution_timeout": timedelta(minutes=30), "doc_md": doc_md}
    if _target() == "local":
        env = _stream_env()
        lakehouse = shlex.quote(str(PROJECT_ROOT / ".venv" / "bin" / "lakehouse"))
        return LakehouseBashOperator(task_id="supervise", bash_command=f"{lakehouse} stream {action}", env=env,
                            append_env=True, **timing)
    from airflow.providers.standard.operators.python import PythonOperator

    return PythonOperator(task_id="supervise", python_callable=supervise_emr_stream,
                          op_kwargs={"action": action, "cluster_id": "{{ var.value.lakehouse_emr_cluster_id }}",
                                     "code_uri": "{{ var.value.lakehouse_code_uri }}"}, **timing)


def _stream_env() -> dict[str, str]:
    """The deployment's job environment; the stream writes beside the table-services DAG's jobs."""
    return job("bronze-stream").env


def supervise_emr_stream(action: str, cluster_id: str, code_uri: str) -> str:
    """`action` on the stream's EMR step: the EMR API through the `aws_default` connection."""
    from airflow.providers.amazon.aws.hooks.emr import EmrHook

    from pipelines.deploy.stream_emr import EmrStream

    stream = EmrStream(EmrHook(aws_conn_id="aws_default").conn, cluster_id, code_uri, dag_lake().root, _stream_env())
    result = stream.run(action)
    print(result)
    return result
