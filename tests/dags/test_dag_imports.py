"""Every DAG file loads with no import error, imports no Spark, and has what the UI and operators need."""

from __future__ import annotations

import sys

import pytest
from conftest import DAGS

pytestmark = pytest.mark.integration

EXPECTED = {"lakehouse_incremental_etl", "hudi_table_services", "data_quality", "gdpr_erasure", "bronze_ingest_stream",
            "debezium_connector", "lakehouse_reconcile"}


def _dagbag():
    from airflow.models.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS), include_examples=False)


def test_dags_load_without_errors_or_spark() -> None:
    bag = _dagbag()
    assert bag.import_errors == {}, bag.import_errors
    assert set(bag.dag_ids) >= EXPECTED, bag.dag_ids
    assert not [m for m in sys.modules if m == "pyspark" or m.startswith("pyspark.")], "a DAG imported pyspark"


def test_dags_have_owners_retries_timeouts_and_docs() -> None:
    for dag_id, dag in _dagbag().dags.items():
        assert dag.doc_md and len(dag.doc_md) > 200, f"{dag_id}: no docs for the UI"
        assert dag.tags, dag_id
        # gdpr_erasure's runs overlap on purpose (each files its request at once); its erasing
        # task takes the lake pool's one slot (test_lake_writing_tasks_share_the_one_slot_pool).
        if dag_id != "gdpr_erasure":
            assert dag.max_active_runs == 1, f"{dag_id}: runs of a lake writer must not overlap"
        for task in dag.tasks:
            assert task.owner and task.owner != "airflow", f"{dag_id}.{task.task_id}: no owner"
            assert task.execution_timeout is not None, f"{dag_id}.{task.task_id}: no timeout"
            if not task.task_id.endswith("add_step"):
                assert task.retries >= 1, f"{dag_id}.{task.task_id}: no retries"


def test_local_tasks_submit_the_cli_with_the_jars_and_external_table_services() -> None:
    dag = _dagbag().dags["lakehouse_incremental_etl"]
    (task,) = dag.tasks
    command = task.bash_command
    assert ".venv/bin/spark-submit" in command and "pipelines/cli/__main__.py etl" in command
    assert "hudi-spark3.5-bundle_2.12-1.0.2.jar" in command
    assert task.env["LAKEHOUSE_TABLE_SERVICES"] == "external"
    assert {a.name for a in task.outlets} == {"silver/customers", "silver/orders", "gold/customer_ltv",
                                               "gold/daily_revenue"}


def test_lake_writing_tasks_share_the_one_slot_pool() -> None:
    """etl, table services, quality and erasure never run beside each other (the stream runs beside them all:
    its supervising task is outside the pool, as is the watchdog of Debezium's connector)."""
    from lakehouse_common import LAKE_POOL

    for dag_id, dag in _dagbag().dags.items():
        if dag_id in ("bronze_ingest_stream", "debezium_connector"):
            assert {t.pool for t in dag.tasks} == {"default_pool"}
            continue
        for task in dag.tasks:
            # None touches the lake: a request's checks and records, the decisions from the tables' files.
            if task.task_id not in ("validate_request", "forget_request", "due_tables", "changed_suites"):
                assert task.pool == LAKE_POOL, f"{dag_id}.{task.task_id}: pool {task.pool}"


def test_every_dag_notifies_failed_and_late_runs(monkeypatch) -> None:
    """Every DAG, a new one too, sends a notice of a failed run and of a late one (lakehouse_common.alerting)."""
    from pipelines.deploy.alerts import LakehouseNotifier

    monkeypatch.delenv("LAKEHOUSE_LATE_AFTER")  # as deployed (the suite's dag.test() runs go without deadlines)
    for dag_id, dag in _dagbag().dags.items():
        callbacks = dag.on_failure_callback if isinstance(dag.on_failure_callback, list) else [dag.on_failure_callback]
        assert any(isinstance(c, LakehouseNotifier) for c in callbacks), f"{dag_id}: no failure notice"
        (deadline,) = dag.deadline if isinstance(dag.deadline, list) else [dag.deadline]
        assert deadline.callback.path == "pipelines.deploy.alerts.LakehouseNotifier", dag_id
        assert deadline.callback.kwargs == {"event": "late"} and deadline.interval <= dag.dagrun_timeout, dag_id
