"""Tables beyond the shop, declared in TOML (contract section 7), through real Kafka, Spark and Hudi into bronze and
silver.

Every type of section 7 arrives in its Debezium wire form with its Connect schema; bronze must hold
the type the source meant (dates as dates, wall-clock timestamps unshifted, exact decimals, the same
bytes, arrays as arrays, the same JSON document). A composite key takes inserts, updates, deletes and
updates of a key column (a delete of the old key and an insert of the new); a run of older events
replayed after newer ones changes nothing. Silver holds the rows that pass the declared rules after
the declared cleaning, with bronze's types; quarantine the others, with the rule they failed. Read
back with Spark and with hudi-rs, against the model of tests/declared_tables.py.
"""

from __future__ import annotations

import json
import os
import random
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from kafka.admin import KafkaAdminClient, NewTopic
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from lakehouse_dev.generator import Message, produce
from pipelines.errors import DeclarationError
from pipelines.ingest.bronze import IngestOptions, run_ingest
from pipelines.lake.hudi_timeline import latest_meta
from pipelines.lake.layout import BUCKETS_META, main_path, quarantine_path, silver_path
from pipelines.lake.table_stats import read_table
from pipelines.lake.timeline_files import data_files, timeline
from pipelines.runtime.lake import Lake
from pipelines.transform.etl import run_etl
from tests.declared_tables import DECLARATION, EVERY_TYPE, LINES, DeclaredSource, DeclaredTable, silver_model
from tests.lake import run_cli

EPOCH = datetime(1970, 1, 1)


def _comparable(value: Any) -> Any:
    """One form for both readers: timestamps as epoch microseconds (wall clock or UTC instant), bytes as bytes,
    decimals exact."""
    if isinstance(value, datetime):
        naive = value.astimezone(UTC).replace(tzinfo=None) if value.tzinfo else value
        return (naive - EPOCH) // timedelta(microseconds=1)
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, list):
        return [_comparable(v) for v in value]
    return value


def _expected(t: DeclaredTable, source: DeclaredSource) -> dict[tuple, dict[str, Any]]:
    return {k: {c: _comparable(row.get(c)) for c, _, _ in t.columns} for k, row in source.state[t.name].items()}


def _spark_rows(spark: SparkSession, root: str, t: DeclaredTable, path: str | None = None,
                extra: tuple[str, ...] = ()) -> dict[tuple, dict[str, Any]]:
    df = spark.read.format("hudi").load(path or main_path(t.name, root))
    # Timestamps as epoch microseconds in Spark itself: a collected timestamp is shifted to this process's zone.
    columns = [F.unix_micros(c).alias(c) if df.schema[c].dataType.typeName() == "timestamp" else F.col(c)
               for c, _, _ in t.columns] + [F.col(c) for c in extra]
    rows = [r.asDict(recursive=True) for r in df.select(*columns).collect()]
    return _keyed(t, [{c: _comparable(v) for c, v in r.items()} for r in rows], "spark")


def _hudi_rs_rows(root: str, t: DeclaredTable, path: str | None = None,
                  extra: tuple[str, ...] = ()) -> dict[tuple, dict[str, Any]]:
    table = read_table(path or main_path(t.name, root), [*(c for c, _, _ in t.columns), *extra])
    columns = {}
    for name in table.column_names:
        column = table.column(name)
        if pa.types.is_timestamp(column.type):
            column = column.cast(pa.timestamp("us")).cast(pa.int64())
        columns[name] = column.to_pylist()
    rows = [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)]
    return _keyed(t, [{c: _comparable(v) for c, v in r.items()} for r in rows], "hudi-rs")


def _keyed(t: DeclaredTable, rows: list[dict[str, Any]], reader: str) -> dict[tuple, dict[str, Any]]:
    keyed = {tuple(r[k] for k in t.key): r for r in rows}
    assert len(keyed) == len(rows), f"{reader} bronze/{t.name}: a key appears twice"
    return keyed


def _assert_bronze(spark: SparkSession, root: str, source: DeclaredSource) -> None:
    for t in (EVERY_TYPE, LINES):
        want = _expected(t, source)
        for reader, got in (("spark", _spark_rows(spark, root, t)), ("hudi-rs", _hudi_rs_rows(root, t))):
            wrong = {k: (got.get(k), want.get(k)) for k in want.keys() | got.keys() if got.get(k) != want.get(k)}
            assert not wrong, f"{reader} bronze/{t.name} differs from the source on {len(wrong)} keys, e.g. " \
                f"{next(iter(wrong.items()))}"


def _assert_silver(spark: SparkSession, root: str, source: DeclaredSource) -> None:
    for t in (EVERY_TYPE, LINES):
        silver, quarantine = {}, {}
        for k, row in source.state[t.name].items():
            clean, failed = silver_model(t.name, row)
            if failed:
                quarantine[k] = failed
            else:
                silver[k] = {c: _comparable(v) for c, v in clean.items()}
        where = silver_path(t.name, root), quarantine_path(t.name, root)
        rule = ("failed_rule",)
        for reader, got, held in (
                ("spark", _spark_rows(spark, root, t, where[0]), _spark_rows(spark, root, t, where[1], rule)),
                ("hudi-rs", _hudi_rs_rows(root, t, where[0]), _hudi_rs_rows(root, t, where[1], rule))):
            wrong = {k: (got.get(k), silver.get(k)) for k in silver.keys() | got.keys() if got.get(k) != silver.get(k)}
            assert not wrong, f"{reader} silver/{t.name} differs on {len(wrong)} keys, e.g. {next(iter(wrong.items()))}"
            assert {k: r["failed_rule"] for k, r in held.items()} == quarantine, f"{reader} quarantine of {t.name}"
        assert len(set(quarantine.values())) >= (3 if t is EVERY_TYPE else 1), "the workload exercises the rules"


def _assert_own_buckets(spark: SparkSession, root: str, declaration: Path, bootstrap: str) -> None:
    """order_lines' keys are in its own 2 buckets, each commit says so, and a stream told 4 refuses to start."""
    lines, every = main_path(LINES.name, root), main_path(EVERY_TYPE.name, root)
    assert {f.file_id[:8] for f in data_files(lines)} == {"00000000", "00000001"}
    assert len({f.file_id[:8] for f in data_files(every)}) > 2, "the other table keeps the project's count"
    assert latest_meta(spark, lines, BUCKETS_META) == "2"
    assert any(i.action == "compaction" for i in timeline(lines)), "compact_every = 2 planned a compaction"
    declaration.write_text(declaration.read_text().replace("buckets = 2", "buckets = 4"))
    with pytest.raises(DeclarationError, match=r"bronze/order_lines: its bucket index was written with 2 buckets"):
        run_ingest(Lake.at(root, spark), once=True, bootstrap=bootstrap)
    declaration.write_text(declaration.read_text().replace("buckets = 4", "buckets = 2"))


@pytest.mark.integration
def test_declared_tables_of_every_type_and_a_composite_key(spark: SparkSession, broker, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    declaration = tmp_path / "tables.toml"
    # order_lines with options of its own: 2 buckets, a compaction planned every 2nd delta commit.
    own = 'key = ["region", "order_no"]\n'
    declaration.write_text(DECLARATION.replace(own, own + "buckets = 2\ncompact_every = 2\n"))
    monkeypatch.setenv("LAKEHOUSE_TABLES", str(declaration))
    root = str(tmp_path / "lake")
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    admin.create_topics([NewTopic(t.topic, 3, 1) for t in (EVERY_TYPE, LINES)])
    admin.close()

    source, rng = DeclaredSource([EVERY_TYPE, LINES], seed=48), random.Random(48)
    sent: list[Message] = []
    first = [m for i in range(60) for m in source.insert(EVERY_TYPE, (i,), op="r")]
    first += [m for i in range(30) for m in source.insert(LINES, (rng.choice(["eu", "us", "ü-asia"]), i), op="r")]
    for _ in range(120):
        t = rng.choice([EVERY_TYPE, LINES])
        keys = sorted(source.state[t.name])
        choice = rng.random()
        if choice < 0.45 and keys:
            first += source.update(t, rng.choice(keys))
        elif choice < 0.6 and keys:
            first += source.delete(t, rng.choice(keys))
        elif choice < 0.75 and keys and t is LINES:
            old = rng.choice(keys)
            new = (rng.choice(["eu", "us", "ü-asia"]), rng.randint(100, 10**6))
            if new not in source.state[t.name]:
                first += source.rekey(t, old, new)
        else:
            first += source.insert(t, (rng.randint(1000, 10**9),) if t is EVERY_TYPE else
                                   ("eu", rng.randint(10**7, 10**8)))
    produce(first, broker.bootstrap)
    sent += first
    run_ingest(Lake.at(root, spark), once=True, bootstrap=broker.bootstrap)
    _assert_bronze(spark, root, source)
    run_etl(Lake.at(root, spark))
    _assert_silver(spark, root, source)

    # More changes, then a run of older events replayed after them (a connector restart): nothing moves back.
    second: list[Message] = []
    for key in sorted(source.state[EVERY_TYPE.name])[:20]:
        second += source.update(EVERY_TYPE, key)
    for key in sorted(source.state[LINES.name])[:5]:
        second += source.delete(LINES, key)
    second += [m for m in sent[-80:]]
    produce(second, broker.bootstrap)
    run_ingest(Lake.at(root, spark), once=True, bootstrap=broker.bootstrap)
    _assert_bronze(spark, root, source)
    run_etl(Lake.at(root, spark))  # incremental: only the keys changed since the first cycle
    _assert_silver(spark, root, source)
    _assert_own_buckets(spark, root, declaration, broker.bootstrap)

    # `lakehouse status` on declared tables: rows and deleted keys by each table's own key, a composite one too.
    monkeypatch.setenv("LAKEHOUSE_ROOT", root)
    status = run_cli("status")
    assert status.exit_code == 0, status.output[-3000:]
    for t in (EVERY_TYPE, LINES):
        ever = {tuple(json.loads(m.key)[k] for k in t.key) for m in sent + second if m.topic == t.topic}
        (line,) = [x for x in status.stdout.splitlines() if x.startswith(f"bronze/{t.name} ")]
        rows, deleted = int(line.split()[1]), int(line.split()[5])
        assert (rows, deleted) == (len(source.state[t.name]), len(ever - source.state[t.name].keys())), line

    types = {f.name: f.dataType.simpleString()
             for f in spark.read.format("hudi").load(main_path(EVERY_TYPE.name, root)).schema.fields}
    assert {c: types[c] for c in ("small", "num", "big", "ratio", "score", "flag", "price", "born", "seen",
                                  "paid_at", "ref", "doc", "blob", "tags", "counts")} == {
        "small": "int", "num": "int", "big": "bigint", "ratio": "float", "score": "double", "flag": "boolean",
        "price": "decimal(38,2)", "born": "date", "seen": "timestamp", "paid_at": "timestamp", "ref": "string",
        "doc": "string", "blob": "binary", "tags": "array<string>", "counts": "array<int>"}
    # The edge values made it: a pre-1970 date, zero bytes, an exact decimal.
    every = source.state[EVERY_TYPE.name].values()
    assert any(r["born"] == date(1900, 1, 1) for r in every) and any(r["blob"] and 0 in r["blob"] for r in every)
    assert all(isinstance(r["price"], Decimal | None) for r in every)


@pytest.mark.integration
def test_an_incremental_snapshot_of_a_table_added_by_sync_lands_in_bronze(spark: SparkSession, broker, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The real connector's records of a table declared while it ran (tests/fixtures/declared, captured by
    tests/declared_capture.py): reads of an incremental snapshot carry no LSN; ordered by their stream
    position, they land with the change that followed, typed, and none is a dead letter."""
    import json

    from pipelines.lake.layout import dead_letter_path
    from pipelines.lake.table_stats import has_completed_commit

    fixture = json.loads((Path(__file__).with_name("fixtures") / "declared" / "incremental_snapshot.json").read_text())
    declaration = tmp_path / "tables.toml"
    declaration.write_text('[source]\ntopic_prefix = "shop"\n[tables.late_rows]\nsource = "public.late_rows"\n'
                           'key = ["id"]\n')
    monkeypatch.setenv("LAKEHOUSE_TABLES", str(declaration))
    records = [r for r in fixture["records"] if r["topic"] == "shop.public.late_rows"]
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    admin.create_topics([NewTopic("shop.public.late_rows", 1, 1)])
    admin.close()
    produce([Message(r["topic"], r["key"] and r["key"].encode(), r["value"] and r["value"].encode())
             for r in records], broker.bootstrap)
    root = str(tmp_path / "lake")
    run_ingest(Lake.at(root, spark), once=True, bootstrap=broker.bootstrap)
    assert not has_completed_commit(dead_letter_path(root)), "no record of the snapshot is a dead letter"
    rows = {r["id"]: r for r in spark.read.format("hudi").load(main_path("late_rows", root))
            .select("id", "note", "amount", F.unix_micros("at").alias("at"), "_lsn").collect()}
    assert sorted(rows) == [1, 2, 3, 4]
    assert rows[2]["note"] == "row 2" and rows[2]["amount"] == Decimal("3.000") and rows[4]["note"] == "after the sync"
    assert rows[1]["at"] == (datetime(2026, 3, 1, 1) - EPOCH) // timedelta(microseconds=1)
    assert rows[1]["_lsn"] < rows[4]["_lsn"], "the snapshot's reads order before the change that followed"


@pytest.mark.integration
def test_a_table_declared_while_the_stream_runs_is_followed_exactly(spark: SparkSession, broker, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The stream reads the declared tables' topics; a table added to the declaration while it runs (what
    `lakehouse source sync` follows) is read from its topic's start once the topic exists, the others go on from
    where they were, and neither gets an event twice or loses one.

    The table's topic does not exist when it is declared: Kafka Connect creates it with the snapshot's first
    record, here at the worst instant, just after the stream listed the topics for its next query. A query that
    subscribed to it then would be assigned partitions its starting offsets do not name, and fail."""
    import threading

    from pipelines.ingest import topics
    from pipelines.ingest.stream import ControlFiles

    declaration = tmp_path / "tables.toml"
    only_every = DECLARATION[:DECLARATION.index("[tables.order_lines]")]
    declaration.write_text(only_every)
    monkeypatch.setenv("LAKEHOUSE_TABLES", str(declaration))
    monkeypatch.setenv("LAKEHOUSE_HUDI_OVERRIDES", os.environ["LAKEHOUSE_HUDI_OVERRIDES"] + os.pathsep + str(
        _write(tmp_path / "fast.toml", "[stream.health]\nheartbeat_seconds = 1\n")))
    root = str(tmp_path / "lake")
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    admin.create_topics([NewTopic(EVERY_TYPE.topic, 2, 1)])
    listed, created = topics.topic_partitions, []

    def created_after_listing(*args, **kwargs) -> dict[str, list[int]]:
        found = listed(*args, **kwargs)
        if not created and LINES.topic in (args[1] if len(args) > 1 else kwargs.get("topics") or ()):
            admin.create_topics([NewTopic(LINES.topic, 2, 1)])
            created.append(LINES.topic)
        return found
    monkeypatch.setattr(topics, "topic_partitions", created_after_listing)
    source, rng = DeclaredSource([EVERY_TYPE, LINES], seed=51), random.Random(51)

    def changes(t: DeclaredTable, n: int) -> list[Message]:
        out: list[Message] = []
        for _ in range(n):
            keys = sorted(source.state[t.name])
            if keys and rng.random() < 0.5:
                out += source.update(t, rng.choice(keys)) if rng.random() < 0.8 else source.delete(t, rng.choice(keys))
            else:
                out += source.insert(t, (rng.randint(1, 10**9),) if t is EVERY_TYPE else ("eu", rng.randint(1, 10**9)))
        return out

    produce(changes(EVERY_TYPE, 40), broker.bootstrap)
    failure: list[BaseException] = []

    def stream() -> None:
        try:
            run_ingest(Lake.at(root, spark), once=False, bootstrap=broker.bootstrap,
                       options=IngestOptions(trigger_seconds=1))
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=stream, daemon=True)
    thread.start()
    _wait(lambda: _is_caught_up(spark, root, source, (EVERY_TYPE,)), failure)
    declaration.write_text(DECLARATION)  # order_lines declared before its topic exists
    produce(changes(EVERY_TYPE, 20), broker.bootstrap)
    _wait(lambda: bool(created), failure)
    admin.close()
    produce(changes(EVERY_TYPE, 10) + changes(LINES, 30), broker.bootstrap)
    produce(changes(LINES, 30), broker.bootstrap)
    _wait(lambda: _is_caught_up(spark, root, source), failure)
    ControlFiles(root).request_stop("test")
    thread.join(120)
    assert not thread.is_alive() and not failure, failure
    _assert_bronze(spark, root, source)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _is_caught_up(spark: SparkSession, root: str, source: DeclaredSource,
                  tables: tuple[DeclaredTable, ...] = (EVERY_TYPE, LINES)) -> bool:
    from pipelines.lake.table_stats import has_completed_commit

    return all(has_completed_commit(main_path(t.name, root)) and _spark_rows(spark, root, t) == _expected(t, source)
               for t in tables)


def _wait(done, failure: list[BaseException], timeout: float = 180) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not done():
        assert not failure, failure
        assert time.monotonic() < deadline, "the stream did not catch up"
        time.sleep(1)


@pytest.mark.unit
def test_a_changed_encoding_of_one_type_holds_the_table_until_accepted(tmp_path: Path) -> None:
    """timestamp(3) altered to timestamp(6): Debezium's milliseconds become microseconds, the column stays a
    timestamp. Read the new way, the old messages would be wrong, and the other way round: held, not guessed."""
    from pipelines.ingest.schema import Shape, decide
    from pipelines.lake.declaration import load

    declaration = tmp_path / "tables.toml"
    declaration.write_text(DECLARATION)
    every_type = load(declaration).table("every_type")
    first = decide(Shape.initial(every_type), [[("id", "bigint", "cast"), ("seen", "timestamp", "millis")]],
                   [], {}, set(), 1)
    assert first.shape.columns["seen"].convert == "millis" and not first.held_declared
    altered = [("id", "bigint", "cast"), ("seen", "timestamp", "micros")]
    held = decide(first.shape, [altered], [], {}, set(), 2)
    assert list(held.held_declared.values()) == [
        "schema: every_type.seen: the source's encoding of timestamp changed (millis -> micros): accept it to read "
        "new values that way"] and held.shape.columns["seen"].convert == "millis"
    accepted = decide(first.shape, [altered], [], {}, {"every_type.seen"}, 2)
    assert not accepted.held_declared and accepted.shape.columns["seen"].convert == "micros"


FIXTURE_TABLES = """
[source]
topic_prefix = "shop"
[tables.all_types]
source = "public.all_types"
key = ["id"]
[tables.regional_orders]
source = "sales.regional_orders"
key = ["region", "order_no"]
"""


@pytest.mark.integration
def test_the_real_connectors_records_of_every_type_land_typed(spark: SparkSession, broker, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Every record Debezium 2.7.3 gave for section 7's types (tests/fixtures/declared, captured by
    tests/declared_capture.py from the SQL each file lists): none is a dead letter, and bronze holds the values
    the SQL wrote, typed as section 7 says, the extremes included (year 1 and 9999, zero bytes, NULL array
    elements, a key-column update)."""
    import base64
    import json
    from datetime import date as day

    from pipelines.lake.layout import dead_letter_path
    from pipelines.lake.table_stats import has_completed_commit

    declaration = tmp_path / "tables.toml"
    declaration.write_text(FIXTURE_TABLES)
    monkeypatch.setenv("LAKEHOUSE_TABLES", str(declaration))
    folder = Path(__file__).with_name("fixtures") / "declared"
    records = [r for f in sorted(folder.glob("*.json")) for r in json.loads(f.read_text())["records"]
               if r["topic"] in ("shop.public.all_types", "shop.sales.regional_orders")]
    records.sort(key=lambda r: (r["topic"], r["partition"], r["offset"]))  # each key's events in their order
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    admin.create_topics([NewTopic(t, 1, 1) for t in ("shop.public.all_types", "shop.sales.regional_orders")])
    admin.close()
    produce([Message(r["topic"], r["key"] and r["key"].encode(), r["value"] and r["value"].encode())
             for r in records], broker.bootstrap)
    root = str(tmp_path / "lake")
    run_ingest(Lake.at(root, spark), once=True, bootstrap=broker.bootstrap)
    assert not has_completed_commit(dead_letter_path(root)), "a record of the real connector is a dead letter"

    bronze = spark.read.format("hudi").load(main_path("all_types", root))
    types = {f.name: f.dataType.simpleString() for f in bronze.schema.fields}
    assert {c: types[c] for c in ("c_smallint", "c_integer", "c_bigint", "c_real", "c_double", "c_boolean",
                                  "c_numeric", "c_numeric_any", "c_text", "c_enum", "c_date", "c_timestamp",
                                  "c_timestamp3", "c_timestamptz", "c_uuid", "c_jsonb", "c_bytea", "c_text_array",
                                  "c_int_array")} == {
        "c_smallint": "int", "c_integer": "int", "c_bigint": "bigint", "c_real": "float", "c_double": "double",
        "c_boolean": "boolean", "c_numeric": "decimal(38,2)", "c_numeric_any": "string", "c_text": "string",
        "c_enum": "string", "c_date": "date", "c_timestamp": "timestamp", "c_timestamp3": "timestamp",
        "c_timestamptz": "timestamp", "c_uuid": "string", "c_jsonb": "string", "c_bytea": "binary",
        "c_text_array": "array<string>", "c_int_array": "array<int>"}
    rows = {r["id"]: r for r in bronze.select(
        "id", "c_date", F.unix_micros("c_timestamp").alias("ts"), F.unix_micros("c_timestamp3").alias("ts3"),
        F.unix_micros("c_timestamptz").alias("tstz"), "c_bytea", "c_text_array", "c_int_array", "c_numeric",
        "c_numeric_any").collect()}
    micros = lambda *a: (datetime(*a) - EPOCH) // timedelta(microseconds=1)  # noqa: E731
    assert rows[13]["c_date"] == day(1, 1, 1) and rows[14]["c_date"] == day(9999, 12, 31)
    assert rows[13]["ts"] == micros(1900, 1, 1, 0, 0, 0, 1)
    assert rows[13]["ts3"] == micros(1969, 12, 31, 23, 59, 59, 999000)
    assert rows[13]["tstz"] == micros(1950, 6, 15, 10), "timestamptz is the UTC instant"
    assert rows[14]["ts"] == micros(2999, 12, 31, 23, 59, 59, 123456)
    assert bytes(rows[15]["c_bytea"]) == base64.b64decode("AP8AAAA=") == b"\x00\xff\x00\x00\x00"
    assert bytes(rows[16]["c_bytea"]) == b""
    assert rows[17]["c_text_array"] == ["a", None, "c"] and rows[17]["c_int_array"] == [1, None, 3]
    assert rows[18]["c_text_array"] == [] and rows[19]["c_numeric"] == Decimal("9999999999.99")
    assert rows[20]["c_numeric_any"] == "NAN" and rows[19]["c_numeric_any"].startswith("-0.0000")
    lines = {(r["region"], r["order_no"]) for r in spark.read.format("hudi").load(main_path("regional_orders", root))
             .select("region", "order_no").collect()}
    assert ("emea", 1) in lines and ("eu", 1) not in lines, "a key-column update: the old key deleted, the new there"
