"""The pipeline on the real source: PostgreSQL 15 -> Debezium 2.7.3 in Kafka Connect -> Kafka -> bronze ->
silver -> gold, checked against the database's own state read with SQL.

The generator's workload is played as SQL transactions (pipelines/sql_sink.py) in three phases:
1. snapshot rows exist before Connect starts (Debezium reads them, op=r), then changes; Connect
   stopped with SIGTERM, which commits its offsets;
2. Connect again, `ALTER TABLE customers ADD COLUMN` and rows that set it, changes, a TRUNCATE of
   orders, changes; then Connect is SIGKILLed: it never flushed offsets in this phase (the flush
   interval is longer than the test), so the next start re-delivers all of phase 2 after phase 1;
3. Connect again (the replays), more changes; then one `ingest --once` and one `etl` (a first
   ingest after phase 1 cost a table creation's commits and showed nothing the generator's
   tests do not: the replays of phase 2 all come after it).

The e2e runs the `schemas.enable=true` converter: its records change shape mid-stream (a new
`schema` with the added column) and carry the most; the bare envelope is covered by the captured
fixtures (tests/test_debezium_fixtures.py).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, TopicPartition
from pyspark.sql import SparkSession

from pipelines import sql_sink
from pipelines.bronze import run_ingest
from pipelines.contract import COLUMNS, TABLES, topic
from pipelines.etl import run_etl
from pipelines.generator import Message, ShopSource, WorkloadConfig
from pipelines.kafka_local import KafkaBroker, free_port
from pipelines.pg_source import PostgresCluster, RealSource
from tests.lake import assert_bronze_equals_model, assert_lake_equals_model, dead_letters
from tests.model import fold_with_lsn, unwrap

pytestmark = pytest.mark.slow

# Small: the cost is the JVMs (three Connect starts, Spark's commits), not the rows. Replays come
# from Connect itself and the database makes no malformed records.
WORKLOAD = WorkloadConfig(seed=18, customers=40, orders=120, changes=120, invalid_fraction=0.1,
                          delete_fraction=0.1, replay_runs=0, malformed_fraction=0.0, other_ops=False)
# Debezium's rendering of timestamptz (ZonedTimestamp: UTC, always six decimals) and numeric
# (decimal.handling.mode=string: the column's scale), computed by PostgreSQL from its own values.
_RENDER = {
    "created_at": """to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')""",
    "updated_at": """to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')""",
    "amount": "amount::text",
}


def database_state(postgres: PostgresCluster) -> dict[str, dict[int, dict[str, Any]]]:
    """The contract's columns of every row in `shop`, as the envelope carries them: the oracle."""
    state = {}
    with postgres.connect() as conn:
        for table in TABLES:
            select = ", ".join(_RENDER.get(c, c) for c in COLUMNS[table])
            rows = conn.execute(f"SELECT {select} FROM {table}").fetchall()
            state[table] = {row[0]: dict(zip(COLUMNS[table], row, strict=True)) for row in rows}
    return state


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


def test_real_source_end_to_end(spark: SparkSession, broker: KafkaBroker, tmp_path: Path) -> None:
    home = Path(tempfile.mkdtemp(prefix="lakehouse-pg-"))  # PostgreSQL runs as `postgres`: not under pytest's 0700 tmp
    home.chmod(0o755)
    real = RealSource(home, free_port(), free_port(), broker.bootstrap, schemas_enable=True,
                      offset_flush_ms=3_600_000)
    root = str(tmp_path / "lake")
    sim = ShopSource(WORKLOAD.seed)
    try:
        postgres = real.postgres.start()
        dsn = postgres.dsn
        # Phase 1: rows before Connect starts (its snapshot), then changes.
        assert sql_sink.apply(sim.snapshot(WORKLOAD), dsn).stats["c"] == WORKLOAD.customers + WORKLOAD.orders
        real.up()
        play(sim.changes(WORKLOAD), dsn, broker.bootstrap)
        real.connect.stop()

        # Phase 2: a new column mid-stream, changes, a truncate; then SIGKILL before any offset flush.
        real.up()
        with postgres.connect() as conn:
            conn.execute("ALTER TABLE customers ADD COLUMN loyalty_tier text")
            conn.execute("UPDATE customers SET loyalty_tier = 'gold' WHERE id % 3 = 0")
        phase2 = sim.changes(WORKLOAD) + sim.truncate("orders", WORKLOAD) + sim.changes(WORKLOAD)
        play(phase2, dsn, broker.bootstrap)
        real.connect.kill()

        # Phase 3: Connect re-delivers phase 2, then more changes.
        real.up()
        play(sim.changes(WORKLOAD), dsn, broker.bootstrap)
        run_ingest(once=True, root=root, bootstrap=broker.bootstrap, spark=spark)
        run_etl(spark, root)

        state = database_state(postgres)
    finally:
        real.down()
        shutil.rmtree(home, ignore_errors=True)

    records = topic_records(broker.bootstrap)
    envelopes = [(m, p, o, unwrap(m)[1]) for m, p, o in records]
    # What the test claims to have exercised happened on the topics.
    seen = Counter((m.topic, m.key, env["source"]["lsn"]) for m, _, _, env in envelopes if env)
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
    assert {t: {k: {c: r[c] for c in COLUMNS[t]} for k, r in rows.items()} for t, rows in folded.items()} == state
    assert state["orders"] and state["customers"]
    assert_bronze_equals_model(spark, root, state, lsns)
    assert dead_letters(root) == []
    assert_lake_equals_model(spark, root, state)
