"""The DAGs executed with `dag.test()` on the local target, against lake tables built by the real pipeline.

Kafka, ingest, Spark and Hudi are real; Airflow runs each task in-process, and the tasks
spark-submit the project's CLI in .venv, as the scheduler would.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import DAGS, LINEAGE, PROJECT, lakehouse

from pipelines.monitoring import lineage
from pipelines.runtime.lake import Lake
from pipelines.services.due import services_due
from tests.hudi_files import log_files, pending_compactions
from tests.plant import BAD_STATUS

pytestmark = pytest.mark.integration


def _dag(dag_id: str):
    from airflow.models.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS), include_examples=False)
    assert bag.import_errors == {}, bag.import_errors
    return bag.dags[dag_id]


def _run(dag_id: str) -> tuple[str, set[str]]:
    """Run a DAG with dag.test(); its state and the tasks that did not succeed (a mapped one by its label)."""
    run = _dag(dag_id).test()
    return run.state, {ti.rendered_map_index or ti.task_id for ti in run.get_task_instances() if ti.state != "success"}


def _succeeds(dag_id: str) -> None:
    state, failed = _run(dag_id)
    assert state == "success" and not failed, f"{dag_id}: run {state}, tasks not successful: {failed}"


def _etl_lineage() -> None:
    """The OpenLineage events of the etl task just run, as the provider and its Spark job wrote them to the file
    transports of tests/dags/conftest.py: the task's START and COMPLETE with the datasets the task declares, and
    its Spark application with the task's run as parent and the DAG's run as root, having read every declared
    inlet and written every declared outlet (`lakehouse lineage` prints them so)."""
    from lakehouse_common import dag_lake, etl_inputs, etl_outputs

    runs = lineage.fold(lineage.read_events(sorted(LINEAGE.glob("*.jsonl"))))
    task = max((r for r in runs.values() if r.job == "lakehouse_incremental_etl.etl"), key=lambda r: r.started or "")
    assert task.events == ["START", "COMPLETE"], task.events
    lake = dag_lake()
    declared_in, declared_out = {a.name for a in etl_inputs(lake)}, {a.name for a in etl_outputs(lake)}
    assert {lineage.dataset_name(d) for d in task.inputs} == declared_in, task.inputs
    assert {lineage.dataset_name(d) for d in task.outputs} == declared_out, task.outputs
    (app,) = [r for r in lineage.applications(runs, "lakehouse_etl") if r.parent and r.parent[2] == task.run_id]
    assert app.parent == (task.namespace, task.job, task.run_id) and app.root == task.parent, (app, task)
    assert app.state == "COMPLETE", app.events
    found = lineage.edges(runs, app)
    assert declared_in <= {i for e in found for i in e.inputs}, found
    assert declared_out <= {o for e in found for o in e.outputs}, found
    printed = lakehouse("lineage", "--run", app.run_id)
    assert f"parent: {task.namespace}/{task.job} run {task.run_id} (COMPLETE)" in printed, printed


@pytest.mark.slow
def test_etl_then_table_services_on_real_tables(lake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each DAG once, every task a real spark-submit of the CLI.

    What the jobs themselves must achieve over several runs is the Spark suite's to show
    (tests/test_table_services.py: the compacted log files cleaned by a later run;
    tests/test_quality.py: every suite green on a correct lake); here the DAGs' wiring is
    shown on real tables: each task runs its job, the mapped ones one per group of due tables (at the
    shop's few tables, one group: `tables_per_job` is 10), and a failing check fails its group's task
    while the job's other suites pass, so that the next run checks it alone.
    """
    # The etl job with OpenLineage's listener on (the suite's profile turns it off: hudi_configs/test_profile.toml).
    profile = os.environ["LAKEHOUSE_HUDI_OVERRIDES"]
    (lake.parent / "lineage-on.toml").write_text("[spark.lineage]\nenabled = true\n")
    monkeypatch.setenv("LAKEHOUSE_HUDI_OVERRIDES", os.pathsep.join([profile, str(lake.parent / "lineage-on.toml")]))
    _succeeds("lakehouse_incremental_etl")
    monkeypatch.setenv("LAKEHOUSE_HUDI_OVERRIDES", profile)
    for table in ("silver/customers", "silver/orders", "gold/customer_ltv", "gold/daily_revenue"):
        assert list((lake / table / ".hoodie").glob("timeline/*.commit")), f"{table}: no commit after the etl run"
    _etl_lineage()

    bronze = {t: str(lake / "bronze" / t) for t in ("customers", "orders")}
    before = {t: log_files(p) for t, p in bronze.items()}
    assert all(before.values()), "bronze has no log files to compact: the ingest ran its own compaction"
    _succeeds("hudi_table_services")
    for t, path in bronze.items():
        assert pending_compactions(path) == [], f"bronze/{t}: compaction still pending"
        # A merge-on-read compaction completes as a `commit` (delta commits are `deltacommit`).
        assert list((Path(path) / ".hoodie" / "timeline").glob("*.commit")), f"bronze/{t}: not compacted"
    # The run left no work: the next run's decision maps no job (what it decided this time, the mapped jobs
    # having run, test_many_tables.py checks at many tables).
    decl = Lake.at(str(lake)).declaration
    assert services_due(str(lake), decl) == [], [w.line() for w in services_due(str(lake), decl)]

    # A planted violation (from the Spark environment, as a faulty upstream job would write it): every suite is
    # due (none has passed yet), all in one job of the shop's tables and gold's; the silver check fails that job's
    # task, bronze's and gold's pass on the same real lake (the next run, below, shows it).
    planted = subprocess.run([str(PROJECT / ".venv" / "bin" / "python"), "-m", "tests.plant", str(lake)],
                             cwd=PROJECT, capture_output=True, text=True, timeout=600)
    assert planted.returncode == 0, planted.stderr[-3000:]
    state, failed = _run("data_quality")
    assert state == "failed" and failed == {"customers, orders, gold"}, (state, failed)
    pages = [p.read_text(errors="replace") for p in (lake / "_quality" / "data_docs").rglob("*.html")]
    assert any("silver.orders" in page and BAD_STATUS in page for page in pages), "Data Docs do not name it"
    # The next run checks only what did not pass: the passed suites' tables have not changed since.
    run = _dag("data_quality").test(mark_success_pattern="quality")
    assert run.get_task_instance("changed_suites").xcom_pull(task_ids="changed_suites") == [
        {"label": "orders", "tables": ["orders"], "args": ["quality", "--suite", "silver/orders"]}]
