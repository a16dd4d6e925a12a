"""Table services beside a running ingest stream (multi-writer), on real Kafka, Spark and Hudi.

The stream runs with LAKEHOUSE_TABLE_SERVICES=external, as in the Airflow deployment, and
`lakehouse services` (what every task of the `hudi_table_services` DAG runs), in the test's
process, compacts, cleans and archives the same tables twice while it writes. Nothing may
fail, and bronze must equal the model at the end, read by Spark and by hudi-rs.
"""

from __future__ import annotations

import json
import os
import threading
from datetime import UTC, datetime

import pytest

from lakehouse_dev.generator import ShopSource, WorkloadConfig, ensure_topics, produce
from pipelines.lake.catalog import lake_tables
from pipelines.lake.contract import TABLES
from pipelines.lake.layout import main_path
from pipelines.runtime.lake import Lake
from pipelines.services.due import table_services_due
from tests.hudi_files import committed_log_files, deltacommits_since, log_files
from tests.kill import bronze_as_model, running_ingest, wait_while_running
from tests.lake import assert_bronze_equals_model, run_cli, with_overrides
from tests.model import fold_with_lsn

pytestmark = pytest.mark.integration

# Short retention, so that the services' cleaning really deletes file slices during the test.
OVERRIDES = """
[bronze.table]
"hoodie.clean.policy" = "KEEP_LATEST_COMMITS"
"hoodie.clean.commits.retained" = 2
"hoodie.keep.min.commits" = 4
"hoodie.keep.max.commits" = 6
"""


@pytest.mark.slow
def test_services_compact_and_clean_while_ingest_runs(broker, spark, tmp_path, monkeypatch) -> None:
    root = str(tmp_path / "lake")
    env = {**os.environ, "LAKEHOUSE_ROOT": root, "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
           "LAKEHOUSE_TABLE_SERVICES": "external",
           "LAKEHOUSE_HUDI_OVERRIDES": with_overrides(tmp_path / "overrides.toml", OVERRIDES)}
    source = ShopSource(61)
    cfg = WorkloadConfig(seed=61, customers=60, orders=200, changes=300, delete_fraction=0.1)
    ensure_topics(broker.bootstrap)
    sent = source.snapshot(cfg) + source.changes(cfg)
    produce(sent, broker.bootstrap)

    stop = threading.Event()

    def keep_producing() -> None:  # changes keep arriving while the services run
        while not stop.wait(3):
            batch = source.changes(WorkloadConfig(seed=61, customers=60, orders=200, changes=40))
            produce(batch, broker.bootstrap)
            sent.extend(batch)

    log_path = tmp_path / "ingest.log"
    producer = threading.Thread(target=keep_producing, daemon=True)
    try:
        with running_ingest(env, log_path) as ingest:
            producer.start()
            # Something to compact: log files, appended by batches after the first, of completed
            # commits (the planner skips those of a commit in flight).
            wait_while_running(lambda: all(committed_log_files(main_path(t, root)) for t in TABLES),
                               ingest, log_path)
            before = {t: committed_log_files(main_path(t, root)) for t in TABLES}
            reports = []
            for run in range(2):  # in this process: the stream is the other writer, in its own
                if run:  # the cleaner keeps 2 commits: the slices the first run compacted go after 3 more
                    after = datetime.now(UTC).strftime("%Y%m%d%H%M%S%f")[:17]  # an instant, as Hudi writes them
                    wait_while_running(lambda t0=after: all(deltacommits_since(main_path(t, root), t0) >= 3
                                                            for t in TABLES), ingest, log_path, poll=1)
                    # The DAG's decision, from the files alone, before the run (checked against what it did).
                    monkeypatch.setenv("LAKEHOUSE_HUDI_OVERRIDES", env["LAKEHOUSE_HUDI_OVERRIDES"])  # its retention
                    tables = {table.name: table for table in lake_tables(root, Lake.at(root).declaration)}
                    decided = {t: table_services_due(tables[f"bronze/{t}"]) for t in TABLES}
                done = run_cli("services", env=env)
                assert done.exit_code == 0, done.stderr[-3000:]
                reports.append({r["table"]: r for r in map(json.loads, done.stdout.splitlines())})
                assert ingest.poll() is None, "ingest died beside the services: " + log_path.read_text()[-3000:]
            stop.set()
            producer.join()
            expected, lsns = fold_with_lsn(sent)
            wait_while_running(lambda: bronze_as_model(root) == expected, ingest, log_path)
    finally:
        stop.set()

    for t in TABLES:
        first = reports[0][f"bronze/{t}"]
        assert first["compact"]["executed"], f"bronze/{t}: the first run compacted nothing: {first}"
        assert reports[1][f"bronze/{t}"]["clean"]["files_deleted"] + first["clean"]["files_deleted"] > 0
        # The log files compacted by the first run were cleaned by the time the second ran.
        assert not before[t] & log_files(main_path(t, root)), f"bronze/{t}: compacted log files still there"
        # What the second run's clean deleted, the decision foresaw: slices the retention had freed by then
        # ("rewrites"), or those of the run's own compaction, which the stream's commits push out of the window
        # while the run goes on ("with compact", on a loaded machine).
        if reports[1][f"bronze/{t}"]["clean"]["files_deleted"]:
            reason = decided[t].get("clean", "")
            assert "rewrites" in reason or reason.startswith("with compact"), (t, decided[t])
        assert "compact" in decided[t], (t, decided[t])
    assert_bronze_equals_model(spark, root, expected, lsns)

