"""Bronze: Debezium change events from Kafka into Hudi MERGE_ON_READ tables.

Per source table:

- `bronze/<table>` (MOR): the live rows, one per primary key, as of the newest applied LSN.
- `bronze/_changelog/<table>` (COW, append-only): every change the job applied, one row per
  key and batch, upserts and deletes alike. It is what incremental readers (silver,
  `lakehouse changes`) read: a commit adds new files only, so reading a window opens that
  window's files, where an incremental query of the merge-on-read main table merges whole
  file slices. It is also the job's write-ahead log and, for the days it retains, its
  memory of deletes.
- `bronze/_deletes/<table>` (COW), the *delete ledger*: the newest delete per key of the
  change-log days that table services expired. A hard delete makes Hudi forget a key, and
  with it the LSN it was deleted at; without that memory an older insert replayed after a
  connector restart would bring the row back. The ledger is written only when days expire
  (`pipelines.services.table_services`), never by a batch.

and `bronze/_dead_letters` (COW) for all: every Kafka record that is not a usable
envelope, with the reason, the raw key and value and its Kafka position, keyed by that
position.

A batch makes at most two commits per source table it changes (change log, then main) and
one to the dead-letter store when it has malformed records; the tables' commits run side by
side (`_run_together`). Ordering and exactly-once
come from one rule: per key, keep the newest event of the batch (highest `source.lsn`),
then apply it only if it is newer than everything applied for the key, live row or
delete (main's row, the change log's deletes, the ledger). What is applied goes first
to the change log (a crash after it appends the same change again on the re-run, which
readers fold away by LSN), then to main, where Hudi's own ordering on `_lsn` is a second
line of defence. Every write is computed from what the tables hold, so a batch re-run
after a crash at any point writes exactly what is still missing, and a replay of old
events changes nothing.

What the tables hold is read once per stream, at its first batch (main's `(id, _lsn)`,
the change log's deletes, the ledger), and then kept up to date by the writer's own
commits (`KnownRows`): a batch looks up its own keys in those cached rows and reads no
table, so its cost follows the batch, not the table. A restarted process reads afresh,
which is what makes a crash between two commits safe.

Shape: a row image is parsed as a map (column -> JSON text), and the table's columns follow the
source's (pipelines.ingest.schema): per batch, one aggregation over the cached records finds shapes
not seen before; a column added in the source is appended to the table (Hudi's schema evolution on
write), a widened type widens it, a dropped one stays null, and events of a shape that cannot be
applied (a contract column gone, a type narrowed) become dead letters with a `schema:` reason,
holding only that table. An update's placeholder for an unchanged TOASTed value is replaced by
the value the source still holds (`_fill_unavailable`).

Progress lives in the tables' own commits: each carries the stream's Kafka position after
its batch (`_lakehouse.kafka_positions`). A replayed batch that main already covers is
skipped without reading anything, and a lost Spark checkpoint resumes each topic from the
position in its main table's newest commit (`starting_offsets`).
"""

from __future__ import annotations

import functools
import json
import logging
import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming import StreamingQuery
from pyspark.storagelevel import StorageLevel

import hudi_configs
from pipelines import contract, storage
from pipelines.gdpr.registry import dead_letters_without_erased, read_registry, registry_path, without_erased
from pipelines.gdpr.request import erasure_key
from pipelines.hudi_timeline import latest_completion, latest_meta, repair_torn_timeline
from pipelines.ingest.schema import COLUMNS_META, SCHEMA_REASON, Shape, decide, infer_type, read_accepted
from pipelines.ingest.stream import STOP_REQUEST, StreamLease
from pipelines.settings import (
    INGEST_TRIGGER_SECONDS,
    changelog_path,
    dead_letter_path,
    ingest_checkpoint_path,
    kafka_bootstrap,
    lake_root,
    ledger_path,
    main_path,
    unavailable_placeholder,
)
from pipelines.table_stats import exists as has_completed_commit

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
# The stream's Kafka position after the batch, {"topic/partition": next offset}, for every
# partition the stream has consumed from: where a lost checkpoint resumes.
POSITIONS_META = "_lakehouse.kafka_positions"
# The erasure registry's version (completion time of its newest commit) the batch filtered
# with: an erasure finds the batches that may have read an older one (pipelines.gdpr.erase).
REGISTRY_META = "_lakehouse.erasure_registry"
# Hashes of the Kafka Connect schemas (schemas.enable=true; xxhash64 of the schema's JSON text) whose
# row shapes the table has applied: a record of one of them needs no schema decision (`parse_events`).
# Hashes written by an older parser match nothing and cost one decision, which changes nothing.
DECLARED_META = "_lakehouse.declared_shapes"


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


# A row image as column name -> the value's JSON text (strings unquoted): every column the
# source sends is kept, including those added after the table was created (pipelines.ingest.schema).
_IMAGE = T.MapType(T.StringType(), T.StringType())


def _envelope_fields() -> list[T.StructField]:
    return [
        T.StructField("before", _IMAGE),
        T.StructField("after", _IMAGE),
        T.StructField("source", _SOURCE),
        T.StructField("op", T.StringType()),
        T.StructField("ts_ms", T.LongType()),
    ]


def value_schema() -> T.StructType:
    """Both converter settings in one schema: the bare envelope, or `{"schema", "payload"}`."""
    return T.StructType([
        # A Kafka Connect schema (`schemas.enable=true`) as its JSON text: it is the same for every
        # record of a shape, so a batch hashes it and reads `after`'s fields from one record per
        # new hash (`BronzeBatchWriter._declared_fields`); parsed into arrays for every record, it
        # was most of the cost of parsing a backlog.
        T.StructField("schema", T.StringType()),
        T.StructField("payload", T.StructType(_envelope_fields())),
        *_envelope_fields(),
        T.StructField("_corrupt", T.StringType()),
    ])


def _literal_array(values: list[str] | tuple[str, ...]) -> Column:
    return F.array(*[F.lit(v) for v in values]) if values else F.array().cast("array<string>")


def parse_events(raw: DataFrame, table: str, shape: Shape | None = None, known_declared: tuple[int, ...] = (),
                 placeholder: str | None = None) -> DataFrame:
    """Kafka records of one table's topic -> one row per record, classified.

    `kind` is `row` (a change with its image), `truncate`, `tombstone`, `ignored` (op=m)
    or `dead` (with `reason` and the raw `value`). Every input record yields exactly one
    output row, so nothing is dropped without a trace.

    The image is kept as a map (`_image`); `image_columns` types it by the table's shape. Beside
    it, what the schema decision needs (pipelines.ingest.schema), empty for a record of a known
    shape: `_decl_hash` (of the Connect schema's text, for a wrapped record), `_decl_new` (true when
    that hash is not in `known_declared`),
    `_new_keys` (columns not in `shape`), `_missing` (contract columns absent from a bare
    `after`), `_badcast` (bare values that do not fit their column's type), `_toast` (columns
    carrying the unavailable-value `placeholder`). The raw value is kept for dead letters and
    for records of an unknown shape (they may be held).
    """
    shape = shape or Shape.initial(table)
    placeholder = placeholder or unavailable_placeholder()
    text = F.col("value").cast("string")
    parsed = F.from_json(text, value_schema(), {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt"})
    df = raw.select(
        F.col("topic").alias("kafka_topic"), F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"), F.col("timestamp").alias("kafka_timestamp"),
        "key", "value", text.alias("_text"), parsed.alias("_v"),
    )
    v = F.col("_v")
    bare = F.struct(*[v[f.name].alias(f.name) for f in _envelope_fields()])
    env = F.when(v["payload"].isNotNull(), v["payload"]).otherwise(bare)
    df = df.withColumn("_env", env)
    e = F.col("_env")
    op, lsn = e["op"], e["source"]["lsn"]
    image = F.when(op == "d", e["before"]).otherwise(e["after"])
    key_text = image[KEY]

    def dead(reason: Column) -> Column:
        return F.struct(F.lit("dead").alias("kind"), reason.alias("reason"))

    def ok(kind: str) -> Column:
        return F.struct(F.lit(kind).alias("kind"), F.lit(None).cast("string").alias("reason"))

    def not_bigint(c: str) -> Column:
        return image[c].isNotNull() & image[c].cast("bigint").isNull()

    where = f"on topic {contract.topic(table)}"
    mistyped = functools.reduce(lambda a, b: a | b, [not_bigint(c) for c in sorted(contract.BIGINT_COLUMNS[table])])
    classified = (
        F.when(F.col("value").isNull(), ok("tombstone"))
        .when(F.encode(F.col("_text"), "UTF-8") != F.col("value"), dead(F.lit("value is not valid UTF-8 text")))
        .when(v.isNull() | v["_corrupt"].isNotNull(), dead(
            F.when(F.get_json_object("_text", "$").isNull(), F.lit("value is not valid JSON"))
            .when(~F.ltrim(F.col("_text")).startswith("{"),
                  F.lit("JSON value is not an object, so not a Debezium envelope"))
            .otherwise(F.lit(f"fields do not have the types of the {table} envelope "
                             "(row images must be objects and source.lsn a JSON number)"))))
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
        .when(key_text.isNull(), dead(F.concat(
            F.lit("op="), op, F.when(op == "d", F.lit(" without before.id")).otherwise(F.lit(" without after.id")))))
        .when(mistyped, dead(F.lit(f"fields do not have the types of the {table} envelope "
                                   f"({', '.join(sorted(contract.BIGINT_COLUMNS[table]))} must be JSON integers)")))
        .otherwise(ok("row"))
    )
    is_row = F.col("_c.kind") == "row"
    upsert = is_row & (op != "d")
    connect_schema = v["schema"]  # its JSON text; null for a bare envelope
    decl_hash = F.xxhash64(connect_schema)
    unknown_shape = connect_schema.isNotNull() & ~decl_hash.isin(*known_declared) if known_declared \
        else connect_schema.isNotNull()
    empty = F.array().cast("array<string>")
    # An image whose columns are the shape's, in its order (nearly every record), has nothing new and
    # lacks nothing: one array comparison instead of two set differences per record.
    as_shape = F.map_keys(image) == _literal_array(list(shape.columns))
    new_keys = F.when(is_row & ~as_shape, F.array_except(F.map_keys(image), _literal_array(list(shape.columns)))) \
        .otherwise(empty)
    missing = F.when(upsert & connect_schema.isNull() & ~as_shape, F.array_except(
        _literal_array(contract.COLUMNS[table]), F.map_keys(image))).otherwise(empty)
    typed = [c for c in shape.extras if shape.columns[c].type != "string"]
    badcast = F.when(is_row & connect_schema.isNull(), F.array_compact(F.array(*[
        F.when(image[c].isNotNull() & image[c].cast(shape.columns[c].type).isNull(), F.lit(c)) for c in typed
    ]))).otherwise(empty) if typed else empty
    toast = F.when(upsert & F.col("_text").contains(placeholder),
                   F.map_keys(F.map_filter(image, lambda _, x: x == placeholder))).otherwise(empty)
    df = df.withColumn("_c", classified).select(
        "*", F.when(is_row & unknown_shape, F.lit(True)).alias("_decl_new"),
        F.when(is_row & connect_schema.isNotNull(), decl_hash).alias("_decl_hash"),
        new_keys.alias("_new_keys"), missing.alias("_missing"), badcast.alias("_badcast"), toast.alias("_toast"))
    odd = F.col("_decl_new").isNotNull() | (F.size("_new_keys") > 0) | (F.size("_missing") > 0) | \
        (F.size("_badcast") > 0)
    columns = [F.col("_c.kind").alias("kind"), F.col("_c.reason").alias("reason"),
               op.alias("_op"), lsn.alias("_lsn"), F.timestamp_millis(e["source"]["ts_ms"]).alias("_source_ts"),
               e["source"]["txId"].alias("_tx_id"), image.alias("_image")]
    # The raw value is kept for dead letters (and records that may become one) only: the batch's
    # parsed rows stay cached while every table is written, and a wrapped envelope's value is
    # mostly its schema (kilobytes).
    return df.select(
        "kafka_topic", "kafka_partition", "kafka_offset", "kafka_timestamp", "key",
        F.when((F.col("_c.kind") == "dead") | odd, F.col("value")).alias("value"), *columns,
        "_decl_new", "_decl_hash", "_new_keys", "_missing", "_badcast", "_toast")


def image_columns(shape: Shape) -> list[Column]:
    """The image's values as the shape's typed columns (a column the image lacks: null)."""
    return [(F.col("_image")[c] if col.type == "string" else F.col("_image")[c].cast(col.type)).alias(c)
            for c, col in shape.columns.items()]


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

def _change_rows(events: DataFrame, table: str, shape: Shape | None = None) -> DataFrame:
    shape = shape or Shape.initial(table)
    return events.filter(F.col("kind") == "row").select(
        *image_columns(shape), "_op", "_lsn", "_source_ts", "_tx_id",
        F.col("kafka_partition").alias("_kafka_partition"), F.col("kafka_offset").alias("_kafka_offset"),
        F.col("kafka_timestamp").alias("_kafka_ts"))


def truncate_deletes(events: DataFrame, main_state: DataFrame, shape: Shape) -> DataFrame | None:
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
    columns = shape.types()
    keys = main_state.filter(F.col("_lsn") < t["_lsn"]).select(KEY).union(
        _change_rows(events, shape.table, shape).select(KEY)).distinct()
    return keys.select(
        KEY, *[F.lit(None).cast(kind).alias(c) for c, kind in columns.items() if c != KEY],
        F.lit("d").alias("_op"), F.lit(t["_lsn"]).alias("_lsn"), F.lit(t["_source_ts"]).alias("_source_ts"),
        F.lit(t["_tx_id"]).cast("long").alias("_tx_id"), F.lit(t["kafka_partition"]).alias("_kafka_partition"),
        F.lit(t["kafka_offset"]).alias("_kafka_offset"), F.lit(t["kafka_timestamp"]).alias("_kafka_ts"),
    ).select(*columns, "_op", "_lsn", "_source_ts", "_tx_id", "_kafka_partition", "_kafka_offset", "_kafka_ts")


def union_all(frames: list[DataFrame]) -> DataFrame:
    """The rows of all `frames`, matched by column name."""
    return functools.reduce(DataFrame.unionByName, frames)


def newest_per_key(changes: DataFrame) -> DataFrame:
    """One row per key: the highest LSN; for a re-delivered event, its first delivery.

    A struct max is one aggregation with no sort: fields compare left to right.
    """
    others = [c for c in changes.columns if c not in (KEY, "_lsn", "_kafka_offset")]
    best = F.max(F.struct(F.col("_lsn"), (-F.col("_kafka_offset")).alias("_neg_offset"), *others)).alias("_b")
    return changes.groupBy(KEY).agg(best).select(
        KEY, "_b._lsn", (-F.col("_b._neg_offset")).alias("_kafka_offset"), *[f"_b.{c}" for c in others])


def plan(newest: DataFrame, main_state: DataFrame, delete_state: DataFrame) -> DataFrame:
    """Decide, per key, what the tables still lack: columns `to_main` and `to_log`.

    `main_state` is (id, _lsn) of main's live rows, `delete_state` (id, _lsn) of the deletes
    applied (change log and ledger; several per key allowed). An event is applied when it
    is newer than both; a delete reaches main only while main holds an older row. The rules
    only ever move a key forward in LSN, so a table that already reflects the event gets
    nothing. A delete equal to the newest known one is still sent to a main that holds an
    older row: that is a batch re-run after its change-log commit and before main's.
    """
    deletes = delete_state.groupBy(KEY).agg(F.max("_lsn").alias("_t_lsn"))
    m = F.coalesce(F.col("_m_lsn"), F.lit(-1))
    t = F.coalesce(F.col("_t_lsn"), F.lit(-1))
    lsn = F.col("_lsn")
    is_delete = F.col("_op") == "d"
    upsert = ~is_delete & (lsn > m) & (lsn > t)
    joined = (newest
              .join(main_state.select(KEY, F.col("_lsn").alias("_m_lsn")), KEY, "left")
              .join(deletes, KEY, "left"))
    to_main = upsert | (is_delete & (lsn > m) & (lsn >= t) & F.col("_m_lsn").isNotNull())
    new_delete = is_delete & (lsn > m) & (lsn > t)
    return joined.select("*", to_main.alias("to_main"), (to_main | new_delete).alias("to_log"))


# --------------------------------------------------------------------------- writing

def hudi_options(part: str, name: str, **extra: str) -> dict[str, str]:
    opts = hudi_configs.writer("bronze", part)
    opts["hoodie.table.name"] = name
    opts.setdefault("hoodie.datasource.write.recordkey.field", KEY)
    opts.update(extra)
    return opts


def has_commits(spark: SparkSession, path: str) -> bool:
    """A table with a completed commit. A first commit that never completed (a crash) leaves
    `.hoodie/` and `hoodie.properties` but nothing to read: such a table is not there yet,
    and its next write rolls the failed one back."""
    jvm = spark.sparkContext._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(f"{path}/.hoodie/hoodie.properties")
    fs = hadoop_path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    return bool(fs.exists(hadoop_path)) and latest_completion(spark, path) is not None


def discard_unborn(path: str) -> None:
    """Remove a table whose creation a crash cut short: `.hoodie/` there, but no `hoodie.properties`
    (nor Hudi's `.backup` of it) naming the table. Hudi creates the folders, then writes the
    properties file, then the first instant; a SIGKILL in between (both were seen in the suite:
    the folders without the file, and an empty file) leaves a table Hudi can neither load, nor
    write to, nor roll back, and every later ingest failed on it. Such a table holds nothing
    committed. One with a completed commit is never removed: its properties went missing some
    other way, and Hudi's own error says so.
    """
    meta = f"{path}/.hoodie"
    names = storage.list_dir(meta)
    if not names:
        return
    for name in ("hoodie.properties", "hoodie.properties.backup"):
        if name in names and "hoodie.table.name=" in storage.read_text(f"{meta}/{name}"):
            return
    if has_completed_commit(path):
        log.error("%s: hoodie.properties is missing or incomplete, yet the table has completed commits", path)
        return
    log.warning("%s: its creation was cut short (no complete hoodie.properties); removed, to be created again", path)
    storage.remove_tree(path)


_STATE = T.StructType([T.StructField(KEY, T.LongType()), T.StructField("_lsn", T.LongType())])


def read_state(spark: SparkSession, path: str) -> DataFrame:
    """(id, _lsn) of every row of a bronze table; empty if the table has no commit yet."""
    if not has_commits(spark, path):
        return spark.createDataFrame([], _STATE)
    return spark.read.format("hudi").options(**hudi_configs.section("bronze", "state_read")).load(path) \
        .select(KEY, "_lsn")


def read_deletes(spark: SparkSession, table: str, root: str) -> DataFrame:
    """(id, _lsn) of every delete applied to `table`: the change log's and the ledger's (a key may repeat).

    The change log is read first and at once: expiry writes a day's deletes to the ledger and
    only then drops the day, so a ledger read after the change-log read misses nothing.
    """
    path = changelog_path(table, root)
    if has_commits(spark, path):
        log_deletes = spark.read.format("hudi").options(**hudi_configs.section("bronze", "state_read")) \
            .load(path).filter(F.col("_op") == "d").select(KEY, "_lsn").localCheckpoint()
    else:
        log_deletes = spark.createDataFrame([], _STATE)
    return log_deletes.unionByName(read_state(spark, ledger_path(table, root)))


def positions_of(spark: SparkSession, path: str) -> dict[str, int]:
    """The Kafka position recorded by the newest ingest commit of `path` ({} if none)."""
    if not has_commits(spark, path):
        return {}
    found = latest_meta(spark, path, POSITIONS_META)
    return json.loads(found) if found else {}


class KnownRows:
    """Rows of (id, _lsn, ...) one table's writer knows: read from the tables once, then grown by its own batches.

    The stream is the only writer that adds to what main and the change log hold (erasure only
    takes keys away, and those never return: their events are filtered out before planning),
    so what it read at start plus what it wrote since is exact. A batch then looks up only its
    own keys, in cached rows (a broadcast semi-join: no Hudi read, no shuffle of the table),
    where reading main's `(id, _lsn)` every batch merged every file slice of the table: that
    plan phase grew from 4.5 s to 9.0 s between 20k and 463k rows (issue 16).

    `fold` turns rows into what the plan compares with (the newest per key); it also merges the
    pieces into one when a long-running stream has added many.
    """

    MAX_PIECES = 32

    def __init__(self, load: Callable[[], DataFrame], fold: Callable[[DataFrame], DataFrame]) -> None:
        self._load = load
        self._fold = fold
        self._pieces: list[DataFrame] | None = None

    @property
    def loaded(self) -> bool:
        return self._pieces is not None

    def load(self) -> None:
        """Read the tables now (the stream's first batch of the table pays for it, once)."""
        self._rows()

    def all(self) -> DataFrame:
        """Every known row, folded."""
        return self._fold(self._rows())

    def lookup(self, keys: DataFrame) -> DataFrame:
        """The known rows of `keys` (a frame of one column, the key), folded."""
        return self._fold(self._rows().join(F.broadcast(keys), KEY, "left_semi"))

    def add(self, rows: DataFrame) -> None:
        """Rows this writer has just committed (materialized now: `rows` may derive from a cache about to go)."""
        self._rows()
        assert self._pieces is not None
        self._pieces.append(rows.localCheckpoint())
        if len(self._pieces) > self.MAX_PIECES:
            self._pieces = [self._fold(union_all(self._pieces)).localCheckpoint()]

    def _rows(self) -> DataFrame:
        if self._pieces is None:
            self._pieces = [self._load().localCheckpoint()]
        return union_all(self._pieces)


def live_rows(rows: DataFrame) -> DataFrame:
    """(id, _lsn, _live) rows -> those of the keys whose newest row is live: what main holds."""
    newest = rows.groupBy(KEY).agg(F.max_by(F.struct("_lsn", "_live"), F.col("_lsn")).alias("_n"))
    return newest.filter("_n._live").select(KEY, F.col("_n._lsn").alias("_lsn"), F.lit(True).alias("_live"))


def newest_deletes(rows: DataFrame) -> DataFrame:
    """(id, _lsn) deletes -> the newest per key (what the plan compares with)."""
    return rows.groupBy(KEY).agg(F.max("_lsn").alias("_lsn"))


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


def _run_together(jobs: list[Callable[[], None]], *, parallel: bool = True) -> None:
    """Run `jobs` in threads of their own; when all are done, raise the first failure.

    Each source table's commits (change log, then main) and the dead letters' are independent
    Hudi tables, and most of a commit's time is single-threaded driver work (timeline, metadata
    table, markers; `lakehouse bench commits`): one table's commit path runs while the other's
    tasks use the cores. A crash leaves some of them committed and others not, which the re-run
    handles table by table (each commit records the positions it covers).
    """
    if len(jobs) <= 1 or not parallel:
        for job in jobs:
            job()
        return
    with ThreadPoolExecutor(max_workers=len(jobs), thread_name_prefix="bronze-table") as pool:
        futures = [pool.submit(job) for job in jobs]
    errors = [e for f in futures if (e := f.exception()) is not None]
    if errors:
        raise errors[0]


class BronzeBatchWriter:
    """The `foreachBatch` function of the ingest stream."""

    def __init__(self, spark: SparkSession, root: str, *, parallel: bool = True) -> None:
        self.spark = spark
        self.root = root
        # The tables' commits side by side (`_run_together`); False only for a benchmark's reference.
        self.parallel = parallel
        self._registry: tuple[DataFrame, str, str] | None = None
        # The stream's position, and each table's, as its newest commit records them (read
        # once, then kept up to date by this writer's own commits).
        self._position: dict[str, int] | None = None
        self._applied: dict[str, dict[str, int]] = {}
        # Per table, what main holds (id, _lsn, _live) and every delete applied (id, _lsn):
        # read once, then kept up to date by this writer's own commits (KnownRows).
        self._main: dict[str, KnownRows] = {}
        self._deletes: dict[str, KnownRows] = {}
        # Per table, its shape (columns, pipelines.ingest.schema) and the hashes of the declared
        # shapes already applied: read from main's newest commit once, then kept by this writer.
        self._shapes: dict[str, Shape] = {}
        self._declared: dict[str, set[int]] = {}
        self.placeholder = unavailable_placeholder()
        # Only this writer creates these tables (one stream per lake): an unborn one is a crash's.
        for path in [*(f(t, root) for t in contract.TABLES for f in (main_path, changelog_path)),
                     dead_letter_path(root)]:
            discard_unborn(path)
            repair_torn_timeline(path)

    def _positions(self, path: str) -> dict[str, int]:
        if path not in self._applied:
            self._applied[path] = positions_of(self.spark, path)
        return self._applied[path]

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        log.info("batch %d: started", batch_id)
        report = BatchReport(batch_id)
        # Each table's records parsed once and cached while its tables are written; the raw batch
        # is not cached (a wrapped envelope is kilobytes of schema, parsed away here).
        shapes = {t: self._shape(t) for t in contract.TABLES}
        parsed = {t: parse_events(batch.filter(F.col("topic") == contract.topic(t)), t, shapes[t],
                                  tuple(sorted(self._declared[t])), self.placeholder).persist(
            StorageLevel.MEMORY_AND_DISK) for t in contract.TABLES}
        cached = list(parsed.values())
        try:
            with report.phase("read+parse"):
                offsets = self._end_offsets(union_all([
                    events.select(F.col("kafka_topic").alias("topic"), F.col("kafka_partition").alias("partition"),
                                  F.col("kafka_offset").alias("offset")) for events in parsed.values()]))
            report.records = sum(n for *_, n in offsets)
            ends = {f"{t}/{p}": o + 1 for t, p, o, _ in offsets}
            if self._position is None:
                self._position = {}
                for path in [main_path(t, self.root) for t in contract.TABLES] + [dead_letter_path(self.root)]:
                    for tp, o in self._positions(path).items():
                        self._position[tp] = max(self._position.get(tp, 0), o)
            position = {tp: max(self._position.get(tp, 0), ends.get(tp, 0)) for tp in {*self._position, *ends}}
            commit_meta = {BATCH_ID_META: str(batch_id), POSITIONS_META: json.dumps(position, sort_keys=True)}
            with report.phase("registry"):
                erased = self._erased()
            if erased:
                commit_meta[REGISTRY_META] = erased[2]
            surveys: dict[str, Survey] = {}
            with report.phase("schema"):
                accepted = read_accepted(self.root)
                for table in contract.TABLES:
                    surveys[table] = self._survey(table, parsed[table], accepted, batch_id)
                    parsed[table] = surveys[table].events
            jobs: list[Callable[[], None]] = []
            if not self._covered(dead_letter_path(self.root), ends):
                jobs.append(functools.partial(self._write_dead_letters, parsed, batch_id, commit_meta, report, erased))
            for table, events in parsed.items():
                mine = {tp: o for tp, o in ends.items() if tp.startswith(contract.topic(table) + "/")}
                if mine and self._covered(main_path(table, self.root), mine):
                    report.counts[table] = {"already_applied": sum(n for t, _, _, n in offsets
                                                                   if t == contract.topic(table))}
                    continue
                jobs.append(functools.partial(self._apply, table, events, surveys[table], commit_meta, report, erased))
            with report.phase("tables"):
                _run_together(jobs, parallel=self.parallel)
            self._position = position
            for table, survey in surveys.items():
                self._declared[table] |= survey.applied_declared
        finally:
            for events in cached:
                events.unpersist()
        report.seconds = time.monotonic() - started
        log.info(report.line())

    def _known(self, table: str) -> tuple[KnownRows, KnownRows]:
        """What main holds and the deletes applied, for `table`."""
        if table not in self._main:
            main = main_path(table, self.root)
            self._main[table] = KnownRows(
                lambda: read_state(self.spark, main).withColumn("_live", F.lit(True)), live_rows)
            self._deletes[table] = KnownRows(lambda: read_deletes(self.spark, table, self.root), newest_deletes)
        return self._main[table], self._deletes[table]

    def _covered(self, path: str, ends: dict[str, int]) -> bool:
        """True when the newest commit of `path` was made at or after these end offsets: a replayed batch."""
        applied = self._positions(path)
        return bool(applied) and all(applied.get(tp, 0) >= o for tp, o in ends.items())

    def _committed(self, path: str, meta: dict[str, str]) -> None:
        self._applied[path] = json.loads(meta[POSITIONS_META])

    def _erased(self) -> tuple[DataFrame, str, str] | None:
        """The erasure registry, the key of its pseudonyms and the registry's version; None before any erasure.

        Looked up every batch (an erasure may have added to it), read again only when it changed.
        """
        path = registry_path(self.root)
        version = latest_completion(self.spark, path) if has_commits(self.spark, path) else None
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
        path = dead_letter_path(self.root)
        rows = union_all([dead_letters(events, batch_id) for events in parsed.values()])
        # The store is written with inserts (no index lookup, whose cost grows with the store):
        # what an earlier commit already holds, a batch re-run after a crash, is left out here.
        held = [(F.col("kafka_topic") == tp.rsplit("/", 1)[0]) & (F.col("kafka_partition") == int(tp.rsplit("/", 1)[1]))
                & (F.col("kafka_offset") < o) for tp, o in self._positions(path).items()]
        if held:
            rows = rows.filter(~functools.reduce(lambda a, b: a | b, held))
        if erased is not None:  # a malformed record of an erased customer is not kept either
            rows = dead_letters_without_erased(rows, *erased[:2])
        rows = rows.persist(StorageLevel.MEMORY_AND_DISK)
        try:
            with report.phase("dead_letters"):
                n = rows.count()
                report.counts.setdefault("dead_letters", {})["written"] = n
                if n:
                    rows.write.format("hudi").options(**hudi_options("dead_letters", "bronze_dead_letters", **meta)) \
                        .mode("append").save(path)
                    self._committed(path, meta)
        finally:
            rows.unpersist()

    def _shape(self, table: str) -> Shape:
        """The table's columns as its newest main commit records them (read once per stream)."""
        if table not in self._shapes:
            path = main_path(table, self.root)
            recorded = has_commits(self.spark, path)
            self._shapes[table] = Shape.from_meta(table, latest_meta(self.spark, path, COLUMNS_META)
                                                  if recorded else None)
            hashes = latest_meta(self.spark, path, DECLARED_META) if recorded else None
            self._declared[table] = set(json.loads(hashes)) if hashes else set()
        return self._shapes[table]

    def _survey(self, table: str, events: DataFrame, accepted: set[str], batch_id: int) -> Survey:
        """The batch's kinds and shapes for `table`: its new shape, and its events of a shape it cannot apply
        turned into dead letters (reason `schema: ...`). One aggregation over the cached batch; the rest
        runs only when a shape is new."""
        def distinct(column: str) -> Column:
            return F.collect_set(F.when(F.size(column) > 0, F.col(column)))

        # Grouped by the Connect schema's hash too (a handful of groups), so that the same pass
        # picks one record of each new schema, whose `after` fields the decision reads.
        groups = events.groupBy("kind", "_decl_hash").agg(
            F.count("*").alias("n"), F.first(F.when(F.col("_decl_new"), F.col("value")), ignorenulls=True)
            .alias("sample"), distinct("_missing").alias("missing"), distinct("_badcast").alias("badcast"),
            F.array_distinct(F.flatten(F.collect_set("_new_keys"))).alias("new_keys"),
            F.array_distinct(F.flatten(F.collect_set("_toast"))).alias("toast")).collect()
        kinds: dict[str, int] = {}
        for g in groups:
            kinds[g["kind"]] = kinds.get(g["kind"], 0) + g["n"]
        row = [g for g in groups if g["kind"] == "row"]
        shape = self._shapes[table]
        survey = Survey(events, kinds, shape)
        if not row:
            return survey

        def union(column: str) -> list:
            return sorted({tuple(v) if isinstance(v, list) else v for g in row for v in g[column]})

        survey.toast = union("toast")
        declared = self._declared_fields(table, {g["_decl_hash"]: g["sample"] for g in row if g["sample"]})
        missing = [list(m) for m in union("missing")]
        badcast = [list(b) for b in union("badcast")]
        new_keys = [k for k in union("new_keys") if not any(k in dict(f) for f in declared.values())]
        if not (declared or missing or badcast or new_keys):
            return survey
        inferred = {k: self._infer(events, k) for k in new_keys}
        decision = decide(shape, list(declared.values()), missing, inferred, accepted, batch_id)
        survey.shape, survey.changed = decision.shape, decision.changed
        held_declared = {h: decision.held_declared[tuple(f)] for h, f in declared.items()
                         if tuple(f) in decision.held_declared}
        survey.applied_declared = set(declared) - set(held_declared)
        holds: list[tuple[Column, str]] = [(F.col("_decl_hash") == h, reason) for h, reason in held_declared.items()]
        holds += [(F.col("_missing") == _literal_array(list(m)), reason) for m, reason in decision.held_missing.items()]
        for cast_failed in badcast:
            # (a column this batch widens holds the values now)
            gone = [c for c in cast_failed if f"{table}.{c}" not in accepted
                    and survey.shape.columns[c].type == shape.columns[c].type]
            if gone:
                holds.append((F.col("_badcast") == _literal_array(cast_failed),
                              f"{SCHEMA_REASON}{table}.{','.join(gone)}: values that do not fit bronze's type "
                              + ", ".join(shape.columns[c].type for c in gone)))
        if holds:
            is_row = F.col("kind") == "row"
            reason = functools.reduce(lambda acc, h: acc.when(is_row & h[0], F.lit(h[1])),
                                      holds[1:], F.when(is_row & holds[0][0], F.lit(holds[0][1])))
            held = reason.isNotNull()
            survey.events = events.withColumn("reason", F.when(held, reason).otherwise(F.col("reason"))) \
                .withColumn("kind", F.when(held, F.lit("dead")).otherwise(F.col("kind")))
            survey.kinds = {r["kind"]: r["count"] for r in survey.events.groupBy("kind").count().collect()}
            log.warning("bronze/%s held: %s", table, "; ".join(sorted({h[1] for h in holds})))
        if survey.changed:
            log.warning("bronze/%s changes shape: %s", table, ", ".join(
                f"{c.name} {c.type}" for c in survey.shape.columns.values() if shape.columns.get(c.name) != c))
        return survey

    @staticmethod
    def _declared_fields(table: str, samples: dict[int, bytes]) -> dict[int, list[tuple[str, str]]]:
        """Per new Connect schema (by hash), `after`'s declared (field, type) list, read from one of its records."""
        declared = {}
        for digest, value in samples.items():
            schema = json.loads(value).get("schema") or {}
            after = next((f for f in schema.get("fields") or [] if isinstance(f, dict) and f.get("field") == "after"),
                         None)
            if after is None or not isinstance(after.get("fields"), list):
                log.warning("bronze/%s: a Connect schema (hash %s) has no field list for `after`: the columns its "
                            "records add are not typed from it", table, digest)
                continue
            declared[digest] = [(f.get("field"), f.get("type")) for f in after["fields"]]
        return declared

    @staticmethod
    def _infer(events: DataFrame, column: str, sample: int = 200) -> str | None:
        """The type of a column new to the table, from the JSON values of the bare images that carry it."""
        rows = events.filter((F.col("kind") == "row") & F.col("_decl_hash").isNull()
                             & F.col("_image")[column].isNotNull()).select("value").limit(sample).collect()
        values = []
        for r in rows:
            doc = json.loads(r["value"])
            envelope = doc.get("payload", doc) if "schema" in doc else doc
            image = envelope.get("after") or envelope.get("before") or {}
            values.append(image.get(column))
        return infer_type(values)

    def _fill_unavailable(self, newest: DataFrame, changes: DataFrame, table: str, columns: list[str],
                          main_state: DataFrame) -> DataFrame:
        """Placeholders (an unchanged TOASTed value) replaced by the value the source still holds.

        That value is the one of the newest event before it: among the batch's events of the key
        (a replayed older one does not count when main holds a newer row), else main's row, read
        for the keys that still need one only. `main_state`: (id, _lsn) of main for the batch's keys.
        """
        ph = self.placeholder
        def real(c: str) -> Column:  # the LSN of an event carrying a real value of `c` (null is one)
            return F.when(~F.col(c).eqNullSafe(ph), F.col("_lsn"))

        known = changes.filter(F.col("_op") != "d").groupBy(KEY).agg(*[
            agg for c in columns for agg in (F.max_by(F.col(c), real(c)).alias(f"_batch_{c}"),
                                             F.max(real(c)).alias(f"_found_{c}"))])
        stored_lsn = F.coalesce(F.col("_m_lsn"), F.lit(-1))

        def need(c: str) -> Column:
            return F.col(c).eqNullSafe(ph) & F.coalesce(F.col(f"_found_{c}") < stored_lsn, F.lit(True))

        filled = newest.join(known, KEY, "left").join(main_state.select(KEY, F.col("_lsn").alias("_m_lsn")), KEY,
                                                      "left").select(*[
            F.when(F.col(c) == ph, F.col(f"_batch_{c}")).otherwise(F.col(c)).alias(c) if c in columns else F.col(c)
            for c in newest.columns], *[need(c).alias(f"_need_{c}") for c in columns])
        need = functools.reduce(lambda a, b: a | b, [F.col(f"_need_{c}") for c in columns]) & (F.col("_op") != "d")
        main = main_path(table, self.root)
        stored_columns = [c for c in columns if c in self._shapes[table].columns]
        if has_commits(self.spark, main) and stored_columns:
            keys = filled.filter(need).select(KEY).distinct()
            stored = self.spark.read.format("hudi").options(**hudi_configs.section("bronze", "unavailable_read")) \
                .load(main).join(F.broadcast(keys), KEY, "left_semi") \
                .select(KEY, *[F.col(c).alias(f"_stored_{c}") for c in stored_columns])
            filled = filled.join(stored, KEY, "left")
        return filled.select(*[
            F.when(F.col(f"_need_{c}"), F.col(f"_stored_{c}") if c in stored_columns else F.lit(None).cast("string"))
            .otherwise(F.col(c)).alias(c) if c in columns else F.col(c) for c in newest.columns])

    def _apply(self, table: str, events: DataFrame, survey: Survey, meta: dict[str, str], report: BatchReport,
               erased: tuple[DataFrame, str, str] | None) -> None:
        counts = report.counts.setdefault(table, {})
        kinds = survey.kinds
        for kind in ("tombstone", "ignored", "truncate", "dead"):
            if kinds.get(kind):
                counts[kind] = kinds[kind]
        if not kinds.get("row") and not kinds.get("truncate"):
            return
        shape = survey.shape
        main = main_path(table, self.root)
        known_main, known_deletes = self._known(table)
        if not known_main.loaded:  # the stream's first batch of this table: one read of the table
            with report.phase(f"{table}.load_state"):
                known_main.load()
                known_deletes.load()
        changes = _change_rows(events, table, shape)
        if erased is not None:  # events of erased customers and their orders never reach the lake again
            changes = without_erased(changes, table, *erased[:2])
        # A truncate deletes every key the table holds: the one plan that needs them all.
        synthetic = truncate_deletes(events, known_main.all(), shape) if kinds.get("truncate") else None
        if synthetic is not None:
            changes = changes.unionByName(synthetic)
        newest = newest_per_key(changes)
        if survey.toast:
            newest = self._fill_unavailable(newest, changes, table, [c for c in survey.toast if c in shape.columns],
                                            known_main.lookup(newest.select(KEY)))
        newest = newest.persist(StorageLevel.MEMORY_AND_DISK)
        keys = newest.select(KEY)
        planned = plan(newest, known_main.lookup(keys), known_deletes.lookup(keys)).persist(
            StorageLevel.MEMORY_AND_DISK)
        try:
            with report.phase(f"{table}.plan"):
                tally = planned.groupBy("to_main", "to_log", "_op").count().collect()
            for r in tally:
                outcome = "stale" if not r["to_log"] else "delete" if r["_op"] == "d" else "upsert"
                counts[outcome] = counts.get(outcome, 0) + r["count"]
            # One instant for the batch's writes: a key's change-log row and its bronze row
            # say the same about when it was ingested.
            now = F.lit(datetime.now(UTC)).cast("timestamp").alias("_ingested_at")
            meta_columns = [c for c in META_COLUMNS if c != "_ingested_at"]
            # Every write carries every column of the shape, the contract's first and those added
            # since last (Hudi adds a column at the end only); a dropped column is written null.
            contract_columns, extras = list(contract.COLUMNS[table]), shape.extras
            main_meta = meta | {COLUMNS_META: shape.to_meta(),
                                DECLARED_META: json.dumps(sorted(self._declared[table] | survey.applied_declared))}

            def save(rows: DataFrame, part: str, name: str, path: str, options: dict[str, str]) -> None:
                with report.phase(f"{table}.{part}"):
                    rows.write.format("hudi").options(**hudi_options(part, name, **options)).mode("append").save(path)

            if any(r["to_log"] for r in tally):
                save(planned.filter("to_log").select(
                    *contract_columns, *meta_columns, now,
                    F.date_format(now, "yyyy-MM-dd").alias("_ingest_date"), *extras,
                ), "changelog", f"bronze_changelog_{table}", changelog_path(table, self.root), meta)
                known_deletes.add(planned.filter("to_log AND _op = 'd'").select(KEY, "_lsn"))
            if any(r["to_main"] for r in tally):
                save(planned.filter("to_main").select(
                    *contract_columns, *meta_columns, now, (F.col("_op") == "d").alias(DELETED_FLAG), *extras,
                ), "table", f"bronze_{table}", main, main_meta)
                self._committed(main, meta)
                known_main.add(planned.filter("to_main").select(KEY, "_lsn", (F.col("_op") != "d").alias("_live")))
            self._shapes[table] = shape
        finally:
            planned.unpersist()
            newest.unpersist()


@dataclass
class Survey:
    """One table's part of a batch after the schema decision (`BronzeBatchWriter._survey`)."""

    events: DataFrame  # held events turned into dead letters
    kinds: dict[str, int]
    shape: Shape
    changed: bool = False
    toast: list[str] = field(default_factory=list)  # columns carrying the unavailable-value placeholder
    applied_declared: set[int] = field(default_factory=set)  # hashes of the declared shapes applied


# --------------------------------------------------------------------------- the stream

def kafka_stream(spark: SparkSession, bootstrap: str, tables: tuple[str, ...] = contract.TABLES) -> DataFrame:
    """The source topics of `tables` as a stream, with bronze.toml's Kafka options (also the benchmarks' readers)."""
    return (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", ",".join(contract.topic(t) for t in tables))
            .options(**hudi_configs.section("bronze", "kafka")))


def checkpoint_lost(spark: SparkSession, checkpoint: str) -> bool:
    """True when the stream's checkpoint holds no offsets: a new stream, or a deleted checkpoint."""
    jvm = spark.sparkContext._jvm
    offsets = jvm.org.apache.hadoop.fs.Path(f"{checkpoint}/offsets")
    fs = offsets.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
    return not fs.exists(offsets) or len(fs.listStatus(offsets)) == 0


def starting_offsets(spark: SparkSession, root: str, partitions: dict[str, list[int]]) -> str | None:
    """Spark's `startingOffsets` for a stream without checkpoint: each topic from its main table's position.

    `partitions` lists every partition of each table's topic (Spark wants all of them);
    a partition the table has no position for starts at the earliest offset (-2). None
    when no main table has a position: the first run of a lake starts from the earliest.
    """
    found: dict[str, dict[str, int]] = {}
    for table in contract.TABLES:
        topic = contract.topic(table)
        applied = positions_of(spark, main_path(table, root))
        found[topic] = {str(p): applied.get(f"{topic}/{p}", -2) for p in partitions.get(topic, [])}
    if not any(o >= 0 for offsets in found.values() for o in offsets.values()):
        return None
    return json.dumps({t: o for t, o in found.items() if o}, sort_keys=True)


def topic_partitions(bootstrap: str) -> dict[str, list[int]]:
    """The partitions of every source topic, from the brokers."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, request_timeout_ms=30000)
    try:
        topics = consumer.topics()
        return {t: sorted(consumer.partitions_for_topic(t) or ()) for t in map(contract.topic, contract.TABLES)
                if t in topics}
    finally:
        consumer.close()


def run_ingest(*, once: bool, root: str | None = None, bootstrap: str | None = None,
               trigger_seconds: float = INGEST_TRIGGER_SECONDS, max_offsets_per_trigger: int | None = None,
               spark: SparkSession | None = None, stop_timeout: float = 300.0) -> None:
    """Run the ingest stream: until caught up with what was on the topics at start (`once`), or forever.

    Offsets are tracked by Structured Streaming in a checkpoint under the lake root; each
    Hudi commit also records the stream's position, so a lost checkpoint resumes from the
    tables instead of the beginning of the topics. An interrupt (SIGTERM in the CLI) lets
    the batch in progress finish, up to `stop_timeout` seconds, then stops the stream: a
    batch is committed whole, or abandoned and re-run whole on the next start. A stop
    request (`lakehouse stream stop`, pipelines.ingest.stream) does the same and the run returns.
    The stream's heartbeat beside its checkpoint keeps a second copy from starting.
    """
    from pipelines.spark import get_spark

    root = root or lake_root()
    bootstrap = bootstrap or kafka_bootstrap()
    spark = spark or get_spark("lakehouse-ingest")
    reader = kafka_stream(spark, bootstrap)
    if checkpoint_lost(spark, ingest_checkpoint_path(root)) and \
            (start := starting_offsets(spark, root, topic_partitions(bootstrap))):
        log.warning("no stream checkpoint at %s: resuming from the positions in bronze's commits %s",
                    ingest_checkpoint_path(root), start)
        reader = reader.option("startingOffsets", start)
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    writer = (reader.load().writeStream.queryName("bronze_ingest")
              .foreachBatch(BronzeBatchWriter(spark, root))
              .option("checkpointLocation", ingest_checkpoint_path(root)))
    writer = writer.trigger(availableNow=True) if once else writer.trigger(processingTime=f"{trigger_seconds} seconds")
    # One writer per checkpoint: wait for a previous stream's heartbeat to go stale, or fail.
    lease = StreamLease(root)
    lease.claim()
    query = writer.start()
    try:
        while not query.awaitTermination(lease.lim.heartbeat_seconds):
            lease.beat(query.lastProgress, query.status["isTriggerActive"])
            if lease.stop_requested():
                log.info("stop requested (%s): stopping after the batch in progress", STOP_REQUEST)
                _let_batch_finish(query, stop_timeout)
                break
    except KeyboardInterrupt:
        _let_batch_finish(query, stop_timeout)
        raise
    finally:
        if query.isActive:
            query.stop()
        lease.release()


def _let_batch_finish(query: StreamingQuery, timeout: float) -> None:
    """Wait up to `timeout` for the batch in progress to commit: a batch is committed whole, or re-run whole."""
    deadline = time.monotonic() + timeout
    if query.isActive and query.status["isTriggerActive"]:
        log.info("stopping: waiting up to %.0fs for the batch in progress to finish", timeout)
    while query.isActive and query.status["isTriggerActive"] and time.monotonic() < deadline:
        time.sleep(0.5)
