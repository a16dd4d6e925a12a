"""Generator -> real Kafka -> `ingest --once` -> bronze, checked against the independent model.

Several ingest runs (with more changes, replays after simulated connector restarts,
malformed records and a truncate in between), read back with Spark and with hudi-rs.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from lakehouse_dev.generator import Message, ShopSource, WorkloadConfig, ensure_topics, produce
from pipelines.ingest.bronze import IngestOptions, run_ingest
from pipelines.lake.contract import TABLES
from pipelines.lake.layout import changelog_path, dead_letter_path, main_path
from pipelines.lake.timeline_files import timeline
from pipelines.runtime.lake import Lake
from tests.kill import bronze_as_model, pending_instants, wait_caught_up
from tests.lake import LakeCopy, assert_bronze_equals_model, dead_letters
from tests.model import fold_with_lsn, is_malformed


def _ingest_and_check(spark, bootstrap: str, root: str, source: ShopSource, sent: list[Message], **kw) -> None:
    run_ingest(Lake.at(root, spark), once=True, bootstrap=bootstrap, **kw)
    expected, lsns = fold_with_lsn(sent)
    assert expected == source.state, "the model and the simulated database disagree"
    assert_bronze_equals_model(spark, root, expected, lsns)
    malformed = [m for m in sent if is_malformed(m)]
    letters = dead_letters(root)
    assert len(letters) == len(malformed), "every malformed record is a dead letter, once"
    assert Counter(d["value"] for d in letters) == Counter(m.value for m in malformed)
    assert all(d["reason"] and "@" in d["reason"] for d in letters), "reasons name the Kafka position"


@pytest.mark.integration
def test_bronze_equals_model_across_ingest_runs(spark, broker, tmp_path, monkeypatch, caplog) -> None:
    from pipelines.ingest.writer import BronzeBatchWriter

    # Seed 11 reaches every path seed 3 did (the seed this test ran with before), and the truncate.
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
        if phase == 0:
            # The first run's writer dies holding its dead letters, before the store's first commit names any
            # partition (a SIGKILL after its last batch: it never writes what it holds). Phase 1 reads their
            # records again, and ends with every letter once.
            monkeypatch.setattr(BronzeBatchWriter, "flush", lambda self: None)
            run_ingest(Lake.at(root, spark), once=True, bootstrap=broker.bootstrap)
            monkeypatch.undo()
            expected, lsns = fold_with_lsn(sent)
            assert_bronze_equals_model(spark, root, expected, lsns)
            assert not list(Path(dead_letter_path(root), ".hoodie", "timeline").glob("*_*.commit")), \
                "the letters were held, not written"
            continue
        # Phase 1 splits the backlog into several micro-batches; the others take it in one.
        with caplog.at_level("WARNING", logger="pipelines.ingest.writer"):
            _ingest_and_check(spark, broker.bootstrap, root, source, sent,
                              options=IngestOptions(max_offsets_per_trigger=500 if phase == 1 else None))
        assert ("reading the records since" in caplog.text) == (phase == 1), caplog.text
        caplog.clear()
    # Nothing new on the topics: a further run changes nothing, and commits nothing. Then a batch that touches one
    # of the two tables commits that table alone, once to its main and once to its change log.
    tables = [p for t in TABLES for p in (main_path(t, root), changelog_path(t, root))]
    before = _commits(tables)
    _ingest_and_check(spark, broker.bootstrap, root, source, sent)
    assert _commits(tables) == before, "a run with nothing new made no commit"
    one = source.update("customers", min(source.state["customers"]), {"country": "PT"})
    produce(one, broker.bootstrap)
    sent += one
    _ingest_and_check(spark, broker.bootstrap, root, source, sent)
    after = _commits(tables)
    assert {p: after[p] - before[p] for p in tables} == {
        main_path("customers", root): 1, changelog_path("customers", root): 1,
        main_path("orders", root): 0, changelog_path("orders", root): 0}
    # Main's first commit (the snapshot, into an empty table) is a bulk insert, every later one an upsert.
    for table in TABLES:
        assert _operations(spark, main_path(table, root))[:3] == ["BULK_INSERT", "UPSERT", "UPSERT"], table
    # The insert-only tables get one file per commit for a batch's rows (batch.in_files), not one per
    # Spark partition: the store's small files are what the table services then have to cluster.
    for path in [dead_letter_path(root), *(changelog_path(t, root) for t in TABLES)]:
        commits = list(Path(path, ".hoodie", "timeline").glob("*_*.commit"))
        files = [f for f in Path(path).rglob("*.parquet") if ".hoodie" not in f.parts]
        assert commits and len(files) == len(commits), (path, len(files), len(commits))


def _commits(paths: list[str]) -> dict[str, int]:
    """Completed commits that changed rows, per table (a compaction or a clean is not one)."""
    return {p: sum(i.changes_data for i in timeline(p)) for p in paths}


def _operations(spark, path: str) -> list[str]:
    """The write operation of each completed delta commit of `path`, oldest first."""
    from pipelines.lake.hudi_timeline import meta_client

    timeline = meta_client(spark, path).getActiveTimeline().getDeltaCommitTimeline().filterCompletedInstants()
    instants = timeline.getInstants().iterator()
    found = []
    while instants.hasNext():
        found.append(timeline.readCommitMetadata(instants.next()).getOperationType().name())
    return found


@pytest.mark.integration
def test_lost_checkpoint_resumes_from_the_commits_and_applies_nothing_twice(spark, lake: LakeCopy) -> None:
    """The stream's position lives in bronze's own commits: without its checkpoint it resumes there."""
    import shutil

    from pipelines.lake.contract import TABLES
    from pipelines.lake.layout import changelog_path
    from pipelines.lake.layout import ingest_checkpoint_path as checkpoint_path
    from pipelines.lake.table_stats import read_table

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


@pytest.mark.integration
def test_properties_cut_while_hudi_rewrote_them_are_restored_from_the_backup(spark, lake: LakeCopy) -> None:
    """A SIGKILL while Hudi rewrites hoodie.properties: an empty file beside the whole backup (as
    the cluster test's kill once left it); Hudi alone fails every later write on it."""
    metas = [Path(main_path("customers", lake.root)) / ".hoodie", Path(changelog_path("orders", lake.root)) / ".hoodie"]
    whole = {}
    for meta in metas:
        whole[meta] = (meta / "hoodie.properties").read_bytes()
        (meta / "hoodie.properties.backup").write_bytes(whole[meta])
        (meta / "hoodie.properties").write_bytes(b"")
    lake.produce(lake.source.changes(WorkloadConfig(seed=6, changes=120)))
    _ingest_and_check(spark, lake.bootstrap, lake.root, lake.source, lake.sent)
    for meta in metas:
        assert not (meta / "hoodie.properties.backup").exists()
        assert b"hoodie.table.checksum=" in (meta / "hoodie.properties").read_bytes()


def _crash_after_main_commits(spark, root: str) -> list[str]:
    """Leave the lake as a SIGKILL after main's commit of the stream's last batch and before its change
    log's completed: each change log's commit of that batch back to in flight (its completed instant file
    gone; its files and its metadata-table commit stay, for the next writer to roll back). Returns the
    tables so cut."""
    from pipelines.lake.hudi_timeline import instant_of_batch, latest_meta
    from pipelines.lake.layout import BATCH_ID_META

    batch = max(int(latest_meta(spark, main_path(t, root), BATCH_ID_META) or -1) for t in TABLES)
    cut = []
    for table in TABLES:
        main, changelog = main_path(table, root), changelog_path(table, root)
        if latest_meta(spark, main, BATCH_ID_META) != str(batch):
            continue
        assert latest_meta(spark, changelog, BATCH_ID_META) == str(batch), "what main gets, the change log gets"
        instant = instant_of_batch(spark, changelog, BATCH_ID_META, batch)
        timeline = Path(changelog, ".hoodie", "timeline")
        done = sorted(timeline.glob("*_*.commit"))
        assert done and done[-1].name.startswith(f"{instant}_"), f"{changelog}: its newest commit is not the batch's"
        done[-1].unlink()
        cut.append(table)
    assert cut, f"the stream's last batch ({batch}) committed to no main table"
    return cut


@pytest.mark.integration
def test_a_crash_between_main_and_its_change_log_is_logged_again(spark, lake: LakeCopy) -> None:
    """Main and the change log commit side by side, so a crash can leave a batch in main and not in the
    change log, where silver reads it from. The next stream starts from the change log's position (the
    older of the two), and logs that batch again from main's rows."""
    from pipelines.ingest.state import positions_of
    from pipelines.transform.etl import run_etl
    from tests.lake import assert_lake_equals_model

    def behind(table: str) -> bool:
        logged = positions_of(spark, changelog_path(table, lake.root))
        return any(logged.get(tp, 0) < o for tp, o in positions_of(spark, main_path(table, lake.root)).items())

    lake.produce(lake.source.changes(WorkloadConfig(seed=21, changes=200, replay_runs=1)))
    run_ingest(Lake.at(lake.root, spark), once=True, bootstrap=lake.bootstrap)
    cut = _crash_after_main_commits(spark, lake.root)
    assert all(behind(t) for t in cut)
    _ingest_and_check(spark, lake.bootstrap, lake.root, lake.source, lake.sent)
    assert not any(behind(t) for t in TABLES)
    run_etl(Lake.at(lake.root, spark))
    assert_lake_equals_model(spark, lake.root, lake.source.state)


# The supervisor's limits for a test-sized stream: heartbeats every second, a stop request
# that waits for a batch of a few seconds.
STREAM_LIMITS = """
[stream.health]
heartbeat_seconds = 1
dead_after_seconds = 20
[stream.supervisor]
start_timeout_seconds = 180
stop_timeout_seconds = 120
kill_timeout_seconds = 30
"""


@pytest.mark.integration
def test_supervised_stream_restarts_upgrades_and_stops_exactly_once(spark, broker, tmp_path) -> None:
    """The bronze stream as the `bronze_ingest_stream` DAG runs it on the local target (`lakehouse
    stream ACTION`): two `ensure` start one stream; a second writer is refused; `upgrade` (a
    stop request mid-batch) lets the batch commit and starts again from the same checkpoint;
    SIGTERM mid-batch does the same; bronze ends equal to the model, dead letters exactly once,
    nothing in flight."""

    root = tmp_path / "lake"
    overrides = tmp_path / "stream.toml"
    overrides.write_text(STREAM_LIMITS)
    env = {**os.environ, "LAKEHOUSE_ROOT": str(root), "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
           "LAKEHOUSE_RUN_DIR": str(tmp_path / "run"),
           "LAKEHOUSE_HUDI_OVERRIDES": os.pathsep.join([os.environ["LAKEHOUSE_HUDI_OVERRIDES"], str(overrides)])}
    lakehouse = [sys.executable, "-m", "pipelines.cli"]
    log_path = tmp_path / "run" / "bronze-stream" / "stream.log"

    def stream(action: str, expect: str) -> str:
        starts = ["--trigger-seconds", "2"] if action in ("ensure", "start", "restart", "upgrade") else []
        done = subprocess.run([*lakehouse, "stream", action, *starts], env=env,
                              capture_output=True, text=True, timeout=600)
        # `stream status` exits 0 only when the stream is healthy; every other action when it did its job.
        code = 1 if action == "status" and not done.stdout.startswith("healthy") else 0
        assert done.returncode == code and expect in done.stdout, f"stream {action}: {done.stdout}{done.stderr}"
        return done.stdout

    def pid() -> int:
        return json.loads((tmp_path / "run" / "bronze-stream" / "stream.pid").read_text())["pid"]

    def caught_up(sent: list[Message]) -> None:
        wait_caught_up(str(root), fold_with_lsn(sent)[0], log_path)

    def mid_batch(more: list[Message]) -> None:
        """Produce `more` and return once the stream has started a batch after it."""
        started = log_path.read_text().count(": started")
        produce(more, broker.bootstrap)
        sent.extend(more)
        deadline = time.monotonic() + 120
        while log_path.read_text().count(": started") == started:
            assert time.monotonic() < deadline, "no batch started: " + log_path.read_text()[-2000:]
            time.sleep(0.05)

    def last_batch_finished() -> None:
        text = log_path.read_text()
        last = re.findall(r"batch (\d+): started", text)[-1]
        assert re.search(rf"batch {last}: \d+ records in", text), "the batch in progress did not finish"
        assert not pending_instants(root), "a commit was left in flight"

    source = ShopSource(17)
    ensure_topics(broker.bootstrap)
    sent = source.snapshot(WorkloadConfig(seed=17, customers=40, orders=100)) + \
        source.changes(WorkloadConfig(seed=17, changes=300))
    produce(sent, broker.bootstrap)
    try:
        stream("ensure", "started")
        first = pid()
        stream("ensure", "running")
        assert pid() == first, "a second ensure started another stream"
        second = subprocess.run([*lakehouse, "ingest", "--once"], env=env, capture_output=True, text=True,
                                timeout=300)
        assert second.returncode == 1 and "another ingest stream" in second.stderr, second.stderr[-2000:]
        # `stream wait` returns once bronze holds every record sent: no polling after it.
        stream("wait", "caught up")
        assert bronze_as_model(str(root)) == fold_with_lsn(sent)[0], "`stream wait` returned before bronze held it"

        # A SIGKILLed stream restarted by `ensure`: the DAG's test (tests/dags/test_stream_dag.py),
        # and tests/test_cluster.py under a bronze commit, on a cluster.
        mid_batch(source.changes(WorkloadConfig(seed=19, changes=200)))
        before = pid()
        stream("upgrade", "stream stopped after its batch")
        assert pid() != before
        assert "stop requested" in log_path.read_text()
        last_batch_finished()
        caught_up(sent)

        # SIGTERM, as `kill` or a scheduler sends it: the batch in progress commits, exit clean.
        mid_batch(source.changes(WorkloadConfig(seed=20, changes=200)))
        os.kill(pid(), signal.SIGTERM)
        deadline = time.monotonic() + 120
        while "stopped:" not in stream("status", ":"):
            assert time.monotonic() < deadline, log_path.read_text()[-2000:]
            time.sleep(0.5)
        assert "ingest stopped" in log_path.read_text()
        last_batch_finished()
        stream("stop", "no stream running")

        stream("start", "stream started")
        caught_up(sent)
        stream("stop", "stream stopped after its batch")
        stream("ensure", "held")  # a stopped stream stays stopped until an operator starts it
        stream("status", "stopped")
    finally:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            os.killpg(pid(), signal.SIGKILL)
    expected, lsns = fold_with_lsn(sent)
    assert_bronze_equals_model(spark, str(root), expected, lsns)
    letters = dead_letters(str(root))
    assert Counter(d["value"] for d in letters) == Counter(m.value for m in sent if is_malformed(m)), \
        "every malformed record is a dead letter, exactly once"
    status = subprocess.run([*lakehouse, "status"], env=env, capture_output=True, text=True, check=True).stdout
    assert "bronze/customers" in status and "bronze/orders" in status


@pytest.mark.unit
def test_cli_ingest_names_an_unreachable_broker(tmp_path) -> None:
    from lakehouse_dev.kafka_local import free_port

    env = {**os.environ, "LAKEHOUSE_ROOT": str(tmp_path / "lake"),
           "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{free_port()}"}
    done = subprocess.run([sys.executable, "-m", "pipelines.cli", "ingest", "--once"], env=env,
                          capture_output=True, text=True)
    assert done.returncode != 0
    assert "Kafka at 127.0.0.1:" in done.stderr and "connection refused" in done.stderr


@pytest.mark.integration
def test_held_dead_letters_lost_with_their_writer_are_read_again_from_kafka(spark, lake: LakeCopy, monkeypatch,
                                                                            caplog) -> None:
    """A batch's dead letters wait in the writer for a later commit (held_letters). A writer killed while
    it holds some, after its batches committed, leaves the store behind the stream: the next writer reads
    the records since the store's position again, and the store ends with every dead letter once."""
    from pipelines.ingest.state import positions_of
    from pipelines.ingest.writer import BronzeBatchWriter
    from pipelines.lake.hudi_timeline import latest_extra
    from pipelines.lake.layout import DEAD_LETTERS_META, POSITIONS_META

    def store_commits() -> int:
        return len(list(Path(dead_letter_path(lake.root), ".hoodie", "timeline").glob("*_*.commit")))

    lake.produce(lake.source.changes(WorkloadConfig(seed=31, changes=600, malformed_fraction=0.05)))
    before = store_commits()
    # A SIGKILL after the last batch: its writer never writes what it holds.
    monkeypatch.setattr(BronzeBatchWriter, "flush", lambda self: None)
    run_ingest(Lake.at(lake.root, spark), once=True, bootstrap=lake.bootstrap,
               options=IngestOptions(max_offsets_per_trigger=400))
    assert store_commits() == before, "the batches held their dead letters back"
    expected, lsns = fold_with_lsn(lake.sent)
    assert_bronze_equals_model(spark, lake.root, expected, lsns)
    meta = latest_extra(spark, main_path("orders", lake.root), POSITIONS_META)
    assert json.loads(meta[DEAD_LETTERS_META]) != json.loads(meta[POSITIONS_META]), "main says the store is behind"
    assert json.loads(meta[DEAD_LETTERS_META]) == positions_of(spark, dead_letter_path(lake.root))

    monkeypatch.undo()
    with caplog.at_level("WARNING", logger="pipelines.ingest.writer"):
        _ingest_and_check(spark, lake.bootstrap, lake.root, lake.source, lake.sent)
    assert "reading the records since" in caplog.text
    assert store_commits() == before + 1, "the held letters went to the store in one commit"
    # Caught up: a further run reads nothing again and changes nothing.
    caplog.clear()
    with caplog.at_level("WARNING", logger="pipelines.ingest.writer"):
        _ingest_and_check(spark, lake.bootstrap, lake.root, lake.source, lake.sent)
    assert "reading the records since" not in caplog.text
