"""The pipeline on the real source: PostgreSQL 15 -> Debezium 2.7.3 in Kafka Connect -> Kafka -> bronze ->
silver -> gold, checked against the database's own state read with SQL.

The generator's workload is played as SQL transactions (dev/lakehouse_dev/sql_sink.py) in three phases:
1. snapshot rows exist before Connect starts (Debezium reads them, op=r), then changes; Connect
   stopped with SIGTERM, which commits its offsets;
2. Connect again, `ALTER TABLE customers ADD COLUMN` and rows that set it, changes, a TRUNCATE of
   orders, changes; then Connect is SIGKILLed: it never flushed offsets in this phase (its flush
   interval, an hour, is longer than the phase), so the next start re-delivers all of phase 2 after
   phase 1;
3. Connect again (the replays; its offsets now flushed every 15 s), more changes; then PostgreSQL
   restarted while Debezium streams (below), more changes; then the network between
   Debezium and PostgreSQL slow, then cut for 5 s while changes are committed (Debezium reaches
   PostgreSQL through Toxiproxy throughout), more changes; then one `ingest --once` and one `etl`.

The PostgreSQL restart: changes are committed and PostgreSQL crashes (the postmaster and its backends
SIGKILLed, as the OOM killer leaves it: no shutdown checkpoint, crash recovery from
the WAL on the next start, the replication slot back at the position its last checkpoint saved)
before Debezium has necessarily read them all. The soak stops it with a fast shutdown instead, as a
restart for an upgrade or a failover does (`lakehouse dev bench soak`). Debezium's
task restarts itself 10 s after the lost connection; the database is still away then, and the task
fails for good (FAILED, "Couldn't obtain encoding for database": Kafka Connect never restarts it).
PostgreSQL comes back, and `lakehouse connector ensure` (the `debezium_connector` DAG's watchdog)
restarts the failed task, which streams on from its offsets (the replication slot active again, the
connector RUNNING); anything it delivers twice (replays) the lake must not mind. An outage shorter
than those 10 s Debezium rides through by itself (the soak's shorter faults). The
restart comes right after an offset flush, with changes committed since: Debezium 2.7 delivers none
of them twice (it resumes where its task was, WalPositionLocator skipping what it had sent; the count
is printed, not asserted). A restart before Connect's *first* flush is another matter: the
restarted task finds no offsets, takes a new snapshot (snapshot.mode=initial), and streams from the
end of that snapshot. Rows deleted between the two snapshots then never get their delete: the
topics, and so the lake, keep them live for ever (a source-side loss the lake cannot see: a snapshot
names the rows that exist, never those that went). Hence `wait_for_offsets` before the restart; in
production, Connect's first offset flush after a connector's first snapshot must come before
PostgreSQL may restart (docs/operations.md, "Debezium's task FAILED").

Schema changes (contract section 6) run as DDL in the middle of that workload while
`lakehouse ingest` streams (started after phase 1, SIGKILLed during a batch after the DDL of
phase 2; the `ingest --once` of phase 3 resumes): `ADD COLUMN` and updates setting it, `ALTER
COLUMN amount TYPE numeric(14,2)` and an amount that only the new type holds, a text column of
several KB (TOASTed) followed by updates that leave it unchanged (Debezium's placeholder), and a
`DROP COLUMN` of an added column. Bronze must equal PostgreSQL's own state column by column
(the dropped column: the delivered records' newest value), read with Spark and hudi-rs; the
records on the topics, folded by LSN, must give that state too.

The e2e runs the `schemas.enable=true` converter: its records change shape mid-stream (a new
`schema` with the added column) and carry the most; the bare envelope is covered by the captured
fixtures (tests/test_debezium_fixtures.py).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import string
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition
from pyspark.sql import SparkSession

from lakehouse_dev import sql_sink
from lakehouse_dev.connect_worker import slot_status
from lakehouse_dev.generator import Message, ShopSource, WorkloadConfig
from lakehouse_dev.kafka_local import KafkaBroker, free_port
from lakehouse_dev.pg_source import RealSource
from lakehouse_dev.source_state import database_state
from lakehouse_dev.toxiproxy import Toxiproxy
from pipelines.ingest.bronze import run_ingest
from pipelines.lake.contract import COLUMNS, TABLES, topic
from pipelines.lake.table_stats import read_table
from pipelines.runtime.lake import Lake
from pipelines.runtime.local_process import HOST
from pipelines.transform.etl import run_etl
from tests.lake import assert_bronze_equals_model, assert_lake_equals_model, dead_letters, run_cli
from tests.model import UNAVAILABLE, fold_with_lsn, unwrap

pytestmark = [pytest.mark.slow, pytest.mark.integration]

# Small: the cost is the JVMs (three Connect starts, Spark's commits), not the rows. Replays come
# from Connect itself and the database makes no malformed records.
WORKLOAD = WorkloadConfig(seed=18, customers=40, orders=120, changes=120, invalid_fraction=0.1,
                          delete_fraction=0.1, replay_runs=0, malformed_fraction=0.0, other_ops=False)
# Connect's offset flush interval from phase 3 on.
FLUSH_MS = 15_000
# The shape changes, and what a TOASTed value looks like: random letters do not compress.
BIG_TEXT = 6000
# Debezium cut off from PostgreSQL (Toxiproxy disabled): shorter than the 10 s after which its task tries again.
NET_BLACKOUT = 5.0
# Every byte from PostgreSQL to Debezium this late while a round of changes streams.
NET_LATENCY_MS = 200


def _big(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_letters) for _ in range(BIG_TEXT))


def _start_ingest(root: str, bootstrap: str, log_path: Path) -> subprocess.Popen:
    env = os.environ | {"LAKEHOUSE_ROOT": root, "KAFKA_BOOTSTRAP_SERVERS": bootstrap}
    with log_path.open("w") as log_file:
        return subprocess.Popen([sys.executable, "-m", "pipelines.cli", "ingest", "--trigger-seconds", "2"],
                                env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)


def _kill_during_next_batch(job: subprocess.Popen, log_path: Path, timeout: float = 300) -> None:
    """SIGKILL the streaming ingest a moment after it starts a batch it had not started yet."""
    started = len(re.findall(r"batch \d+: started", log_path.read_text(errors="replace")))
    deadline = time.monotonic() + timeout
    while len(re.findall(r"batch \d+: started", log_path.read_text(errors="replace"))) <= started:
        assert job.poll() is None, "ingest stopped: " + log_path.read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, "no new batch: " + log_path.read_text(errors="replace")[-3000:]
        time.sleep(0.2)
    time.sleep(3)  # inside the batch: parsing, schema decision or its commits
    os.killpg(job.pid, signal.SIGKILL)
    job.wait()


def topic_records(bootstrap: str) -> list[tuple[Message, int, int]]:
    """Every record on the source topics: (message, partition, offset)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=3000)
    try:
        parts = [TopicPartition(topic(t), p) for t in TABLES for p in consumer.partitions_for_topic(topic(t)) or ()]
        consumer.assign(parts)
        consumer.seek_to_beginning()
        return [(Message(r.topic, r.key, r.value), r.partition, r.offset) for r in consumer]
    finally:
        consumer.close()


def play(sim_messages: list[Message], dsn: str, bootstrap: str) -> None:
    """The generator's changes as SQL, then wait until Debezium delivered the last one."""
    since = sql_sink.end_offsets(bootstrap, [topic(t) for t in TABLES])
    run = sql_sink.apply(sim_messages, dsn)
    assert run.last_table is not None and run.last_lsn is not None
    sql_sink.wait_published(bootstrap, run.last_table, run.last_lsn, since)


def wait_for_offsets(real: RealSource, after: float, timeout: float = 60.0) -> float:
    """Wait until Connect flushes its offsets (offsets.dat rewritten) after `after` (epoch); the flush's time."""
    offsets = real.connect.work_dir / "offsets.dat"
    deadline = time.monotonic() + timeout
    while not (offsets.exists() and offsets.stat().st_size and offsets.stat().st_mtime > after):
        assert time.monotonic() < deadline, f"Connect flushed no offsets in {timeout:.0f} s"
        time.sleep(0.1)
    # One flush can write the file more than once (milliseconds apart under load): its time is the last write's.
    flushed = offsets.stat().st_mtime
    while True:
        time.sleep(1.0)
        if (again := offsets.stat().st_mtime) == flushed:
            return flushed
        flushed = again


def _wait_failed(real: RealSource, timeout: float = 90.0) -> float:
    """Wait until Connect reports Debezium's task FAILED (PostgreSQL away); the seconds it took."""
    started = time.monotonic()
    while (waited := time.monotonic() - started) < timeout:
        if any(t.get("state") == "FAILED" for t in (real.connect.status() or {}).get("tasks", [])):
            return waited
        time.sleep(0.5)
    raise AssertionError(f"Debezium's task did not fail with PostgreSQL away for {timeout:.0f} s (if it now "
                         f"rides through, the watchdog of pipelines.deploy.connector may go): {real.connect.status()}")


def _differences(on_topics: dict, state: dict, lsns: dict) -> str:
    """Per table, the keys whose newest delivered row differs from the database's (at most 10), with its LSN."""
    lines = []
    for table in state:
        keys = sorted(set(on_topics.get(table, {})) ^ set(state[table]) |
                      {k for k in state[table] if on_topics.get(table, {}).get(k, state[table][k]) != state[table][k]})
        lines += [f"{table} {k}: topics {on_topics.get(table, {}).get(k)} at lsn {lsns.get(table, {}).get(k)}, "
                  f"database {state[table].get(k)}" for k in keys[:10]]
        lines.append(f"{table}: {len(keys)} key(s) differ")
    return "\n".join(lines)


def test_real_source_end_to_end(spark: SparkSession, broker: KafkaBroker, tmp_path: Path) -> None:
    home = Path(tempfile.mkdtemp(prefix="lakehouse-pg-"))  # PostgreSQL runs as `postgres`: not under pytest's 0700 tmp
    home.chmod(0o755)
    # Debezium reaches PostgreSQL through Toxiproxy: the network between them fails in phase 3.
    toxiproxy = Toxiproxy(tmp_path / "toxiproxy").start()
    pg_port, via = free_port(), free_port()
    pg_link = toxiproxy.client.create("postgres", f"{HOST}:{via}", f"{HOST}:{pg_port}")
    real = RealSource(home, pg_port, free_port(), broker.bootstrap, schemas_enable=True,
                      offset_flush_ms=3_600_000, debezium_port=via)
    root = str(tmp_path / "lake")
    sim = ShopSource(WORKLOAD.seed)
    ingest: subprocess.Popen | None = None
    try:
        postgres = real.postgres.start()
        dsn = postgres.dsn
        # Phase 1: rows before Connect starts (its snapshot), then changes.
        assert sql_sink.apply(sim.snapshot(WORKLOAD), dsn).stats["c"] == WORKLOAD.customers + WORKLOAD.orders
        real.up()
        play(sim.changes(WORKLOAD), dsn, broker.bootstrap)
        real.connect.stop()

        # Phase 2, with ingest streaming: new columns mid-stream, a TOASTed text, a widened numeric,
        # changes, a truncate; SIGKILL of ingest during a batch; SIGKILL of Connect before any offset flush.
        ingest = _start_ingest(root, broker.bootstrap, tmp_path / "ingest.log")
        real.up()
        rng = random.Random(23)
        with postgres.connect() as conn:
            conn.execute("ALTER TABLE customers ADD COLUMN loyalty_tier text")
            conn.execute("UPDATE customers SET loyalty_tier = 'gold' WHERE id % 3 = 0")
            conn.execute("ALTER TABLE customers ADD COLUMN notes text")
            for (row_id,) in conn.execute("SELECT id FROM customers WHERE id % 4 = 0").fetchall():
                conn.execute("UPDATE customers SET notes = %s WHERE id = %s", (_big(rng), row_id))
            conn.execute("ALTER TABLE orders ALTER COLUMN amount TYPE numeric(14,2)")
        # The generator's updates set the contract's columns only: `notes` stays, sent as the placeholder.
        play(sim.changes(WORKLOAD), dsn, broker.bootstrap)
        killer = threading.Thread(target=_kill_during_next_batch, args=(ingest, tmp_path / "ingest.log"))
        killer.start()  # while the rest of phase 2 is played and ingested
        play(sim.truncate("orders", WORKLOAD) + sim.changes(WORKLOAD), dsn, broker.bootstrap)
        killer.join()
        assert ingest.returncode == -signal.SIGKILL, "ingest was not killed during a batch"
        real.connect.kill()

        # Phase 3: Connect re-delivers phase 2 (now flushing its offsets every 15 s), an added column
        # dropped, more changes.
        real.offset_flush_ms = FLUSH_MS
        real.up()
        with postgres.connect() as conn:
            conn.execute("ALTER TABLE customers DROP COLUMN loyalty_tier")
        play(sim.changes(WORKLOAD), dsn, broker.bootstrap)

        # PostgreSQL crashes while Debezium streams. Right after a flush of Connect's offsets (the
        # next is 15 s away), changes are committed and PostgreSQL is SIGKILLed: Debezium may not
        # have read them all, and what it has is replayed. The wait is for that flush: a restart before
        # Connect's *first* flush finds no offsets, and the restarted task takes a new snapshot, which
        # loses the deletes of rows deleted in between (module docstring). Here Connect has offsets since
        # phase 1's SIGTERM, yet the restart comes right after a flush as it would in production.
        flushed = wait_for_offsets(real, time.time())
        fault_since = sql_sink.end_offsets(broker.bootstrap, [topic(t) for t in TABLES])
        sql_sink.apply(sim.changes(WORKLOAD), dsn)
        before = slot_status(real.pg_port)
        postgres.wait_wal_written()  # committed is durable, as with production's synchronous_commit=on
        postgres.kill()
        down_at = time.monotonic()
        assert real.connect.work_dir.joinpath("offsets.dat").stat().st_mtime == flushed, "a flush came before the stop"
        failed = _wait_failed(real)
        log_at = postgres.log_size()
        postgres.start()
        assert "not properly shut down; automatic recovery in progress" in postgres.log_since(log_at), \
            postgres.log_since(log_at)[-2000:]
        back = time.monotonic()
        said = run_cli("connector", "status", "--connect-url", real.connect.url)
        assert said.exit_code == 1 and "task 0 FAILED" in said.output, said.output
        done = run_cli("connector", "ensure", "--connect-url", real.connect.url, "--wait", "120")
        assert done.exit_code == 0, done.output
        assert "task 0 FAILED" in done.output and "restarted: connector shop-source: RUNNING, task 0 RUNNING" \
            in done.output, done.output
        # More changes once it is back: `play` waits until Debezium has delivered the last of them.
        play(sim.changes(WORKLOAD), dsn, broker.bootstrap)
        delivered = time.monotonic() - back
        after = slot_status(real.pg_port)
        assert after is not None and after["active"], f"the connector does not stream from its slot: {after}"
        assert real.connect.status()["connector"]["state"] == "RUNNING", real.connect.status()

        # The network between Debezium and PostgreSQL fails while both run. First slow: a round of changes
        # streams with every byte late. Then cut: every connection through the proxy closed and new ones
        # refused while changes are committed. Shorter than the 10 s after which Debezium's task tries again,
        # it rides that through by itself (a longer cut fails the task as PostgreSQL's crash did above,
        # and `connector ensure` restarts it): a new replication connection streams on from the slot.
        with pg_link.latency(NET_LATENCY_MS):
            play(sim.changes(WORKLOAD), dsn, broker.bootstrap)
        walsender = slot_status(real.pg_port)["active_pid"]
        with pg_link.blackout():
            sql_sink.apply(sim.changes(WORKLOAD), dsn)
            time.sleep(NET_BLACKOUT)
        cut_over = time.monotonic()
        play(sim.changes(WORKLOAD), dsn, broker.bootstrap)
        rode_through = time.monotonic() - cut_over
        assert slot_status(real.pg_port)["active_pid"] not in (None, walsender), \
            "the cut did not reach Debezium's replication connection"
        tasks = real.connect.status()["tasks"]
        assert [t["state"] for t in tasks] == ["RUNNING"], tasks

        # An amount only the widened type holds (last: the generator's updates set amount as it knows it).
        since = sql_sink.end_offsets(broker.bootstrap, [topic("orders")])
        with postgres.connect() as conn:
            lsn = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint").fetchone()[0]
            conn.execute("UPDATE orders SET amount = 123456789012.34 WHERE id = (SELECT max(id) FROM orders)")
        sql_sink.wait_published(broker.bootstrap, "orders", int(lsn), since)
        run_ingest(Lake.at(root, spark), once=True, bootstrap=broker.bootstrap)
        run_etl(Lake.at(root, spark))

        state = database_state(postgres)
        notes = database_state(postgres, {"customers": ("notes",)})["customers"]
    finally:
        if ingest is not None and ingest.poll() is None:
            os.killpg(ingest.pid, signal.SIGKILL)
            ingest.wait()
        real.down()
        toxiproxy.stop()
        for log in (real.connect.log_path, real.postgres.log_path):  # kept for a failure's reader
            if log.exists():
                shutil.copy(log, tmp_path / log.name)
        shutil.rmtree(home, ignore_errors=True)

    records = topic_records(broker.bootstrap)
    envelopes = [(m, p, o, unwrap(m)[1]) for m, p, o in records]
    # What the test claims to have exercised happened on the topics.
    seen = Counter((m.topic, m.key, env["source"]["lsn"]) for m, _, _, env in envelopes if env)
    # Records delivered twice since the PostgreSQL restart's changes (the SIGKILL's replays of phase 2
    # all came before): printed, not asserted (replays are harmless to the lake).
    since_fault = {(m.topic, m.key, env["source"]["lsn"]) for m, p, o, env in envelopes
                   if env and o >= fault_since.get(TopicPartition(m.topic, p), 0)}
    replays = sum(seen[k] - 1 for k in since_fault)
    print(f"\nPostgreSQL down {back - down_at:.1f} s (Debezium's task FAILED after {failed:.1f} s); "
          f"the next changes delivered {delivered:.1f} s after it was "
          f"back; {replays} record(s) delivered twice since; slot before the stop {before}, at the end {after}; "
          f"Debezium cut off from PostgreSQL for {NET_BLACKOUT:.0f} s: the next changes delivered "
          f"{rode_through:.1f} s after")
    assert max(seen.values()) > 1, "the SIGKILL of Connect re-delivered nothing"
    assert any(env and env["op"] == "t" for *_, env in envelopes), "no truncate event"
    assert any(env and env["op"] == "r" for *_, env in envelopes), "no snapshot read"
    assert any(m.value is None for m, *_ in envelopes), "no tombstone"
    assert any(env and "loyalty_tier" in (env["after"] or {}) for *_, env in envelopes), "no record of the new shape"
    assert len({json.dumps(unwrap(m)[0]) for m, *_ in envelopes if m.topic == topic("customers") and m.value}) > 1

    # The model folds the records as delivered (ordered by LSN across partitions): it must reach
    # the database's state, and bronze must hold it at the LSN of each key's newest event.
    ordered = sorted((m for m, *_, env in envelopes if env), key=lambda m: unwrap(m)[1]["source"]["lsn"])
    folded, lsns = fold_with_lsn(ordered)
    on_topics = {t: {k: {c: r[c] for c in COLUMNS[t]} for k, r in rows.items()} for t, rows in folded.items()}
    assert on_topics == state, "the topics do not hold the database's changes:\n" + _differences(on_topics, state, lsns)
    assert state["orders"] and state["customers"]
    assert_bronze_equals_model(spark, root, state, lsns)
    assert dead_letters(root) == []
    assert_lake_equals_model(spark, root, state)

    # The shape changes: the placeholder was delivered, the TOASTed values and the added columns are
    # in bronze as PostgreSQL holds them (the dropped column: its newest delivered value).
    assert any(env and UNAVAILABLE in (env["after"] or {}).values() for *_, env in envelopes), "no placeholder"
    assert any(len(r["notes"] or "") == BIG_TEXT for r in notes.values())
    assert any(r["amount"] == "123456789012.34" for r in state["orders"].values()), "the widened amount"
    want = {k: {"notes": notes[k]["notes"], "loyalty_tier": folded["customers"][k].get("loyalty_tier")}
            for k in notes}
    added = read_table(f"{root}/bronze/customers", ["id", "notes", "loyalty_tier"]).to_pylist()
    assert {r["id"]: {"notes": r["notes"], "loyalty_tier": r["loyalty_tier"]} for r in added} == want, \
        "hudi-rs: bronze/customers' added columns differ from PostgreSQL"
    got = {r["id"]: {"notes": r["notes"], "loyalty_tier": r["loyalty_tier"]} for r in
           spark.read.format("hudi").load(f"{root}/bronze/customers").select("id", "notes", "loyalty_tier").collect()}
    assert got == want, "Spark: bronze/customers' added columns differ from PostgreSQL"
    assert any(v["loyalty_tier"] for v in want.values()) and any(v["loyalty_tier"] is None for v in want.values())
