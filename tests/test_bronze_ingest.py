"""Generator -> real Kafka -> `ingest --once` -> bronze, checked against the independent model.

Several ingest runs (with more changes, replays after simulated connector restarts,
malformed records and a truncate in between), read back with Spark and with hudi-rs.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter

from pipelines.bronze import run_ingest
from pipelines.contract import COLUMNS
from pipelines.generator import Message, ShopSource, WorkloadConfig, ensure_topics, produce
from tests.kill import pending_instants
from tests.lake import LakeCopy, assert_bronze_equals_model, dead_letters
from tests.model import fold_with_lsn, is_malformed


def _ingest_and_check(spark, bootstrap: str, root: str, source: ShopSource, sent: list[Message], **kw) -> None:
    run_ingest(once=True, root=root, bootstrap=bootstrap, spark=spark, **kw)
    expected, lsns = fold_with_lsn(sent)
    assert expected == source.state, "the model and the simulated database disagree"
    assert_bronze_equals_model(spark, root, expected, lsns)
    malformed = [m for m in sent if is_malformed(m)]
    letters = dead_letters(root)
    assert len(letters) == len(malformed), "every malformed record is a dead letter, once"
    assert Counter(d["value"] for d in letters) == Counter(m.value for m in malformed)
    assert all(d["reason"] and "@" in d["reason"] for d in letters), "reasons name the Kafka position"


def test_bronze_equals_model_across_ingest_runs(spark, broker, tmp_path) -> None:
    # Seed 11 reaches every path seed 3 did (both ran until issue 21), and the truncate.
    seed = 11
    root = str(tmp_path / "lake")
    source = ShopSource(seed)
    cfg = WorkloadConfig(seed=seed, customers=120, orders=360, changes=1200, malformed_fraction=0.02,
                         replay_runs=2)
    ensure_topics(broker.bootstrap, partitions=3)
    sent: list[Message] = []
    for phase in range(3):
        batch = (source.snapshot(cfg) if phase == 0 else []) + source.changes(cfg)
        if phase == 2:
            batch += source.truncate("orders") + source.changes(cfg)
        produce(batch, broker.bootstrap)
        sent += batch
        # Phase 1 splits the backlog into several micro-batches; the others take it in one.
        _ingest_and_check(spark, broker.bootstrap, root, source, sent,
                          max_offsets_per_trigger=500 if phase == 1 else None)
    # Nothing new on the topics: a further run changes nothing.
    _ingest_and_check(spark, broker.bootstrap, root, source, sent)


def test_lost_checkpoint_resumes_from_the_commits_and_applies_nothing_twice(spark, lake: LakeCopy) -> None:
    """The stream's position lives in bronze's own commits: without its checkpoint it resumes there."""
    import shutil

    from pipelines.contract import TABLES
    from pipelines.settings import changelog_path
    from pipelines.settings import ingest_checkpoint_path as checkpoint_path
    from pipelines.table_stats import read_table

    def logged() -> list[tuple[str, int, int]]:
        return sorted((t, r["_kafka_partition"], r["_kafka_offset"]) for t in TABLES for r in read_table(
            changelog_path(t, lake.root), ["_kafka_partition", "_kafka_offset"]).to_pylist())

    before = logged()
    shutil.rmtree(checkpoint_path(lake.root))
    lake.produce(lake.source.changes(WorkloadConfig(seed=5, changes=150, replay_runs=1)))
    _ingest_and_check(spark, lake.bootstrap, lake.root, lake.source, lake.sent)
    after = logged()
    # Every change logged before is still logged once; the run logged only changes of new records.
    assert Counter(after) - Counter(before) == Counter(set(after) - set(before))
    assert not Counter(before) - Counter(after)
    assert len(after) > len(before)


def test_continuous_ingest_catches_up_and_stops_on_sigterm(broker, tmp_path) -> None:
    """The contract's entry point as operators and Airflow call it: the stream keeps going, data
    produced while it runs shows up in bronze, SIGTERM stops it cleanly, `status` reports it."""
    from tests.lake import bronze_hudi_rs

    root = tmp_path / "lake"
    env = {**os.environ, "LAKEHOUSE_ROOT": str(root), "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap}
    lakehouse = [sys.executable, "-m", "pipelines.cli"]
    source = ShopSource(17)
    cfg = WorkloadConfig(seed=17, customers=40, orders=100, changes=300)
    ensure_topics(broker.bootstrap)
    log_path = tmp_path / "ingest.log"
    with log_path.open("w") as log_file:
        proc = subprocess.Popen([*lakehouse, "ingest", "--trigger-seconds", "2"],
                                env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        sent = source.snapshot(cfg) + source.changes(cfg)
        produce(sent, broker.bootstrap)
        expected, _ = fold_with_lsn(sent)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            got = {t: {k: {c: v[c] for c in COLUMNS[t]} for k, v in bronze_hudi_rs(str(root), t).items()}
                   for t in expected}
            if got == expected:
                break
            time.sleep(3)
        assert got == expected, "continuous ingest did not catch up: " + log_path.read_text()[-2000:]
        # SIGTERM inside a batch: the batch finishes (committed whole), then the stream stops, exit 0.
        started = log_path.read_text().count(": started")
        produce(source.changes(WorkloadConfig(seed=18, changes=200)), broker.bootstrap)
        while log_path.read_text().count(": started") == started and proc.poll() is None:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, log_path.read_text()[-2000:]
        text = log_path.read_text()
        assert "ingest stopped" in text and "batch 0: " in text
        last = re.findall(r"batch (\d+): started", text)[-1]
        assert re.search(rf"batch {last}: \d+ records in", text), "the batch in progress did not finish"
        assert not pending_instants(root), "a commit was left in flight"
        status = subprocess.run([*lakehouse, "status"], env=env, capture_output=True, text=True, check=True).stdout
        assert "bronze/customers" in status and "bronze/orders" in status
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_cli_ingest_names_an_unreachable_broker(tmp_path) -> None:
    from pipelines.kafka_local import free_port

    env = {**os.environ, "LAKEHOUSE_ROOT": str(tmp_path / "lake"),
           "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}"}
    done = subprocess.run([sys.executable, "-m", "pipelines.cli", "ingest", "--once"], env=env,
                          capture_output=True, text=True)
    assert done.returncode != 0
    assert "cannot reach Kafka at 127.0.0.1:" in done.stderr
