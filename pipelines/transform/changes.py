"""Changes of a lake table since a checkpoint: for `lakehouse etl` and for incremental-ETL consumers.

A consumer keeps the checkpoint this returns and passes it back next time; it then sees
each key that changed in between once, in its latest state, or as a deletion. Plain Hudi
incremental queries return no row for a deleted key, so bronze changes come from bronze's
change log (which records deletes as rows), silver and gold deletions from the Hudi CDC
feed (op `d`), and those of the day-partitioned daily_revenue from a diff of the days
written (see partition_diff).

Checkpoints are opaque strings: the completion time of the last commit read of the
timeline the table's changes come from.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import hudi_configs
from pipelines.errors import UnknownTable
from pipelines.ingest.plan import newest_per_key
from pipelines.lake.catalog import change_feed_tables
from pipelines.lake.declaration import TableDecl
from pipelines.lake.frames import materialized, union_all
from pipelines.lake.hudi_timeline import (
    earliest_by_commit_time,
    earliest_checkpoint,
    instant_as_of,
    instants_between,
    latest_completion,
    partitions_written,
    read_on_after_purge,
)
from pipelines.lake.layout import (
    LEDGER_COLUMNS,
    META_COLUMNS,
    changelog_path,
    lake_relative,
    ledger_path,
    main_path,
    table_path,
)
from pipelines.lake.table_stats import has_completed_commit
from pipelines.runtime.lake import Lake

log = logging.getLogger(__name__)

# Above this many keys, a keyed read joins instead of listing the keys in its filter (and the
# record-level index no longer prunes: see spark.sql.optimizer.inSetConversionThreshold).
KEYED_READ_LIMIT = 1_000
# Tables served by partition_diff rather than by their CDC feed, with their partition column.
PARTITIONED_FEEDS = {"gold/daily_revenue": "order_date"}


@dataclass(frozen=True)
class Window:
    """What one cycle reads of a source table: commits completed after `since`, up to `until`."""

    path: str
    since: str | None
    until: str | None
    full: bool = False  # the checkpoint is gone from the timeline: read the whole table
    by_commit_time: bool = False  # the window's files were cleaned, its rows are found by their commit time

    @property
    def empty(self) -> bool:
        """Nothing to read: no table yet, or nothing committed after `since`."""
        return self.until is None or (self.since is not None and self.since >= self.until and not self.full)

    @property
    def end(self) -> str:
        """`until` of a window on a table with commits: the checkpoint its reader records."""
        assert self.until is not None, f"{self} is on a table with commits"
        return self.until

    @property
    def bounds(self) -> tuple[str, str]:
        """(since, until) of a window read incrementally: not empty, not full, with a start."""
        assert self.since is not None and self.until is not None, f"{self} is read incrementally"
        return self.since, self.until


def window(spark: SparkSession, path: str, since: str | None, *, insert_only: bool = False) -> Window:
    """What a reader at checkpoint `since` reads of `path` now: the commits completed since, up to the newest.

    A checkpoint older than the earliest readable one (hudi_timeline.earliest_checkpoint) is read on
    without a full read where that is exact: after an erasure's purge whose commits the reader has
    nothing to read of (hudi_timeline.read_on_after_purge), and, on an `insert_only` table (bronze's
    change logs, whose rows keep their commit time), by commit time while its commits are on the active
    timeline and not expired. Otherwise the window is `full`, and a warning says so.
    """
    if not has_completed_commit(path):
        return Window(path, since, None)
    until = latest_completion(spark, path)
    earliest = earliest_checkpoint(spark, path)
    if since is None or earliest is None or since >= earliest:
        return Window(path, since, until)
    if (after_purge := read_on_after_purge(spark, path, since, earliest)) is not None:
        log.info("%s: read on from %s, after an erasure's purge (nothing to read since %s)", lake_relative(path),
                 after_purge, since)
        return Window(path, after_purge, until)
    if insert_only and since >= (earliest_by_commit_time(spark, path) or since):
        log.info("%s: the commits since %s read by commit time (their files were cleaned)", lake_relative(path), since)
        return Window(path, since, until, by_commit_time=True)
    log.warning("checkpoint %s of %s is no longer readable (archived or cleaned; the oldest readable "
                "is %s): rebuilding from a full read", since, path, earliest)
    return Window(path, since, until, full=True)


def _changelog_window(spark: SparkSession, w: Window) -> DataFrame | None:
    """Rows bronze's change log received in the window (all of it for a window without a start)."""
    if w.empty:
        return None
    if w.full or w.since is None:
        return spark.read.format("hudi").load(w.path)
    since, until = w.bounds
    rows = spark.read.format("hudi").load(w.path) if w.by_commit_time else \
        (spark.read.format("hudi").options(**hudi_configs.section("reads", "incremental"))
         .option("hoodie.datasource.read.begin.instanttime", since)
         .option("hoodie.datasource.read.end.instanttime", until).load(w.path))
    # Only the ingest days the window can reach (a day of slack for clocks and time zones),
    # and only rows of the window's commits: with Hudi 1.0.2 the incremental query also
    # returns other rows of the files it opens, and a read by commit time opens the days' every file.
    first_day = (datetime.strptime(since[:8], "%Y%m%d") - timedelta(days=1)).strftime("%Y-%m-%d")
    return rows.filter((F.col("_ingest_date") >= first_day)
                       & F.col("_hoodie_commit_time").isin(instants_between(spark, w.path, since, until)))


def keyed_read(spark: SparkSession, path: str, keys: DataFrame) -> DataFrame:
    """Current rows of the silver or gold table at `path` whose key (the one column of `keys`) is in `keys`.

    Opens only the files that hold those keys, through the record-level index: an IN list of
    at most KEYED_READ_LIMIT keys; above that a semi-join, which reads every file.
    """
    table = spark.read.format("hudi").options(**hudi_configs.section("reads", "keyed")).load(path)
    (column,) = keys.columns
    wanted = [r[0] for r in keys.distinct().collect()]
    if len(wanted) > KEYED_READ_LIMIT:
        return table.join(keys.distinct(), column, "left_semi")
    return table.filter(F.col(column).isin(wanted))


def bronze_changes(spark: SparkSession, decl: TableDecl, w: Window, root: str,
                   extras: Sequence[str] | None = ()) -> DataFrame | None:
    """Per key changed in bronze in window `w` of its change log: the newest change by LSN, `_deleted` if a delete.

    Columns: the declared ones, the CDC metadata, and of the other columns bronze has (gained
    since the declaration, contract section 6, or all of them for a table declared without
    columns) those named in `extras` that the change log has (None: all of them). A window without
    a start (first read, or a checkpoint older than the change log's timeline) also reads main and
    the delete ledger whole: the change log may have been cleaned of old days, the two tables
    always hold each key's newest state.
    """
    changes = _changelog_window(spark, w)
    if changes is None:
        return None
    table, key = decl.name, decl.key
    fixed = [*dict.fromkeys([*key, *decl.columns]), *META_COLUMNS]
    types = {f.name: f.dataType for f in changes.schema.fields}
    added = [c for c in types if c not in fixed and c != "_ingest_date" and not c.startswith("_hoodie_")]
    columns = [*fixed, *(c for c in (added if extras is None else extras) if c in added)]

    def shaped(df: DataFrame) -> DataFrame:
        """`columns` of `df` typed as the change log has them, null where `df` lacks one (the ledger;
        a main commit that a crash cut short before a column was added or widened)."""
        have = {f.name: f.dataType for f in df.schema.fields}
        return df.select(*[F.lit(None).cast(types[c]).alias(c) if c not in have
                           else F.col(c) if have[c] == types[c] else F.col(c).cast(types[c]).alias(c)
                           for c in columns])

    frames = [shaped(changes)]
    if w.full or w.since is None:
        if has_completed_commit(main := main_path(table, root)):
            frames.append(shaped(spark.read.format("hudi").load(main)))
        if has_completed_commit(ledger := ledger_path(table, root)):
            deletes = spark.read.format("hudi").load(ledger).select(*key, *LEDGER_COLUMNS, F.lit("d").alias("_op"))
            frames.append(shaped(deletes))
    return newest_per_key(union_all(frames), key).select(*columns, (F.col("_op") == "d").alias("_deleted"))


@dataclass(frozen=True)
class ChangeSet:
    """`rows`: one row per changed key, `_change` = 'upsert' (with the row) or 'delete' (key only).

    `snapshot` is true when the rows are the whole table rather than changes: on a first
    read, or when the checkpoint was no longer readable (archived or cleaned). Deletions
    since the checkpoint are then unknown, so a consumer replaces its copy instead of
    merging into it.
    """

    rows: DataFrame
    checkpoint: str
    snapshot: bool = False


def cdc_window(spark: SparkSession, w: Window) -> DataFrame:
    """Hudi's CDC feed of a silver or gold table in the window: (op, ts_ms, before, after), images as JSON text.

    Aggregate it before anything shuffles or sorts its rows: with Hudi 1.0.2, a repartition,
    sort or window directly over this reader lost a row (354 records in, 353 out), while a
    grouped aggregation (partial aggregation before the exchange) keeps every record.
    """
    reader = spark.read.format("hudi").options(**hudi_configs.section("reads", "incremental")) \
        .option("hoodie.datasource.query.incremental.format", "cdc") \
        .option("hoodie.datasource.read.begin.instanttime", w.since or "000") \
        .option("hoodie.datasource.read.end.instanttime", w.until)
    return reader.load(w.path)


def cdc_last_ops(spark: SparkSession, w: Window, key: tuple[str, ...]) -> DataFrame:
    """(key columns, last op in the window) from the Hudi CDC feed of a silver or gold table, the key typed as the
    table has it."""
    cdc = cdc_window(spark, w)
    types = {f.name: f.dataType for f in spark.read.format("hudi").load(w.path).schema.fields}
    # The absent image is the JSON text 'null' (not SQL NULL): pick the image by op.
    image = F.when(F.col("op") == "d", F.col("before")).otherwise(F.col("after"))
    keyed = cdc.select(*[F.get_json_object(image, f"$.{k}").cast(types[k]).alias(k) for k in key], "op", "ts_ms")
    return keyed.groupBy(*key).agg(F.max_by("op", "ts_ms").alias("op"))


def partition_diff(spark: SparkSession, w: Window, key: tuple[str, ...], partition_field: str) -> DataFrame:
    """Changes of a table partitioned by `partition_field`: the partitions the window wrote, then against now.

    For tables whose partitions are small (a day of daily_revenue is at most countries x
    currencies rows): it reads the written partitions twice (as of `w.since` by time travel,
    and now) and needs no CDC feed. Hudi 1.0.2's CDC feed of such a table misses deletes
    (a day whose every key was deleted stays in a consumer's copy).
    """
    since, until = w.bounds
    values = [p.split("=", 1)[-1] for p in partitions_written(spark, w.path, since, until)]
    table = spark.read.format("hudi").load(w.path)
    columns = [c for c in table.columns if not c.startswith("_hoodie")]
    now = table.filter(F.col(partition_field).isin(values)).select(*columns)
    then = spark.read.format("hudi").option("as.of.instant", instant_as_of(spark, w.path, since)) \
        .load(w.path).filter(F.col(partition_field).isin(values)).select(*columns)
    upserts = now.subtract(then).withColumn("_change", F.lit("upsert"))
    deletes = then.select(*key).subtract(now.select(*key)).withColumn("_change", F.lit("delete"))
    return upserts.unionByName(deletes, allowMissingColumns=True)


def read_changes(lake: Lake, table: str, since: str | None = None) -> ChangeSet:
    """Rows of `table` ('bronze/orders', 'silver/customers', 'gold/customer_ltv', ...) changed after `since`.

    `since` is the checkpoint a previous call returned (None: from the start).
    """
    feeds = change_feed_tables(lake.declaration)
    if table not in feeds:
        raise UnknownTable(f"unknown table {table!r}: expected one of {', '.join(feeds)}")
    spark, root = lake.spark, lake.root
    layer, name = table.split("/")
    key = feeds[table]
    if layer == "bronze":
        w = window(spark, changelog_path(name, root), since or None, insert_only=True)
        changes = bronze_changes(spark, lake.declaration.table(name), w, root, extras=None)
        if changes is None:
            return ChangeSet(_empty(spark, w.path, key), w.until or "")
        rows = changes.select("*", F.when(F.col("_deleted"), "delete").otherwise("upsert").alias("_change"))
        return ChangeSet(rows.drop("_deleted"), w.until or "", snapshot=w.full or w.since is None)
    w = window(spark, table_path(layer, name, root), since or None)
    if w.empty:
        return ChangeSet(_empty(spark, w.path, key), w.until or "")
    if w.full or w.since is None:
        data = spark.read.format("hudi").load(w.path)
        data = data.drop(*[c for c in data.columns if c.startswith("_hoodie")])
        return ChangeSet(data.withColumn("_change", F.lit("upsert")), w.until or "", snapshot=True)
    if partition_field := PARTITIONED_FEEDS.get(table):
        return ChangeSet(partition_diff(spark, w, key, partition_field), w.until or "")
    # Which keys changed, from the CDC feed; their rows, by key.
    ops = materialized(cdc_last_ops(spark, w, key))
    live = keyed_read(spark, w.path, ops.filter("op != 'd'").select(*key))
    live = live.drop(*[c for c in live.columns if c.startswith("_hoodie")]).withColumn("_change", F.lit("upsert"))
    gone = ops.filter("op = 'd'").select(*key, F.lit("delete").alias("_change"))
    return ChangeSet(live.unionByName(gone, allowMissingColumns=True), w.until or "")


def _empty(spark: SparkSession, path: str, key: tuple[str, ...]) -> DataFrame:
    """No changes, with the key columns typed as the table has them (bigint before the table exists)."""
    if has_completed_commit(path):
        keys = spark.read.format("hudi").load(path).select(*key).limit(0)
        return keys.withColumn("_change", F.lit(None).cast("string"))
    return spark.createDataFrame([], ", ".join(f"{k} long" for k in key) + ", _change string")
