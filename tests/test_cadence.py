"""Per-table cadence: a busy table commits every batch while a quiet one lets its changes wait for its
freshness target, and a SIGKILL in between loses none of what waited (it is read again from Kafka).

The real stream (`lakehouse ingest`, its own process and JVM) on a copy of the suite's base lake,
with the shop declared so that orders is due every batch (target 1 s) and customers never within
the test (target 600 s); then a SIGKILL once orders has committed every record on its topic and
the heartbeat says customers' changes wait, and an `ingest --once` that must leave both tables equal
to the model.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from importlib import resources

import pytest
from kafka import KafkaConsumer, TopicPartition

from lakehouse_dev.generator import WorkloadConfig
from pipelines.ingest.bronze import run_ingest
from pipelines.ingest.state import positions_of
from pipelines.ingest.stream import ControlFiles
from pipelines.lake.layout import changelog_path, main_path
from pipelines.runtime.lake import Lake
from tests.kill import torn_read
from tests.lake import LakeCopy, assert_bronze_equals_model, dead_letters, with_overrides
from tests.model import fold_with_lsn, is_malformed

pytestmark = pytest.mark.integration

TARGETS = {"customers": 600, "orders": 1}


def _declaration(path) -> str:
    """The shop's declaration with a freshness target on each table."""
    text = resources.files("pipelines.lake").joinpath("shop_tables.toml").read_text()
    for table, seconds in TARGETS.items():
        text = text.replace(f"[tables.{table}]\n", f"[tables.{table}]\nfreshness_seconds = {seconds}\n", 1)
    path.write_text(text)
    return str(path)


def _kafka_end(bootstrap: str, topic: str) -> dict[str, int]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
        return {f"{tp.topic}/{tp.partition}": o for tp, o in consumer.end_offsets(parts).items()}
    finally:
        consumer.close()


def test_a_quiet_table_waits_and_a_sigkill_loses_nothing_it_waited_with(spark, lake: LakeCopy, tmp_path,
                                                                         monkeypatch) -> None:
    from pipelines.lake.declaration import load

    tables = _declaration(tmp_path / "tables.toml")
    monkeypatch.setenv("LAKEHOUSE_TABLES", tables)
    env = {**os.environ, "LAKEHOUSE_ROOT": lake.root, "KAFKA_BOOTSTRAP_SERVERS": lake.bootstrap,
           "LAKEHOUSE_TABLES": tables,
           # No table is busy enough to commit for its count alone; heartbeats every second.
           "LAKEHOUSE_HUDI_OVERRIDES": with_overrides(tmp_path / "overrides.toml",
                                                      "[stream.cadence]\nbusy_changes_per_second = 1000000\n"
                                                      "[stream.health]\nheartbeat_seconds = 1\n")}
    customers_before = positions_of(spark, main_path("customers", lake.root))
    log_path = tmp_path / "ingest.log"
    with log_path.open("w") as log_file:
        job = subprocess.Popen([sys.executable, "-m", "pipelines.cli", "ingest", "--trigger-seconds", "1"],
                               env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        lake.produce(lake.source.changes(WorkloadConfig(seed=41, changes=300, malformed_fraction=0.02)))
        orders_end = _kafka_end(lake.bootstrap, load(tables).topic("orders"))
        files = ControlFiles(lake.root)

        def orders_done_customers_waiting() -> bool:
            applied = [positions_of(spark, p("orders", lake.root)) for p in (main_path, changelog_path)]
            hb = files.heartbeat()
            waiting = (hb.tables or {}).get("customers", {}).get("waiting", 0) if hb else 0
            return all(a.get(tp, 0) >= o for a in applied for tp, o in orders_end.items()) and waiting > 0

        deadline = time.monotonic() + 240
        while not torn_read(orders_done_customers_waiting):
            assert job.poll() is None, "the stream stopped: " + log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "orders did not commit alone: " + log_path.read_text()[-3000:]
            time.sleep(1)
        hb = files.heartbeat()
        assert hb is not None and hb.tables is not None
        assert hb.tables["customers"]["target"] == 600 and hb.tables["customers"]["age"] is not None
        status = subprocess.run([sys.executable, "-m", "pipelines.cli", "status"], env=env, capture_output=True,
                                text=True, check=True).stdout
        line = next(x for x in status.splitlines() if x.startswith("bronze/customers "))
        assert "changes) / 600s" in line and "BEHIND" not in line, status
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    # Customers committed nothing of what it waited with: the killed stream held it in memory only.
    assert positions_of(spark, main_path("customers", lake.root)) == customers_before
    log_text = log_path.read_text()
    assert "customers: waiting=" in log_text, "the batches' lines say what waits"

    # The next stream reads customers' waiting changes from Kafka again: both tables exact.
    run_ingest(Lake.at(lake.root, spark), once=True, bootstrap=lake.bootstrap)
    expected, lsns = fold_with_lsn(lake.sent)
    assert_bronze_equals_model(spark, lake.root, expected, lsns)
    letters = dead_letters(lake.root)
    malformed = [m.value for m in lake.sent if is_malformed(m)]
    assert sorted(d["value"] for d in letters) == sorted(malformed), "every malformed record is a dead letter, once"
    assert positions_of(spark, main_path("customers", lake.root)) != customers_before
