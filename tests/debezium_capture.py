"""Capture what the real Debezium connector emits, as the parser's fixtures (tests/fixtures/debezium/).

Run by hand when the pinned connector changes (`make source-up` not needed: it starts its own
broker, PostgreSQL and Connect on free ports, once per converter setting):

    .venv/bin/python -m tests.debezium_capture

The scripted session covers what the contract names: snapshot reads, inserts, updates, a delete
(and Debezium's tombstone after it) under REPLICA IDENTITY DEFAULT, `ALTER TABLE ... ADD COLUMN`
mid-stream and rows that set it, and a TRUNCATE.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from kafka import KafkaConsumer, TopicPartition

from lakehouse_dev import sql_sink
from lakehouse_dev.kafka_local import KafkaBroker, free_port
from lakehouse_dev.pg_source import RealSource
from pipelines.lake.contract import TABLES, topic

FIXTURES = Path(__file__).with_name("fixtures") / "debezium"
FORMATS = {"schemas_true": True, "schemas_false": False}

SNAPSHOT_SQL = """
INSERT INTO customers VALUES
  (1, 'anna.schmidt1@example.com', 'Anna Schmidt', 'DE', '2026-02-11T08:00:01.5Z', '2026-02-20T09:30:00Z'),
  (2, ' Ben.Muller2@Shop.Test', 'Ben Müller', 'f', '2026-02-12T10:00:00Z', '2026-02-12T10:00:00.000001Z');
INSERT INTO orders VALUES
  (1, 1, 'placed', '19.90', 'EUR', '2026-02-21T12:00:00Z', '2026-02-21T12:00:00Z'),
  (2, 10000042, 'paid', '5', 'USD', '2026-02-22T23:59:59.999999Z', '2026-02-23T00:00:00Z');
"""
# One statement per transaction, in this order.
SESSION_SQL = (
    "INSERT INTO customers VALUES (3, 'chloe.dubois3@mail.example.org', 'Chloé Dubois', 'fr ', "
    "'2026-03-01T10:15:30.123456Z', '2026-03-01T10:15:30.123456Z')",
    "INSERT INTO orders VALUES (3, 3, 'placed', '120.00', 'GBP', '2026-03-01T10:16:00Z', '2026-03-01T10:16:00Z')",
    "UPDATE orders SET status = 'paid', amount = '125.5', updated_at = '2026-03-01T11:00:00Z' WHERE id = 3",
    "UPDATE customers SET country = 'DE', updated_at = '2026-03-01T11:05:00Z' WHERE id = 2",
    "DELETE FROM customers WHERE id = 2",
    "ALTER TABLE customers ADD COLUMN loyalty_tier text",
    "UPDATE customers SET loyalty_tier = 'gold', updated_at = '2026-03-01T12:00:00Z' WHERE id = 1",
    "INSERT INTO customers VALUES (4, 'david.rossi4@shop.test', 'David Rossi', 'IT', "
    "'2026-03-01T12:30:00Z', '2026-03-01T12:30:00Z', 'silver')",
    "TRUNCATE orders",
    "INSERT INTO orders VALUES (4, 4, 'placed', '0.99', 'EUR', '2026-03-01T13:00:00Z', '2026-03-01T13:00:00Z')",
)


def capture(schemas_enable: bool, work: Path) -> list[dict]:
    """Every record the connector wrote for the session, per topic in partition and offset order."""
    with KafkaBroker(work / "kafka") as broker:
        real = RealSource(work / "source", free_port(), free_port(), broker.bootstrap, schemas_enable)
        postgres = real.postgres.start()
        with postgres.connect() as conn:
            conn.execute(SNAPSHOT_SQL)
        try:
            real.up()
            since = sql_sink.end_offsets(broker.bootstrap, [topic(t) for t in TABLES])
            with postgres.connect() as conn:
                for statement in SESSION_SQL[:-1]:
                    conn.execute(statement)
                marker = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint")
                lsn = int(marker.fetchone()[0])
                conn.execute(SESSION_SQL[-1])
            sql_sink.wait_published(broker.bootstrap, "orders", lsn, since)
        finally:
            real.down()
        consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False,
                                 consumer_timeout_ms=3000)
        records = []
        for table in TABLES:
            parts = [TopicPartition(topic(table), p) for p in sorted(consumer.partitions_for_topic(topic(table)))]
            consumer.assign(parts)
            consumer.seek_to_beginning()
            got = sorted(consumer, key=lambda r: (r.partition, r.offset))
            records += [{"topic": r.topic, "partition": r.partition, "offset": r.offset,
                         "key": None if r.key is None else r.key.decode(),
                         "value": None if r.value is None else r.value.decode()} for r in got]
        consumer.close()
        return records


def main() -> None:
    FIXTURES.mkdir(parents=True, exist_ok=True)
    for name, schemas_enable in FORMATS.items():
        work = Path(tempfile.mkdtemp(prefix="lakehouse-capture-"))
        work.chmod(0o755)  # PostgreSQL runs as `postgres` below it
        try:
            records = capture(schemas_enable, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        path = FIXTURES / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
        print(f"{path}: {len(records)} records")


if __name__ == "__main__":
    main()
