"""Bronze: Debezium change events from Kafka into Hudi MERGE_ON_READ tables.

Per source table there are two Hudi tables, and one dead-letter table for all:

- `bronze/<table>` (MOR): the live rows, one per primary key, as of the newest applied LSN.
- `bronze/_deletes/<table>` (COW), the *delete ledger*: for each key whose last applied
  event was a delete, that delete's LSN. A hard delete makes Hudi forget a key, and with
  it the LSN it was deleted at; without the ledger, an older insert replayed after a
  connector restart would bring the row back. The ledger is also how incremental readers
  (silver) learn about deletes, since a plain Hudi incremental query has no row for them.
- `bronze/_changelog/<table>` (COW, append-only): every change the job applied to main or
  the ledger, one row per key and batch, upserts and deletes alike. It is what incremental
  readers (silver, `lakehouse changes`) read: a commit adds new files only, so reading a
  window opens that window's files, where an incremental query of the merge-on-read main
  table merges whole file slices, about the whole table.
- `bronze/_dead_letters` (COW): every Kafka record that is not a usable envelope, with
  the reason, the raw key and value and its Kafka position, keyed by that position.

Ordering and exactly-once come from one rule applied to every micro-batch: per key,
keep the newest event of the batch (highest `source.lsn`), then write to each table only
what that table does not already reflect. Main gets an upsert when the event is newer
than both the live row and the ledger's delete; a delete goes to the ledger when it is
newer than the ledger's entry, and to main when main still holds an older row. What goes
to either is first appended to the change log (a write-ahead log: a crash after it
appends the same change again on the re-run, which readers fold away by LSN), then the
ledger is written, then main. Every write is therefore idempotent and computed from
what the tables hold, so a batch re-run after a crash at any point (Spark replays the
same offsets from its checkpoint) writes exactly what is still missing, and a replay of
old events changes nothing.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.storagelevel import StorageLevel

import hudi_configs
from pipelines import contract
from pipelines.erasure_registry import dead_letters_without_erased, read_registry, registry_path, without_erased
from pipelines.gdpr_request import erasure_key
from pipelines.hudi_timeline import latest_completion
from pipelines.settings import (
    INGEST_TRIGGER_SECONDS,
    changelog_path,
    dead_letter_path,
    ingest_checkpoint_path,
    kafka_bootstrap,
    lake_root,
    ledger_path,
    main_path,
)

log = logging.getLogger(__name__)

KEY = contract.PRIMARY_KEY
DELETED_FLAG = "_hoodie_is_deleted"
# CDC metadata kept on every bronze row (and ledger row).
META_COLUMNS = ("_op", "_lsn", "_source_ts", "_tx_id", "_kafka_partition", "_kafka_offset", "_kafka_ts",
                "_ingested_at")
LEDGER_COLUMNS = (KEY, "_lsn", "_source_ts", "_tx_id", "_kafka_partition", "_kafka_offset", "_kafka_ts",
                  "_ingested_at")
DEAD_LETTER_COLUMNS = ("position", "kafka_topic", "kafka_partition", "kafka_offset", "kafka_timestamp", "key",
                       "value", "reason", "batch_id", "ingested_at")
# Commit metadata (Hudi adds every write option starting with the commit-metadata prefix, "_").
BATCH_ID_META = "_lakehouse.batch_id"
OFFSETS_META = "_lakehouse.kafka_end_offsets"
# The erasure registry's version (completion time of its newest commit) the batch filtered
# with: an erasure finds the batches that may have read an older one (pipelines.gdpr).
REGISTRY_META = "_lakehouse.erasure_registry"


# --------------------------------------------------------------------------- parsing

_SOURCE = T.StructType([
    T.StructField("version", T.StringType()),
    T.StructField("connector", T.StringType()),
    T.StructField("name", T.StringType()),
    T.StructField("ts_ms", T.LongType()),
    T.StructField("snapshot", T.StringType()),
    T.StructField("db", T.StringType()),
    T.StructField("sequence", T.StringType()),
    T.StructField("schema", T.StringType()),
    T.StructField("table", T.StringType()),
    T.StructField("txId", T.LongType()),
    T.StructField("lsn", T.LongType()),
    T.StructField("xmin", T.LongType()),
])


def row_schema(table: str) -> T.StructType:
    """The `before`/`after` image: bigint columns as numbers, the rest kept as delivered (strings).

    Bronze mirrors the source as it arrived; typing and cleaning are silver's job, so a
    value silver will reject still lands here and can be traced back.
    """
    return T.StructType([
        T.StructField(c, T.LongType() if c in contract.BIGINT_COLUMNS[table] else T.StringType())
        for c in contract.COLUMNS[table]
    ])


def _envelope_fields(table: str) -> list[T.StructField]:
    return [
        T.StructField("before", row_schema(table)),
        T.StructField("after", row_schema(table)),
        T.StructField("source", _SOURCE),
        T.StructField("op", T.StringType()),
        T.StructField("ts_ms", T.LongType()),
    ]


def value_schema(table: str) -> T.StructType:
    """Both converter settings in one schema: the bare envelope, or `{"schema", "payload"}`."""
    return T.StructType([
        T.StructField("payload", T.StructType(_envelope_fields(table))),
        *_envelope_fields(table),
        T.StructField("_corrupt", T.StringType()),
    ])


def parse_events(raw: DataFrame, table: str) -> DataFrame:
    """Kafka records of one table's topic -> one row per record, classified.

    `kind` is `row` (a change with its image), `truncate`, `tombstone`, `ignored` (op=m)
    or `dead` (with `reason` and the raw `value`). Every input record yields exactly one
    output row, so nothing is dropped without a trace.
    """
    text = F.col("value").cast("string")
    parsed = F.from_json(text, value_schema(table),
                         {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt"})
    df = raw.select(
        F.col("topic").alias("kafka_topic"), F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"), F.col("timestamp").alias("kafka_timestamp"),
        "key", "value", text.alias("_text"), parsed.alias("_v"),
    )
    v = F.col("_v")
    bare = F.struct(*[v[f.name].alias(f.name) for f in _envelope_fields(table)])
    env = F.when(v["payload"].isNotNull(), v["payload"]).otherwise(bare)
    df = df.withColumn("_env", env)
    e = F.col("_env")
    op, lsn = e["op"], e["source"]["lsn"]
    image = F.when(op == "d", e["before"]).otherwise(e["after"])

    def dead(reason: Column) -> Column:
        return F.struct(F.lit("dead").alias("kind"), reason.alias("reason"))

    def ok(kind: str) -> Column:
        return F.struct(F.lit(kind).alias("kind"), F.lit(None).cast("string").alias("reason"))

    where = f"on topic {contract.topic(table)}"
    classified = (
        F.when(F.col("value").isNull(), ok("tombstone"))
        .when(F.encode(F.col("_text"), "UTF-8") != F.col("value"), dead(F.lit("value is not valid UTF-8 text")))
        .when(v.isNull() | v["_corrupt"].isNotNull(), dead(
            F.when(F.get_json_object("_text", "$").isNull(), F.lit("value is not valid JSON"))
            .when(~F.ltrim(F.col("_text")).startswith("{"),
                  F.lit("JSON value is not an object, so not a Debezium envelope"))
            .otherwise(F.lit(f"fields do not have the types of the {table} envelope "
                             "(bigint columns and source.lsn must be JSON numbers)"))))
        .when(op.isNull(), dead(F.lit("no 'op' field: not a Debezium envelope")))
        .when(~op.isin(*contract.ROW_OPS, *contract.OTHER_OPS),
              dead(F.concat(F.lit("unknown op '"), op, F.lit("'"))))
        .when(op == "m", ok("ignored"))
        .when(lsn.isNull(), dead(F.concat(F.lit("op="), op, F.lit(" without source.lsn"))))
        .when(e["source"]["table"].isNotNull() & (e["source"]["table"] != table),
              dead(F.concat(F.lit("event of table '"), e["source"]["table"], F.lit(f"' {where}"))))
        .when(op == "t", ok("truncate"))
        .when(image.isNull(), dead(F.concat(
            F.lit("op="), op, F.when(op == "d", F.lit(" without 'before'")).otherwise(F.lit(" without 'after'")))))
        .when(image[KEY].isNull(), dead(F.concat(
            F.lit("op="), op, F.when(op == "d", F.lit(" without before.id")).otherwise(F.lit(" without after.id")))))
        .otherwise(ok("row"))
    )
    columns = [F.col("_c.kind").alias("kind"), F.col("_c.reason").alias("reason"),
               op.alias("_op"), lsn.alias("_lsn"), F.timestamp_millis(e["source"]["ts_ms"]).alias("_source_ts"),
               e["source"]["txId"].alias("_tx_id")]
    columns += [image[c].alias(c) for c in contract.COLUMNS[table]]
    # The raw value is kept for dead letters only: the batch's parsed rows stay cached while
    # every table is written, and a wrapped envelope's value is mostly its schema (kilobytes).
    return df.withColumn("_c", classified).select(
        "kafka_topic", "kafka_partition", "kafka_offset", "kafka_timestamp", "key",
        F.when(F.col("_c.kind") == "dead", F.col("value")).alias("value"), *columns)


def dead_letters(events: DataFrame, batch_id: int) -> DataFrame:
    """The `dead` rows of parsed events, in the dead-letter table's shape."""
    return events.filter(F.col("kind") == "dead").select(
        F.concat_ws("/", "kafka_topic", "kafka_partition", "kafka_offset").alias("position"),
        "kafka_topic", "kafka_partition", "kafka_offset", "kafka_timestamp", "key", "value",
        F.concat(F.col("reason"), F.lit(" (at "), F.col("kafka_topic"), F.lit("/"), F.col("kafka_partition"),
                 F.lit("@"), F.col("kafka_offset"), F.lit(")")).alias("reason"),
        F.lit(batch_id).cast("long").alias("batch_id"), F.current_timestamp().alias("ingested_at"),
    )


# --------------------------------------------------------------------------- planning

def _change_rows(events: DataFrame, table: str) -> DataFrame:
    return events.filter(F.col("kind") == "row").select(
        *contract.COLUMNS[table], "_op", "_lsn", "_source_ts", "_tx_id",
        F.col("kafka_partition").alias("_kafka_partition"), F.col("kafka_offset").alias("_kafka_offset"),
        F.col("kafka_timestamp").alias("_kafka_ts"))


def truncate_deletes(events: DataFrame, main_state: DataFrame, table: str) -> DataFrame | None:
    """A truncate at LSN L, as deletes at L of every key that is older than L.

    Keys come from the table (all of them, so `main_state` must not be narrowed to the
    batch) and from the batch itself; the newest-event rule then lets a change newer
    than the truncate survive it. None when the batch has no truncate.
    """
    truncates = events.filter(F.col("kind") == "truncate")
    newest = truncates.orderBy(F.col("_lsn").desc()).limit(1).collect()
    if not newest:
        return None
    t = newest[0]
    keys = main_state.filter(F.col("_lsn") < t["_lsn"]).select(KEY).union(
        _change_rows(events, table).select(KEY)).distinct()
    return keys.select(
        KEY, *[F.lit(None).cast(row_schema(table)[c].dataType).alias(c) for c in contract.COLUMNS[table] if c != KEY],
        F.lit("d").alias("_op"), F.lit(t["_lsn"]).alias("_lsn"), F.lit(t["_source_ts"]).alias("_source_ts"),
        F.lit(t["_tx_id"]).cast("long").alias("_tx_id"), F.lit(t["kafka_partition"]).alias("_kafka_partition"),
        F.lit(t["kafka_offset"]).alias("_kafka_offset"), F.lit(t["kafka_timestamp"]).alias("_kafka_ts"),
    ).select(*contract.COLUMNS[table], "_op", "_lsn", "_source_ts", "_tx_id", "_kafka_partition",
             "_kafka_offset", "_kafka_ts")


def newest_per_key(changes: DataFrame) -> DataFrame:
    """One row per key: the highest LSN; for a re-delivered event, its first delivery.

    A struct max is one aggregation with no sort: fields compare left to right.
    """
    others = [c for c in changes.columns if c not in (KEY, "_lsn", "_kafka_offset")]
    best = F.max(F.struct(F.col("_lsn"), (-F.col("_kafka_offset")).alias("_neg_offset"), *others)).alias("_b")
    return changes.groupBy(KEY).agg(best).select(
        KEY, "_b._lsn", (-F.col("_b._neg_offset")).alias("_kafka_offset"), *[f"_b.{c}" for c in others])


def plan(newest: DataFrame, main_state: DataFrame, ledger_state: DataFrame) -> DataFrame:
    """Decide, per key, what each table still lacks: columns `to_main` and `to_ledger`.

    `main_state` and `ledger_state` are (id, _lsn) of what the tables hold. The rules
    (module docstring) only ever move a key forward in LSN, and a table that already
    reflects the event gets nothing.
    """
    m = F.coalesce(F.col("_m_lsn"), F.lit(-1))
    t = F.coalesce(F.col("_t_lsn"), F.lit(-1))
    lsn = F.col("_lsn")
    is_delete = F.col("_op") == "d"
    newest_delete = is_delete & (lsn > m) & (lsn >= t)
    joined = (newest
              .join(main_state.select(KEY, F.col("_lsn").alias("_m_lsn")), KEY, "left")
              .join(ledger_state.select(KEY, F.col("_lsn").alias("_t_lsn")), KEY, "left"))
    return joined.select(
        "*",
        ((~is_delete & (lsn > m) & (lsn > t)) | (newest_delete & F.col("_m_lsn").isNotNull())).alias("to_main"),
        (newest_delete & (lsn > t)).alias("to_ledger"),
    )


# --------------------------------------------------------------------------- writing

def hudi_options(part: str, name: str, **extra: str) -> dict[str, str]:
    opts = hudi_configs.writer("bronze", part)
    opts["hoodie.table.name"] = name
    opts.setdefault("hoodie.datasource.write.recordkey.field", KEY)
    opts.update(extra)
    return opts


def table_exists(spark: SparkSession, path: str) -> bool:
    jvm = spark.sparkContext._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(f"{path}/.hoodie/hoodie.properties")
    fs = hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    return bool(fs.exists(hadoop_path))


def read_state(spark: SparkSession, path: str) -> DataFrame:
    """(id, _lsn) of a bronze or ledger table; empty if the table does not exist yet."""
    if not table_exists(spark, path):
        return spark.createDataFrame([], T.StructType([T.StructField(KEY, T.LongType()),
                                                       T.StructField("_lsn", T.LongType())]))
    return spark.read.format("hudi").options(**hudi_configs.section("bronze", "state_read")).load(path) \
        .select(KEY, "_lsn")


_BATCH_LINE = re.compile(r"batch (\d+): (\d+) records in ([\d.]+)s")


@dataclass
class BatchReport:
    """What a batch did and where its time went (the phases are what tuning starts from)."""

    batch_id: int
    seconds: float = 0.0
    records: int = 0
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.monotonic() - started

    @classmethod
    def parse(cls, line: str) -> BatchReport | None:
        """The batch id, records, seconds and phases of a logged `line()`; None for any other log line."""
        found = _BATCH_LINE.search(line)
        if not found:
            return None
        timing = line.rsplit("| seconds: ", 1)[1].split() if "| seconds: " in line else []
        return cls(int(found[1]), float(found[3]), int(found[2]),
                   phases={k: float(v) for k, _, v in (item.partition("=") for item in timing)})

    def line(self) -> str:
        parts = [f"{t}: " + " ".join(f"{k}={v}" for k, v in sorted(c.items())) for t, c in self.counts.items()]
        timing = " ".join(f"{k}={v:.1f}" for k, v in self.phases.items())
        return (f"batch {self.batch_id}: {self.records} records in {self.seconds:.1f}s | " + " | ".join(parts)
                + f" | seconds: {timing}")


class BronzeBatchWriter:
    """The `foreachBatch` function of the ingest stream."""

    def __init__(self, spark: SparkSession, root: str) -> None:
        self.spark = spark
        self.root = root
        self._registry: tuple[DataFrame, str, str] | None = None

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        log.info("batch %d: started", batch_id)
        batch = batch.persist(StorageLevel.MEMORY_AND_DISK)
        report = BatchReport(batch_id)
        try:
            with report.phase("read"):
                offsets = self._end_offsets(batch)
            report.records = sum(n for *_, n in offsets)
            commit_meta = {BATCH_ID_META: str(batch_id), OFFSETS_META: json.dumps(
                {f"{t}/{p}": o + 1 for t, p, o, _ in offsets}, sort_keys=True)}
            with report.phase("registry"):
                erased = self._erased()
            if erased:
                commit_meta[REGISTRY_META] = erased[2]
            parsed = {t: parse_events(batch.filter(F.col("topic") == contract.topic(t)), t).persist(
                StorageLevel.MEMORY_AND_DISK) for t in contract.TABLES}
            try:
                with report.phase("parse+dead_letters"):
                    self._write_dead_letters(parsed, batch_id, commit_meta, report, erased)
                for table, events in parsed.items():
                    self._apply(table, events, commit_meta, report, erased)
            finally:
                for events in parsed.values():
                    events.unpersist()
        finally:
            batch.unpersist()
        report.seconds = time.monotonic() - started
        log.info(report.line())

    def _erased(self) -> tuple[DataFrame, str, str] | None:
        """The erasure registry, the key of its pseudonyms and the registry's version; None before any erasure.

        Looked up every batch (an erasure may have added to it), read again only when it changed.
        """
        path = registry_path(self.root)
        version = latest_completion(self.spark, path) if table_exists(self.spark, path) else None
        if version is None:
            return None
        if self._registry is None or self._registry[2] != version:
            self._registry = (read_registry(self.spark, self.root).localCheckpoint(), erasure_key(), version)
        return self._registry

    @staticmethod
    def _end_offsets(batch: DataFrame) -> list[tuple[str, int, int, int]]:
        """(topic, partition, last offset, records) of the batch: what it consumed."""
        rows = batch.groupBy("topic", "partition").agg(F.max("offset").alias("o"), F.count("*").alias("n"))
        return [(r["topic"], r["partition"], r["o"], r["n"]) for r in rows.collect()]

    def _write_dead_letters(self, parsed: dict[str, DataFrame], batch_id: int, meta: dict[str, str],
                            report: BatchReport, erased: tuple[DataFrame, str, str] | None) -> None:
        rows = None
        for events in parsed.values():
            d = dead_letters(events, batch_id)
            rows = d if rows is None else rows.unionByName(d)
        if erased is not None:  # a malformed record of an erased customer is not kept either
            rows = dead_letters_without_erased(rows, *erased[:2])
        rows = rows.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            n = rows.count()
            report.counts.setdefault("dead_letters", {})["written"] = n
            if n:
                rows.write.format("hudi").options(**hudi_options("dead_letters", "bronze_dead_letters", **meta)) \
                    .mode("append").save(dead_letter_path(self.root))
        finally:
            rows.unpersist()

    def _apply(self, table: str, events: DataFrame, meta: dict[str, str], report: BatchReport,
               erased: tuple[DataFrame, str, str] | None) -> None:
        counts = report.counts.setdefault(table, {})
        kinds = {r["kind"]: r["count"] for r in events.groupBy("kind").count().collect()}
        for kind in ("tombstone", "ignored", "truncate", "dead"):
            if kinds.get(kind):
                counts[kind] = kinds[kind]
        if not kinds.get("row") and not kinds.get("truncate"):
            return
        main, ledger = main_path(table, self.root), ledger_path(table, self.root)
        main_state = read_state(self.spark, main)
        changes = _change_rows(events, table)
        if erased is not None:  # events of erased customers and their orders never reach the lake again
            changes = without_erased(changes, table, *erased[:2])
        synthetic = truncate_deletes(events, main_state, table) if kinds.get("truncate") else None
        if synthetic is not None:
            changes = changes.unionByName(synthetic)
        planned = plan(newest_per_key(changes), main_state, read_state(self.spark, ledger)).persist(
            StorageLevel.MEMORY_AND_DISK)
        try:
            with report.phase(f"{table}.plan"):
                tally = planned.groupBy("to_main", "to_ledger", "_op").count().collect()
            for r in tally:
                outcome = ("stale" if not (r["to_main"] or r["to_ledger"])
                           else "delete" if r["_op"] == "d" else "upsert")
                counts[outcome] = counts.get(outcome, 0) + r["count"]
            # One instant for the batch's three writes: a key's change-log row and its bronze
            # row say the same about when it was ingested.
            now = F.lit(datetime.now(UTC)).cast("timestamp").alias("_ingested_at")
            def save(rows: DataFrame, part: str, name: str, path: str) -> None:
                with report.phase(f"{table}.{part}"):
                    rows.write.format("hudi").options(**hudi_options(part, name, **meta)).mode("append").save(path)

            if any(r["to_main"] or r["to_ledger"] for r in tally):
                save(planned.filter("to_main OR to_ledger").select(
                    *contract.COLUMNS[table], *[c for c in META_COLUMNS if c != "_ingested_at"], now,
                    F.date_format(now, "yyyy-MM-dd").alias("_ingest_date"),
                ), "changelog", f"bronze_changelog_{table}", changelog_path(table, self.root))
            if any(r["to_ledger"] for r in tally):
                save(planned.filter("to_ledger").select(*[c for c in LEDGER_COLUMNS if c != "_ingested_at"], now),
                     "ledger", f"bronze_deletes_{table}", ledger)
            if any(r["to_main"] for r in tally):
                save(planned.filter("to_main").select(
                    *contract.COLUMNS[table], *[c for c in META_COLUMNS if c != "_ingested_at"], now,
                    (F.col("_op") == "d").alias(DELETED_FLAG),
                ), "table", f"bronze_{table}", main)
        finally:
            planned.unpersist()


# --------------------------------------------------------------------------- the stream

def kafka_stream(spark: SparkSession, bootstrap: str, tables: tuple[str, ...] = contract.TABLES) -> DataFrame:
    """The source topics of `tables` as a stream, with bronze.toml's Kafka options (also the benchmarks' readers)."""
    return (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", ",".join(contract.topic(t) for t in tables))
            .options(**hudi_configs.section("bronze", "kafka")))


def run_ingest(*, once: bool, root: str | None = None, bootstrap: str | None = None,
               trigger_seconds: float = INGEST_TRIGGER_SECONDS, max_offsets_per_trigger: int | None = None,
               spark: SparkSession | None = None) -> None:
    """Run the ingest stream: until caught up with what was on the topics at start (`once`), or forever.

    Offsets are tracked by Structured Streaming in a checkpoint under the lake root; the
    batch id and the Kafka end offsets also go into each Hudi commit's metadata, so the
    table itself tells what it contains.
    """
    from pipelines.spark import get_spark

    root = root or lake_root()
    spark = spark or get_spark("lakehouse-ingest")
    reader = kafka_stream(spark, bootstrap or kafka_bootstrap())
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    writer = (reader.load().writeStream.queryName("bronze_ingest")
              .foreachBatch(BronzeBatchWriter(spark, root))
              .option("checkpointLocation", ingest_checkpoint_path(root)))
    writer = writer.trigger(availableNow=True) if once else writer.trigger(processingTime=f"{trigger_seconds} seconds")
    query = writer.start()
    try:
        query.awaitTermination()
    finally:
        if query.isActive:
            query.stop()
