"""Declared tables end to end on the real source: PostgreSQL 15 -> Debezium 2.7.3 -> Kafka -> the ingest stream ->
bronze -> silver, checked against PostgreSQL's own state read with SQL, by Spark and by hudi-rs (contract section 7).

A table of every type of section 7 and one with a composite key (in a schema of its own) are declared
with cleaning and rules and hold rows before Connect starts (Debezium's snapshot). Random changes
(dev/lakehouse_dev/generator/declared.py: NULLs, unicode, pre-1970 and far-future values, zero bytes,
NULL array elements, key-column updates) are played as SQL while `lakehouse ingest` streams; the
stream is SIGKILLed in the middle of a batch and started again; then a third table, which already
holds rows, is declared and `lakehouse dev source sync` is run while the stream runs: its rows arrive by
Debezium's incremental snapshot, the stream follows the declaration. After `etl`, bronze, silver and
quarantine equal what PostgreSQL holds and the declared rules say.

Then drift of three kinds, each found and healed through the running stream: rows of bronze changed behind the
pipeline's back; a change whose records retention deleted before the stream read them (the stream started past
the loss with `--accept-lost`); and the changes lost while a table was dropped from the publication by hand and
added back (which `source check` names as a gap until reconcile finds the table exact again).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import pyarrow as pa
import pytest
from click.testing import CliRunner
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from lakehouse_dev.generator.declared import DeclaredWorkload, source_rows
from lakehouse_dev.kafka_local import KafkaBroker, free_port
from lakehouse_dev.pg_source import RealSource
from lakehouse_dev.pg_source_cli import source
from pipelines.ingest.stream import ControlFiles
from pipelines.lake.declaration import DECLARATION_VARIABLE, load
from pipelines.lake.layout import main_path, quarantine_path, silver_path
from pipelines.lake.table_stats import has_completed_commit, read_table
from pipelines.runtime.lake import Lake
from pipelines.transform.etl import run_etl
from tests.declared_capture import payload, topic_records

pytestmark = [pytest.mark.slow, pytest.mark.integration]

SETUP_SQL = """
CREATE TYPE mood AS ENUM ('happy', 'sad', 'ok');
CREATE TABLE all_types (
  id bigint PRIMARY KEY, small smallint, num integer NOT NULL, ratio real, score double precision, flag boolean,
  price numeric(12,2), label text, code varchar(20), cc char(3), feeling mood, born date, seen timestamp,
  seen_ms timestamp(3), paid_at timestamptz, ref uuid, doc jsonb, raw json, blob bytea, tags text[], counts integer[]);
CREATE SCHEMA sales;
CREATE TABLE sales.regional_orders (region text, order_no bigint, amount numeric(10,3), note text,
  PRIMARY KEY (region, order_no));
CREATE TABLE late_rows (id integer PRIMARY KEY, note text, at timestamptz);
INSERT INTO late_rows SELECT g, 'before ' || g, '1965-03-01T00:00:00Z'::timestamptz + g * interval '1 day'
  FROM generate_series(1, 25) g;
"""
DECLARATION = """
[source]
topic_prefix = "shop"

[tables.all_types]
source = "public.all_types"
key = ["id"]
[[tables.all_types.clean]]
column = "label"
trim = true
upper = true
[[tables.all_types.rules]]
column = "feeling"
one_of = ["happy", "ok"]
[[tables.all_types.rules]]
column = "price"
min = 0

[tables.orders_by_region]
source = "sales.regional_orders"
key = ["region", "order_no"]
[[tables.orders_by_region.rules]]
column = "note"
pattern = "^[a-z]"
"""
LATE = """
[tables.late_rows]
source = "public.late_rows"
key = ["id"]
"""
EPOCH = datetime(1970, 1, 1)


def _plain(value: Any) -> Any:
    """One form for PostgreSQL's values and both readers': instants and wall clocks as epoch microseconds,
    UUIDs as text, JSON as its value, bytes as bytes, decimals as they are."""
    if isinstance(value, datetime):
        naive = value.astimezone(UTC).replace(tzinfo=None) if value.tzinfo else value
        return (naive - EPOCH) // timedelta(microseconds=1)
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


JSON_COLUMNS = {"doc", "raw"}


def _row(row: dict[str, Any]) -> dict[str, Any]:
    return {c: (None if v is None else json.loads(v)) if c in JSON_COLUMNS else _plain(v) for c, v in row.items()}


def _spark(spark: SparkSession, path: str, columns: list[str]) -> list[dict[str, Any]]:
    df = spark.read.format("hudi").load(path)
    cols = [F.unix_micros(c).alias(c) if df.schema[c].dataType.typeName() == "timestamp" else F.col(c) for c in columns]
    return [_row(r.asDict(recursive=True)) for r in df.select(*cols).collect()]


def _hudi_rs(path: str, columns: list[str]) -> list[dict[str, Any]]:
    table = read_table(path, columns)
    data = {}
    for name in table.column_names:
        column = table.column(name)
        if pa.types.is_timestamp(column.type):
            column = column.cast(pa.timestamp("us")).cast(pa.int64())
        data[name] = column.to_pylist()
    return [_row(dict(zip(data, values, strict=True))) for values in zip(*data.values(), strict=True)]


def _keyed(rows: list[dict[str, Any]], key: tuple[str, ...]) -> dict[tuple, dict[str, Any]]:
    keyed = {tuple(r[k] for k in key): r for r in rows}
    assert len(keyed) == len(rows), "a key appears twice"
    return keyed


def _silver_model(name: str, row: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """DECLARATION's cleaning and rules in plain Python."""
    if name == "all_types":
        label = row["label"].strip().upper() if row["label"] is not None else None
        checks = [("feeling_one_of", row["feeling"] is None or row["feeling"] in ("happy", "ok")),
                  ("price_min", row["price"] is None or row["price"] >= 0)]
        return {**row, "label": label}, next((n for n, ok in checks if not ok), None)
    if name == "orders_by_region":
        ok = row["note"] is None or re.search("^[a-z]", row["note"]) is not None
        return row, None if ok else "note_pattern"
    return row, None


def _start_ingest(root: str, bootstrap: str, declaration: Path, log_path: Path, *args: str) -> subprocess.Popen:
    env = os.environ | {"LAKEHOUSE_ROOT": root, "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
                        DECLARATION_VARIABLE: str(declaration)}
    with log_path.open("a") as log_file:
        return subprocess.Popen([sys.executable, "-m", "pipelines.cli", "ingest", "--trigger-seconds", "2", *args],
                                env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)


def _batches(log_path: Path) -> int:
    return len(re.findall(r"batch \d+: started", log_path.read_text(errors="replace")))


def _wait(done, what: str, job: subprocess.Popen | None = None, log_path: Path | None = None,
          timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        tail = log_path.read_text(errors="replace")[-3000:] if log_path else ""
        assert job is None or job.poll() is None, f"ingest stopped: {tail}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {tail}"
        time.sleep(1)


@pytest.fixture
def real(broker: KafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    declaration = tmp_path / "tables.toml"
    declaration.write_text(DECLARATION)
    monkeypatch.setenv(DECLARATION_VARIABLE, str(declaration))
    home = Path(tempfile.mkdtemp(prefix="lakehouse-declared-"))  # PostgreSQL runs as `postgres`: not under tmp_path
    home.chmod(0o755)
    real = RealSource(home, free_port(), free_port(), broker.bootstrap, schemas_enable=True)
    try:
        with real.postgres.start().connect() as conn:
            conn.execute(SETUP_SQL)
            DeclaredWorkload(conn, load(declaration), seed=3).play(60, ["all_types", "orders_by_region"])
        real.up()
        yield real, declaration
    finally:
        try:
            real.down()
        finally:
            shutil.rmtree(home, ignore_errors=True)


def test_declared_tables_on_the_real_source(spark: SparkSession, real, tmp_path: Path) -> None:
    real, declaration = real
    root, log_path = str(tmp_path / "lake"), tmp_path / "ingest.log"
    bootstrap = real.bootstrap
    job = _start_ingest(root, bootstrap, declaration, log_path)
    try:
        with real.postgres.connect() as conn:
            conn.autocommit = True
            workload = DeclaredWorkload(conn, load(declaration), seed=4)
            workload.play(120)
            # SIGKILL a moment into a batch it had not started yet; the next start re-runs what it cut.
            seen = _batches(log_path)
            _wait(lambda: _batches(log_path) > seen, "a batch", job, log_path)
            time.sleep(2.5)
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
            workload.play(80)
            job = _start_ingest(root, bootstrap, declaration, log_path)
            _wait(lambda: _batches(log_path) > seen + 1, "the restarted stream", job, log_path)
            # A table that holds rows, declared while the stream runs.
            declaration.write_text(DECLARATION + LATE)
            result = CliRunner().invoke(source, ["sync", "--home", str(real.home)],
                                        env={DECLARATION_VARIABLE: str(declaration)})
            assert result.exit_code == 0, result.output
            full = load(declaration)
            workload = DeclaredWorkload(conn, full, seed=5)
            workload.play(80)
            expected = {name: source_rows(conn, t) for name, t in full.tables.items()}

        def caught_up() -> bool:
            for name, t in full.tables.items():
                path = main_path(name, root)
                want = {tuple(_plain(v) for v in k): _row(r) for k, r in expected[name].items()}
                if not has_completed_commit(path) or _keyed(_spark(spark, path, columns[name]), t.key) != want:
                    return False
            return True

        columns = {name: list(next(iter(rows.values()))) for name, rows in expected.items()}
        _wait(caught_up, "bronze to hold what PostgreSQL holds", job, log_path)
        with real.postgres.connect() as conn:
            conn.autocommit = True
            clean = _reconciled(Lake.at(root, spark).with_declaration(full), conn, rounds=2)  # the stream runs on
        assert all(not r.drift and not r.not_compared and not r.counts["unsettled"] for r in clean), clean
        assert {r.table: r.source_rows for r in clean} == {n: len(rows) for n, rows in expected.items()}
        assert {r.table: r.lake_rows for r in clean} == {n: len(rows) for n, rows in expected.items()}
        ControlFiles(root).request_stop("test")
        assert job.wait(120) == 0, log_path.read_text(errors="replace")[-3000:]
        assert "the declared tables changed" in log_path.read_text(errors="replace")
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    run_etl(Lake.at(root, spark))

    for name, t in full.tables.items():
        want = {tuple(_plain(v) for v in k): _row(r) for k, r in expected[name].items()}
        silver, held = {}, {}
        for k, row in want.items():
            clean, failed = _silver_model(name, row)
            (held if failed else silver)[k] = failed or clean
        for reader, read in (("spark", lambda p, cs: _spark(spark, p, cs)), ("hudi-rs", _hudi_rs)):
            got = _keyed(read(main_path(name, root), columns[name]), t.key)
            wrong = {k: (got.get(k), want.get(k)) for k in want.keys() | got.keys() if got.get(k) != want.get(k)}
            assert not wrong, f"{reader} bronze/{name}: {len(wrong)} rows differ, e.g. {next(iter(wrong.items()))}"
            got = _keyed(read(silver_path(name, root), columns[name]), t.key)
            wrong = {k: (got.get(k), silver.get(k)) for k in silver.keys() | got.keys() if got.get(k) != silver.get(k)}
            assert not wrong, f"{reader} silver/{name}: {len(wrong)} rows differ, e.g. {next(iter(wrong.items()))}"
            if held:
                got = _keyed(read(quarantine_path(name, root), [*t.key, "failed_rule"]), t.key)
                assert {k: r["failed_rule"] for k, r in got.items()} == held, f"{reader} quarantine of {name}"
    assert len(expected["late_rows"]) >= 25  # with the rows it held before it was declared
    lake = Lake.at(root, spark).with_declaration(full)
    drifted = {n: r for n, r in _drift_behind_the_pipelines_back(spark, lake, real).items() if r.drift}
    _healed_through_the_stream(lake, real, drifted, declaration, tmp_path / "healing.log")


def _incremental_reads(bootstrap: str, topic: str) -> int:
    """How many records of `topic` are reads of an incremental snapshot (Debezium's `source.snapshot`)."""
    envelopes = [payload(r) for r in topic_records(bootstrap, [topic])]
    return sum(1 for e in envelopes if e is not None and e["source"].get("snapshot") == "incremental")


def _healed_through_the_stream(lake: Lake, real: RealSource, drifted: dict[str, Any], declaration: Path,
                               log_path: Path) -> None:
    """`reconcile --heal` on the drift the test made behind the pipeline's back and on the changes a publication
    edited by hand lost: the missing and changed keys read again by an incremental snapshot of just those keys,
    the extra key deleted by an event on its topic, all applied by the running stream (not by the heal), until
    reconcile finds each table exact and the source check no longer reports the gap."""
    from dataclasses import replace

    from pipelines.reconcile.compare import Options
    from pipelines.reconcile.heal import heal_table, wait_healed
    from pipelines.runtime.config import Loaded
    from pipelines.source.check import errors, run_check

    config = lake.config.model_copy(update={"kafka": lake.config.kafka.model_copy(
        update={"bootstrap_servers": real.bootstrap})})
    lake = replace(lake, loaded=Loaded(config))
    topics = {name: lake.declaration.topic(name) for name in [*drifted, "late_rows"]}
    with real.postgres.connect() as conn:
        conn.autocommit = True
        lost = _lost_to_retention(conn, real.bootstrap, topics["late_rows"])
    before = {name: _incremental_reads(real.bootstrap, t) for name, t in topics.items()}
    job = _start_ingest(lake.root, real.bootstrap, declaration, log_path, "--accept-lost")
    try:
        _wait(lambda: _batches(log_path) >= 1, "the stream", job, log_path)
        assert "accepted as lost (--accept-lost)" in log_path.read_text(errors="replace")
        with real.postgres.connect() as conn:
            conn.autocommit = True
            drifted = drifted | {"late_rows": _out_of_the_publication_a_while(lake, real, conn, (job, log_path),
                                                                              lost)}
            actions = [heal_table(lake, conn, drifted[name]) for name in topics if name != "late_rows"]
            _signals_of_two_keys(lake, conn, drifted["late_rows"])
            actions.append(heal_table(lake, conn, drifted["late_rows"]))
            assert [(a.snapshot, a.snapshot_keys, a.deletes) for a in actions] == \
                [("keys", 2, 1), ("keys", 2, 1), ("keys", 4, 1)], actions
            assert [len(a.signal_ids) for a in actions[:2]] == [1, 1] and len(actions[2].signal_ids) >= 2, \
                "late_rows' keys need two signals: the connector queues them, each key read once (below)"
            after = wait_healed(lake, conn, actions, Options(settle=2.0, rounds=2), timeout=240)
        assert all(a.healed for a in actions) and not any(r.drift for r in after), after
        assert errors(run_check(real.target(), lake.declaration, root=lake.root)) == []  # reconcile found it whole
        # Just the drifted keys were read again, not the tables.
        assert {n: _incremental_reads(real.bootstrap, t) - before[n] for n, t in topics.items()} \
            == {"all_types": 2, "orders_by_region": 2, "late_rows": 4}
        ControlFiles(lake.root).request_stop("test")
        assert job.wait(120) == 0, log_path.read_text(errors="replace")[-3000:]
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)


def _signals_of_two_keys(lake: Lake, conn: Any, report: Any) -> None:
    """The signal table's data column narrowed to what a signal of `report`'s first two keys takes, so that its
    heal, like one of hundreds of keys in a 2,048-character column, needs several signals."""
    from psycopg import sql

    from pipelines.reconcile.compare import source_columns
    from pipelines.reconcile.heal import key_signals
    from pipelines.source.catalog import pattern_of, split_name

    decl = lake.declaration.tables[report.table]
    columns = [c for c in source_columns(conn, decl.source) if c.name in decl.key]
    keys = [*report.keys["missing"], *report.keys["differ"]]
    (two,) = key_signals(conn, pattern_of(decl.source), columns, keys[:2], 1 << 20) or []
    # The signals already handled (the sync's snapshots) are history to Debezium, which reads signals from the WAL.
    conn.execute(sql.SQL("ALTER TABLE {t} ALTER COLUMN data TYPE varchar({n}) USING left(data, {n})").format(
        t=sql.Identifier(*split_name(lake.config.source.signal_table)), n=sql.Literal(len(two))))


def _lost_to_retention(conn: Any, bootstrap: str, topic: str) -> int:
    """A change of late_rows that reaches its topic while the stream is stopped, then every record of the topic
    deleted (what retention does to the log start): the key it changed."""
    from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        ends = consumer.end_offsets(parts)
        key = conn.execute("SELECT id FROM late_rows ORDER BY id OFFSET 4 LIMIT 1").fetchone()[0]
        conn.execute("UPDATE late_rows SET note = 'lost to retention' WHERE id = %s", (key,))
        _wait(lambda: sum(consumer.end_offsets(parts).values()) > sum(ends.values()), "the change in the topic")
        admin = KafkaAdminClient(bootstrap_servers=bootstrap)
        try:
            admin.delete_records(consumer.end_offsets(parts))
        finally:
            admin.close()
    finally:
        consumer.close()
    return key


def _out_of_the_publication_a_while(lake: Lake, real: RealSource, conn: Any, stream: tuple[subprocess.Popen, Path],
                                    lost: int) -> Any:
    """late_rows dropped from the publication by hand, changed (2 updates, a delete, an insert) and added back,
    while the stream runs: nothing fails, nothing of those changes reaches the topic. The source check names the
    gap (the lake remembered the table's membership when reconcile last found it exact); reconcile names the keys
    of each kind, `lost` (the key whose change retention deleted) among those that differ. The table's report,
    for the heal."""
    from pipelines.reconcile.compare import Options, reconcile_table
    from pipelines.source.check import errors, run_check

    job, log_path = stream
    ids = [r[0] for r in conn.execute("SELECT id FROM late_rows ORDER BY id LIMIT 4").fetchall()]
    new = conn.execute("SELECT max(id) + 1000 FROM late_rows").fetchone()[0]
    conn.execute("ALTER PUBLICATION shop_publication DROP TABLE public.late_rows")
    conn.execute("UPDATE late_rows SET note = 'changed while out' WHERE id = ANY(%s)", (ids[:2],))
    conn.execute("DELETE FROM late_rows WHERE id = %s", (ids[2],))
    conn.execute("INSERT INTO late_rows VALUES (%s, 'added while out', now())", (new,))
    conn.execute("ALTER PUBLICATION shop_publication ADD TABLE public.late_rows")
    conn.execute("UPDATE late_rows SET note = 'after it came back' WHERE id = %s", (ids[3],))
    bronze = main_path("late_rows", lake.root)

    def arrived() -> bool:
        rows = lake.spark.read.format("hudi").load(bronze).where(F.col("id") == ids[3]).collect()
        return bool(rows) and rows[0]["note"] == "after it came back"

    _wait(arrived, "the change made after late_rows came back", job, log_path)
    found = errors(run_check(real.target(), lake.declaration, root=lake.root))
    assert [(f.table, f.check) for f in found] == [("late_rows", "publication_gap")], found
    report = reconcile_table(lake, conn, "late_rows", Options(settle=2.0, rounds=2))
    assert report.counts == {"missing": 1, "extra": 1, "differ": 3, "unsettled": 0}, report
    assert (report.missing, report.extra) == ([{"id": str(new)}], [{"id": str(ids[2])}]), report
    assert sorted(d["key"]["id"] for d in report.differ) == sorted(str(i) for i in [*ids[:2], lost]), report
    return report


def _reconciled(lake: Lake, conn: Any, rounds: int) -> list[Any]:
    from pipelines.reconcile.compare import Options, reconcile_table

    return [reconcile_table(lake, conn, name, Options(settle=2.0, rounds=rounds)) for name in lake.declaration.names]


def _drift_behind_the_pipelines_back(spark: SparkSession, lake: Lake, real: RealSource) -> dict[str, Any]:
    """Rows of bronze changed, deleted and added by Hudi writes of the test's own (the stream and the source know
    nothing of them): reconcile names each key with its kind, and for a changed row the column."""
    from pipelines.lake.catalog import lake_table, writer_options

    tampered = {}
    for name, column in (("all_types", "label"), ("orders_by_region", "note")):
        path, key = main_path(name, lake.root), lake.declaration.tables[name].key
        rows = spark.read.format("hudi").load(path)
        rows = rows.drop(*[c for c in rows.columns if c.startswith("_hoodie_") and c != "_hoodie_is_deleted"])
        picked = rows.orderBy(*key).limit(3).collect()
        changed, gone, copied = (spark.createDataFrame([r], rows.schema) for r in picked)
        options = writer_options(lake_table(f"bronze/{name}", lake.declaration))
        changed = changed.withColumn(column, F.lit("changed behind its back")).withColumn("_lsn", F.col("_lsn") + 1)
        # Deleted as the pipeline deletes (the row flagged, at a later position): Hudi's own delete operation gives
        # the record an ordering value of another type than the stream's, which a later merge cannot compare.
        gone = gone.withColumn("_hoodie_is_deleted", F.lit(True)).withColumn("_lsn", F.col("_lsn") + 1)
        last = key[-1]
        copied = copied.withColumn(last, (F.col(last) + 10**9).cast(dict(rows.dtypes)[last]))
        for frame in (changed, copied, gone):
            frame.write.format("hudi").options(**options).option("hoodie.datasource.write.operation", "upsert") \
                .mode("append").save(path)
        tampered[name] = ({k: str(picked[0][k]) for k in key}, {k: str(picked[1][k]) for k in key},
                          {k: str(copied.first()[k]) for k in key}, column)
    with real.postgres.connect() as conn:
        reports = {r.table: r for r in _reconciled(lake, conn, rounds=0)}
    assert not reports["late_rows"].drift, reports["late_rows"]
    for name, (changed_key, gone_key, extra_key, column) in tampered.items():
        report = reports[name]
        assert report.drift and report.counts == {"missing": 1, "extra": 1, "differ": 1, "unsettled": 0}, report
        assert report.missing == [gone_key] and report.extra == [extra_key], report
        assert [d["key"] for d in report.differ] == [changed_key], report
        assert list(report.differ[0]["columns"]) == [column], report
        assert report.buckets_differing <= 3 and report.rows_read["source"] < report.source_rows, report
    return reports
