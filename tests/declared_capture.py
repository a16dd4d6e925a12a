"""Capture what the real Debezium connector emits for declared tables of every type of contract section 7,
as fixtures (tests/fixtures/declared/, one JSON file per scenario; checked by tests/test_declared_fixtures.py).

Recapture when the pinned connector (jvm/pom.xml) or the connector's settings
(dev/lakehouse_dev/connect_config.py) change; no running source needed, it starts its own broker,
PostgreSQL and Connect on free ports (about a minute):

    .venv/bin/python -m tests.declared_capture

The session, with `schemas.enable=true` (section 7's tables arrive with their Connect schema):
- `public.all_types`: one column of every type of section 7's table (smallint ... integer[]), key
  `id`; `sales.regional_orders`: a composite primary key `(region, order_no)` in another schema.
  Both declared in a TOML (LAKEHOUSE_TABLES) and captured by `lakehouse dev source start`.
- Rows present before Connect starts: its initial snapshot (`snapshot.json`, op=r).
- Then one transaction per scenario: an insert, an update, NULLs in every nullable column, unicode
  text, pre-1970 and far-future dates and timestamps, bytea with zero bytes, arrays with a NULL
  element, numerics at their edges (a scale-less numeric's many digits, NaN), a delete (and its
  tombstone), the composite table's insert, update, update of a key column (Debezium: delete of
  the old key, its tombstone, create of the new) and delete.
- `public.late_rows`, holding rows before it is declared, then added by `lakehouse dev source sync`'s
  code path (RealSource.sync): its incremental snapshot (`incremental_snapshot.json`, op=r with
  `source.snapshot` "incremental"), an insert after it, and what the signal table's topic carried
  (`signal_table.json`: the execute-snapshot row and the snapshot window's watermarks).

Each file: `{"scenario", "sql", "records": [{"topic", "partition", "offset", "key", "value"}]}`, key and
value the text exactly as on the wire (a tombstone's value null), records in (topic, partition, offset)
order; a scenario's records are those of its transaction (`source.txId`), and a tombstone goes with
the delete before it (same key, same partition).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer, TopicPartition

from lakehouse_dev.kafka_local import KafkaBroker, free_port
from lakehouse_dev.pg_source import RealSource
from pipelines.lake.declaration import load

FIXTURES = Path(__file__).with_name("fixtures") / "declared"
PREFIX = "shop"

DECLARATION = """
[source]
topic_prefix = "shop"

[tables.all_types]
source = "public.all_types"
key = ["id"]

[tables.regional_orders]
source = "sales.regional_orders"
key = ["region", "order_no"]
"""
LATE = """
[tables.late_rows]
source = "public.late_rows"
key = ["id"]
"""

DDL = """
CREATE TYPE mood AS ENUM ('happy', 'sad', 'ok');
CREATE TABLE all_types (
  id              bigint PRIMARY KEY,
  c_smallint      smallint,
  c_integer       integer,
  c_bigint        bigint,
  c_real          real,
  c_double        double precision,
  c_boolean       boolean,
  c_numeric       numeric(12,2),
  c_numeric_any   numeric,
  c_text          text,
  c_varchar       varchar(20),
  c_char          char(3),
  c_enum          mood,
  c_date          date,
  c_timestamp     timestamp,
  c_timestamp3    timestamp(3),
  c_timestamptz   timestamptz,
  c_uuid          uuid,
  c_json          json,
  c_jsonb         jsonb,
  c_bytea         bytea,
  c_text_array    text[],
  c_int_array     integer[]
);
CREATE SCHEMA sales;
CREATE TABLE sales.regional_orders (
  region    text,
  order_no  bigint,
  amount    numeric(10,3) NOT NULL,
  note      text,
  PRIMARY KEY (region, order_no)
);
"""
COLUMNS = ("id, c_smallint, c_integer, c_bigint, c_real, c_double, c_boolean, c_numeric, c_numeric_any, c_text, "
           "c_varchar, c_char, c_enum, c_date, c_timestamp, c_timestamp3, c_timestamptz, c_uuid, c_json, c_jsonb, "
           "c_bytea, c_text_array, c_int_array")


def _row(i: int, values: str) -> str:
    return f"INSERT INTO all_types ({COLUMNS}) VALUES ({i}, {values})"


TYPICAL = ("-32768, 2147483647, 9223372036854775807, 1.5, 2.718281828459045, true, 12345.67, 3.14159, 'plain', "
           "'twenty chars at most', 'EUR', 'happy', '2026-03-01', '2026-03-01 10:15:30.123456', "
           "'2026-03-01 10:15:30.123', '2026-03-01 10:15:30.123456+01', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', "
           "'{\"a\": 1, \"b\": [true, null]}', '{\"b\": [1, 2], \"a\": \"x\"}', '\\x0102ff', "
           "ARRAY['x', 'y'], ARRAY[1, 2, 3]")
NULLS = ", ".join(["NULL"] * 22)

SNAPSHOT_SQL = (
    _row(1, TYPICAL),
    _row(2, NULLS),
    _row(3, "1, 2, 3, -0.25, 1e300, false, -0.01, 123456789012345678901234567890.123456789, 'Zoë 🎉 日本語', "
            "'ß', 'é✓x', 'sad', '1900-01-01', '1969-12-31 23:59:59.999999', '9999-12-31 23:59:59.999', "
            "'3000-01-01 00:00:00+00', '00000000-0000-0000-0000-000000000000', '[]', '{}', '\\x00', "
            "ARRAY[NULL, 'b'], ARRAY[NULL]::integer[]"),
    "INSERT INTO sales.regional_orders VALUES ('eu', 1, 10.5, 'first'), ('us', 1, 0.125, NULL)",
)
# One transaction per scenario, in this order.
SCENARIOS: dict[str, tuple[str, ...]] = {
    "insert": (_row(10, TYPICAL),),
    "update": ("UPDATE all_types SET c_integer = 7, c_text = 'changed', c_numeric = 0.5, "
               "c_timestamptz = '2026-03-02 00:00:00Z', c_int_array = ARRAY[9] WHERE id = 10",),
    "nulls": (_row(11, NULLS), "UPDATE all_types SET c_text = NULL, c_numeric = NULL, c_bytea = NULL, "
              "c_text_array = NULL, c_timestamptz = NULL WHERE id = 1"),
    "unicode": (_row(12, "0, 0, 0, 0, 0, true, 0, 0, 'Zoë 🎉 日本語 \"quoted\" back\\slash', 'ünïcödé ✓', 'é✓x', "
                         "'ok', '2026-01-01', '2026-01-01 00:00:00', '2026-01-01 00:00:00', '2026-01-01 00:00:00Z', "
                         "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{\"name\": \"Zoë 🎉\"}', "
                         "'{\"name\": \"日本語\"}', convert_to('Zoë', 'UTF8'), ARRAY['Zoë', '🎉'], ARRAY[0]"),),
    "dates": (_row(13, "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, '0001-01-01', "
                       "'1900-01-01 00:00:00.000001', '1969-12-31 23:59:59.999', '1950-06-15 12:00:00+02', "
                       "NULL, NULL, NULL, NULL, NULL, NULL"),
              _row(14, "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, '9999-12-31', "
                       "'2999-12-31 23:59:59.123456', '9999-12-31 23:59:59.999', '2999-12-31 23:59:59.999999Z', "
                       "NULL, NULL, NULL, NULL, NULL, NULL")),
    "bytea": (_row(15, "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
                       "NULL, NULL, NULL, NULL, '\\x00ff000000', NULL, NULL"),
              _row(16, "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
                       "NULL, NULL, NULL, NULL, '\\x', NULL, NULL")),
    "arrays": (_row(17, "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
                        "NULL, NULL, NULL, NULL, NULL, ARRAY['a', NULL, 'c'], ARRAY[1, NULL, 3]"),
               _row(18, "NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
                        "NULL, NULL, NULL, NULL, NULL, '{}', '{}'")),
    "numerics": (_row(19, "NULL, NULL, NULL, NULL, NULL, NULL, 9999999999.99, "
                          "-0.000000000000000000000000000000000000001, NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
                          "NULL, NULL, NULL, NULL, NULL, NULL, NULL"),
                 _row(20, "NULL, NULL, NULL, NULL, NULL, NULL, 5, 'NaN', NULL, NULL, NULL, NULL, NULL, NULL, NULL, "
                          "NULL, NULL, NULL, NULL, NULL, NULL, NULL")),
    "delete": ("DELETE FROM all_types WHERE id = 10",),
    "composite_insert": ("INSERT INTO sales.regional_orders VALUES ('apac', 7, 99.999, 'new')",),
    "composite_update": ("UPDATE sales.regional_orders SET amount = 11.25, note = 'changed' "
                         "WHERE region = 'eu' AND order_no = 1",),
    "composite_key_update": ("UPDATE sales.regional_orders SET region = 'emea' WHERE region = 'eu' AND order_no = 1",),
    "composite_delete": ("DELETE FROM sales.regional_orders WHERE region = 'us' AND order_no = 1",),
}
LATE_SQL = (
    "CREATE TABLE late_rows (id bigint PRIMARY KEY, note text, amount numeric(10,3), at timestamptz)",
    "INSERT INTO late_rows SELECT g, 'row ' || g, g * 1.5, '2026-03-01T00:00:00Z'::timestamptz + g * interval '1 h' "
    "FROM generate_series(1, 3) g",
)
LATE_AFTER = "INSERT INTO late_rows VALUES (4, 'after the sync', 6.000, '2026-03-02T00:00:00Z')"


# --------------------------------------------------------------------------- reading topics

def topic_records(bootstrap: str, topics: list[str]) -> list[dict[str, Any]]:
    """Every record of `topics` so far, as wire text: in (topic, partition, offset) order."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=1500)
    try:
        parts = [TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or ())]
        if not parts:
            return []
        consumer.assign(parts)
        consumer.seek_to_beginning()
        got = sorted(consumer, key=lambda r: (r.topic, r.partition, r.offset))
    finally:
        consumer.close()
    return [{"topic": r.topic, "partition": r.partition, "offset": r.offset,
             "key": None if r.key is None else r.key.decode(),
             "value": None if r.value is None else r.value.decode()} for r in got]


def payload(record: dict[str, Any]) -> dict[str, Any] | None:
    """The envelope of a record (`schemas.enable=true` or not); None for a tombstone."""
    if record["value"] is None:
        return None
    doc = json.loads(record["value"])
    return doc["payload"] if "schema" in doc and "payload" in doc else doc


def wait_records(bootstrap: str, topics: list[str], done: Callable[[list[dict[str, Any]]], bool],
                 timeout: float = 180.0) -> list[dict[str, Any]]:
    """Read `topics` again until `done(records)`; TimeoutError with what arrived otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        records = topic_records(bootstrap, topics)
        if done(records):
            return records
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{topics}: the expected records did not arrive in {timeout:.0f} s; got "
                               f"{[(r['topic'], (payload(r) or {}).get('op')) for r in records]}")
        time.sleep(1)


def by_transaction(records: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """Records grouped by their envelope's `source.txId`; a tombstone joins the delete before it."""
    groups: dict[int, list[dict[str, Any]]] = {}
    last: dict[tuple[str, int, str | None], int] = {}
    for r in records:
        env = payload(r)
        where = (r["topic"], r["partition"], r["key"])
        tx = env["source"]["txId"] if env else last.get(where)
        if tx is None:
            continue
        last[where] = tx
        groups.setdefault(tx, []).append(r)
    return groups


# --------------------------------------------------------------------------- the session

def capture(work: Path) -> dict[str, dict[str, Any]]:
    """Scenario -> its SQL and records."""
    (work / "tables.toml").write_text(DECLARATION)
    (work / "tables_late.toml").write_text(DECLARATION + LATE)
    first, late = load(work / "tables.toml"), load(work / "tables_late.toml")
    topics = [first.topic(n) for n in first.tables]
    out: dict[str, dict[str, Any]] = {}
    with KafkaBroker(work / "kafka") as broker:
        real = RealSource(work / "source", free_port(), free_port(), broker.bootstrap, schemas_enable=True)
        postgres = real.postgres.start()
        with postgres.connect() as conn:
            conn.execute(DDL)
            for statement in SNAPSHOT_SQL:
                conn.execute(statement)
        try:
            real.up(first)
            txids = {}
            with postgres.connect() as conn:
                for name, statements in SCENARIOS.items():
                    with conn.transaction():
                        txids[name] = int(conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()[0])
                        for statement in statements:
                            conn.execute(statement)
                for statement in LATE_SQL:
                    conn.execute(statement)
            last = txids["composite_delete"]
            records = wait_records(broker.bootstrap, topics,
                                   lambda rs: any((payload(r) or {}).get("source", {}).get("txId") == last
                                                  for r in rs))
            out["snapshot"] = {"sql": [DDL.strip(), *SNAPSHOT_SQL],
                               "records": [r for r in records if (payload(r) or {}).get("op") == "r"]}
            groups = by_transaction(records)
            for name, statements in SCENARIOS.items():
                out[name] = {"sql": list(statements), "records": groups.get(txids[name], [])}

            report = real.sync(late)
            assert report.snapshot == ["public.late_rows"], report
            late_topic = late.topic("late_rows")
            wait_records(broker.bootstrap, [late_topic],
                         lambda rs: sum((payload(r) or {}).get("op") == "r" for r in rs) >= 3)
            with postgres.connect() as conn:
                conn.execute(LATE_AFTER)
            got = wait_records(broker.bootstrap, [late_topic],
                               lambda rs: any((payload(r) or {}).get("op") == "c" for r in rs))
            out["incremental_snapshot"] = {"sql": [*LATE_SQL, f"(lakehouse dev source sync with tables.late_rows "
                                                               f"declared: signal {report.signal_id})", LATE_AFTER],
                                           "records": got}
            signal_topic = f"{PREFIX}.public.debezium_signal"
            out["signal_table"] = {"sql": [], "records": topic_records(broker.bootstrap, [signal_topic])}
        finally:
            real.down()
    return out


def main() -> None:
    FIXTURES.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="lakehouse-capture-"))
    work.chmod(0o755)  # PostgreSQL runs as `postgres` below it
    try:
        scenarios = capture(work)
    finally:
        if not os.environ.get("LAKEHOUSE_CAPTURE_KEEP"):
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"kept {work}")
    for name, doc in scenarios.items():
        path = FIXTURES / f"{name}.json"
        path.write_text(json.dumps({"scenario": name, **doc}, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        print(f"{path}: {len(doc['records'])} records")


if __name__ == "__main__":
    main()
