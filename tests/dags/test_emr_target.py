"""The `emr` target: the DAGs' steps, submitted to Amazon EMR.

AWS cannot exist here: the EMR API is moto's mock (`moto.mock_aws`), the only mocked part
of the test suite. What is checked is what reaches the API: the step's spark-submit
arguments and configuration, and the cluster id from the Airflow Variable.
"""

from __future__ import annotations

import os

import boto3
import pytest
from conftest import DAGS
from moto import mock_aws

pytestmark = pytest.mark.integration

CODE_URI = "s3://lakehouse-code/release-1"
LAKE = "s3://lakehouse-data/lake"


@pytest.fixture
def emr_env(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("LAKEHOUSE_TARGET", "emr")
    monkeypatch.setenv("LAKEHOUSE_ROOT", LAKE)
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "b-1.msk.internal:9092")
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", "aws://?region_name=us-east-1")
    monkeypatch.setenv("AIRFLOW_VAR_LAKEHOUSE_CODE_URI", CODE_URI)
    with mock_aws():
        emr = boto3.client("emr", region_name="us-east-1")
        cluster = emr.run_job_flow(
            Name="lakehouse", ReleaseLabel="emr-7.11.0", Applications=[{"Name": "Spark"}, {"Name": "Hadoop"}],
            Instances={"MasterInstanceType": "m5.xlarge", "InstanceCount": 1, "KeepJobFlowAliveWhenNoSteps": True},
            JobFlowRole="EMR_EC2_DefaultRole", ServiceRole="EMR_DefaultRole")["JobFlowId"]
        monkeypatch.setenv("AIRFLOW_VAR_LAKEHOUSE_EMR_CLUSTER_ID", cluster)
        yield emr, cluster


def _dag(dag_id: str):
    from airflow.models.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS), include_examples=False)
    assert bag.import_errors == {}, bag.import_errors
    return bag.dags[dag_id]


def _submit(task) -> list[str]:
    """Render the task's templates (Variables from the environment) and run it against the mock."""
    context = {"var": {"value": _Vars()}, "ti": _XComs()}
    task.render_template_fields(context)
    return task.execute(context)


class _Vars:
    """`var.value.*` as Airflow resolves it outside a DAG run: from AIRFLOW_VAR_* variables."""

    def __getattr__(self, name: str) -> str:
        return os.environ[f"AIRFLOW_VAR_{name.upper()}"]


class _XComs(dict):
    """The operator's XCom pushes (links to the EMR console), kept rather than stored in a DAG run."""

    def xcom_push(self, key: str, value: object) -> None:
        self[key] = value


def test_etl_step_carries_spark_submit_arguments_and_configs(emr_env) -> None:
    emr, cluster = emr_env
    dag = _dag("lakehouse_incremental_etl")
    add = dag.get_task("etl.add_step")
    assert add.retries == 0  # a retried add would add the step twice (apache/airflow#28704)
    (step_id,) = _submit(add)
    step = emr.describe_step(ClusterId=cluster, StepId=step_id)["Step"]
    args = step["Config"]["Args"]
    assert step["Name"] == "lakehouse etl" and step["Config"]["Jar"] == "command-runner.jar"
    assert args[:3] == ["spark-submit", "--deploy-mode", "cluster"]
    assert args[-2:] == [f"{CODE_URI}/cli.py", "etl"]
    assert args[args.index("--py-files") + 1] == f"{CODE_URI}/lakehouse.zip"
    confs = dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "--conf")
    # The cluster's own Hudi bundle, nothing of the local .jvm folder.
    # MSK's IAM login, from the bundle, beside it.
    assert confs["spark.jars"] == f"/usr/lib/hudi/hudi-spark-bundle.jar,{CODE_URI}/aws-msk-iam-auth.jar"
    assert not any(".jvm" in v for v in confs.values())
    assert confs["spark.serializer"] == "org.apache.spark.serializer.KryoSerializer"
    assert confs["spark.sql.extensions"] == "org.apache.spark.sql.hudi.HoodieSparkSessionExtension"
    # The job's environment reaches the driver (YARN application master) and the executors.
    for where in ("spark.yarn.appMasterEnv", "spark.executorEnv"):
        assert confs[f"{where}.LAKEHOUSE_ROOT"] == LAKE
        assert confs[f"{where}.LAKEHOUSE_TARGET"] == "emr"
        assert confs[f"{where}.LAKEHOUSE_TABLE_SERVICES"] == "external"
        assert confs[f"{where}.KAFKA_BOOTSTRAP_SERVERS"] == "b-1.msk.internal:9092"
        # The add_step task's OpenLineage run as the job's parent: empty here, without the provider's macros.
        assert confs[f"{where}.LAKEHOUSE_LINEAGE_PARENT"] == confs[f"{where}.LAKEHOUSE_LINEAGE_ROOT_PARENT"] == ""


def test_table_services_map_a_step_per_group_of_due_tables(emr_env) -> None:
    """The services DAG's jobs are mapped tasks: each group of due tables the run decides on becomes one step, each
    table with its own services, with the code of the Variable as it is when the task runs (XCom values are not
    templates), and a sensor on that step; both mapped tasks are labelled with the group's tables."""
    from jinja2 import Template
    from lakehouse_common import added_step, emr_steps

    emr, cluster = emr_env
    dag = _dag("hudi_table_services")
    add, sensor = dag.get_task("services.add_step"), dag.get_task("services.wait_for_step")
    assert add.partial_kwargs["retries"] == 0  # a retried add would add the step twice (apache/airflow#28704)
    assert sensor.upstream_task_ids == {"services.add_step"} and add.upstream_task_ids == {"due_tables"}
    tables = ["bronze/orders", "bronze/_changelog/orders"]
    work = {"label": "bronze/orders, bronze/_changelog/orders", "tables": tables,
            "args": ["services", "--table", "bronze/orders:compact,clean,archive",
                     "--table", "bronze/_changelog/orders:cluster,clean,archive"]}
    (step_id,) = _submit(add.unmap({"steps": emr_steps(work)}))
    step = emr.describe_step(ClusterId=cluster, StepId=step_id)["Step"]
    args = step["Config"]["Args"]
    assert step["Name"] == "lakehouse services bronze/orders, bronze/_changelog/orders"
    assert args[-6:] == [f"{CODE_URI}/cli.py", *work["args"]]
    assert added_step([step_id]) == step_id
    assert sensor.partial_kwargs["job_flow_id"] == "{{ var.value.lakehouse_emr_cluster_id }}"
    # It waits in the triggerer, holding the lake pool's slot (the pool counts deferred tasks) but no worker's.
    assert sensor.partial_kwargs["deferrable"] is True and sensor.partial_kwargs["pool"] == "lakehouse_lake"
    # Map index i of either task is the decision's item i: its label is that item's.
    other = {"label": "silver/orders", "tables": ["silver/orders"],
             "args": ["services", "--table", "silver/orders:clean,archive"]}
    for task in (add, sensor):
        template = Template(task.map_index_template)
        assert [template.render(ti=_Decided([work, other], i)) for i in (0, 1)] == [work["label"], "silver/orders"]


class _Decided:
    """A mapped task instance at `map_index` of a run whose decision returned `decided`."""

    def __init__(self, decided: list[dict], map_index: int) -> None:
        self.decided, self.map_index = decided, map_index

    def xcom_pull(self, task_ids: str) -> list[dict]:
        assert task_ids == "due_tables"
        return self.decided
