"""The DAGs executed with `dag.test()` on the local target, against lake tables built by the real pipeline.

Kafka, ingest, Spark and Hudi are real; Airflow runs each task in-process, and the tasks
spark-submit the project's CLI in .venv, as the scheduler would.
"""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest
from conftest import DAGS, PROJECT, lakehouse

from tests.hudi_files import log_files, pending_compactions
from tests.plant import BAD_STATUS

# Short bronze retention: the file slices that compaction replaces are cleaned in the same run.
OVERRIDES = """
[bronze.table]
"hoodie.clean.policy" = "KEEP_LATEST_COMMITS"
"hoodie.clean.commits.retained" = 1
"hoodie.keep.min.commits" = 3
"hoodie.keep.max.commits" = 5
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def lake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Two ingest runs of a generated workload into bronze, with table services external (no inline compaction)."""
    root, port = tmp_path / "lake", _free_port()
    (tmp_path / "overrides.toml").write_text(OVERRIDES)
    env = {"LAKEHOUSE_ROOT": str(root), "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{port}",
           "LAKEHOUSE_SOURCE_STATE": str(tmp_path / "source.json"), "LAKEHOUSE_TABLE_SERVICES": "external",
           "LAKEHOUSE_HUDI_OVERRIDES": str(tmp_path / "overrides.toml"), "LAKEHOUSE_TARGET": "local"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    kafka_dir = str(tmp_path / "kafka")
    lakehouse("kafka", "up", "--port", str(port), "--data-dir", kafka_dir)
    try:
        lakehouse("generate", "--seed", "5", "--customers", "150", "--orders", "400", "--changes", "800")
        lakehouse("ingest", "--once")
        lakehouse("generate", "--changes", "300")
        lakehouse("ingest", "--once")
        yield root
    finally:
        lakehouse("kafka", "down", "--data-dir", kafka_dir)


def _run(dag_id: str) -> tuple[str, set[str]]:
    """Run a DAG with dag.test(); its state and the ids of its tasks that did not succeed."""
    from airflow.models.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS), include_examples=False)
    assert bag.import_errors == {}, bag.import_errors
    run = bag.dags[dag_id].test()
    return run.state, {ti.task_id for ti in run.get_task_instances() if ti.state != "success"}


def _succeeds(dag_id: str) -> None:
    state, failed = _run(dag_id)
    assert state == "success" and not failed, f"{dag_id}: run {state}, tasks not successful: {failed}"


@pytest.mark.slow
def test_etl_then_table_services_on_real_tables(lake: Path) -> None:
    _succeeds("lakehouse_incremental_etl")
    for table in ("silver/customers", "silver/orders", "gold/customer_ltv", "gold/daily_revenue"):
        assert list((lake / table / ".hoodie").glob("timeline/*.commit")), f"{table}: no commit after the etl run"

    bronze = {t: str(lake / "bronze" / t) for t in ("customers", "orders")}
    before = {t: log_files(p) for t, p in bronze.items()}
    assert all(before.values()), "bronze has no log files to compact: the ingest ran its own compaction"
    _succeeds("data_quality")
    _succeeds("hudi_table_services")
    for t, path in bronze.items():
        assert pending_compactions(path) == [], f"bronze/{t}: compaction still pending"
    # The cleaner keeps the newest file slice older than the oldest retained commit, so the
    # slices the compaction replaced go once one more commit has landed: ingest, run again.
    lakehouse("generate", "--changes", "100")
    lakehouse("ingest", "--once")
    _succeeds("hudi_table_services")
    for t, path in bronze.items():
        assert pending_compactions(path) == [], f"bronze/{t}: compaction still pending"
        assert not before[t] & log_files(path), f"bronze/{t}: compacted log files were not cleaned"
        assert list((Path(path) / ".hoodie" / "timeline").glob("*.clean")), f"bronze/{t}: no clean"

    _succeeds("lakehouse_incremental_etl")  # silver catches up with the last ingest
    # A planted violation (from the Spark environment, as a faulty upstream job would write it).
    planted = subprocess.run([str(PROJECT / ".venv" / "bin" / "python"), "-m", "tests.plant", str(lake)],
                             cwd=PROJECT, capture_output=True, text=True, timeout=600)
    assert planted.returncode == 0, planted.stderr[-3000:]
    state, failed = _run("data_quality")
    assert state == "failed" and failed == {"validate_silver"}, (state, failed)
    pages = [p.read_text(errors="replace") for p in (lake / "_quality" / "data_docs").rglob("*.html")]
    assert any("silver.orders" in page and BAD_STATUS in page for page in pages), "Data Docs do not name it"
