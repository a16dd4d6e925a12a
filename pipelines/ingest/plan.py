"""What a batch still has to write, per key: the newest event of the batch, applied only if it is newer
than everything applied for the key (live row, change-log delete, ledger). The rules only move a key
forward in LSN, so a replayed batch, or one re-run after a crash, writes exactly what is missing.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipelines.ingest.parse import image_columns
from pipelines.ingest.schema import Shape

# --------------------------------------------------------------------------- planning

def change_rows(events: DataFrame, shape: Shape) -> DataFrame:
    """The parsed `row` events of one table as its `shape`'s typed columns and the change's metadata.

    The shape carries the table's declaration: `Shape.initial(decl.table(name))` before any message has shaped it.
    """
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
    key = shape.key
    keys = main_state.filter(F.col("_lsn") < t["_lsn"]).select(*key).unionByName(
        change_rows(events, shape).select(*key)).distinct()
    return keys.select(
        *key, *[F.lit(None).cast(kind).alias(c) for c, kind in columns.items() if c not in key],
        F.lit("d").alias("_op"), F.lit(t["_lsn"]).alias("_lsn"), F.lit(t["_source_ts"]).alias("_source_ts"),
        F.lit(t["_tx_id"]).cast("long").alias("_tx_id"), F.lit(t["kafka_partition"]).alias("_kafka_partition"),
        F.lit(t["kafka_offset"]).alias("_kafka_offset"), F.lit(t["kafka_timestamp"]).alias("_kafka_ts"),
    ).select(*columns, "_op", "_lsn", "_source_ts", "_tx_id", "_kafka_partition", "_kafka_offset", "_kafka_ts")


def newest_per_key(changes: DataFrame, key: tuple[str, ...]) -> DataFrame:
    """One row per key: the highest LSN; for a re-delivered event, its first delivery.

    A struct max is one aggregation with no sort: fields compare left to right.
    """
    others = [c for c in changes.columns if c not in (*key, "_lsn", "_kafka_offset")]
    best = F.max(F.struct(F.col("_lsn"), (-F.col("_kafka_offset")).alias("_neg_offset"), *others)).alias("_b")
    return changes.groupBy(*key).agg(best).select(
        *key, "_b._lsn", (-F.col("_b._neg_offset")).alias("_kafka_offset"), *[f"_b.{c}" for c in others])


def plan(newest: DataFrame, known: DataFrame, key: tuple[str, ...], *, relog: bool = False) -> DataFrame:
    """Decide, per key, what the tables still lack: columns `to_main` and `to_log`.

    `known` is `state.known_state` of the batch's keys: `_m_lsn`, the LSN of main's row (null when
    main does not hold the key), and `_t_lsn`, the newest delete applied (change log and ledger). An
    event is applied when it is newer than both; a delete reaches main only while main holds an
    older row. The rules only ever move a key forward in LSN, so a table that already reflects the
    event gets nothing. A delete equal to the newest known one is still sent to a main that holds
    an older row: that is a batch re-run after its change-log commit and before main's.

    `relog`: main holds a batch the change log lacks (a crash between the two commits, which run
    side by side). Main's rows and the batch's own events still say everything that batch logged:
    an upsert main holds at exactly its LSN is logged again, and a delete main applied is newer
    than every delete the change log knows, so the usual rule logs it. A key the batch's change
    already reached the change log for gets a second row at the same LSN, which readers fold.
    """
    m = F.coalesce(F.col("_m_lsn"), F.lit(-1))
    t = F.coalesce(F.col("_t_lsn"), F.lit(-1))
    lsn = F.col("_lsn")
    is_delete = F.col("_op") == "d"
    upsert = ~is_delete & (lsn > m) & (lsn > t)
    joined = newest.join(known.select(*key, "_m_lsn", "_t_lsn"), list(key), "left")
    to_main = upsert | (is_delete & (lsn > m) & (lsn >= t) & F.col("_m_lsn").isNotNull())
    new_delete = is_delete & (lsn > m) & (lsn > t)
    to_log = to_main | new_delete
    if relog:
        to_log = to_log | (~is_delete & (lsn == m) & (lsn > t))
    return joined.select("*", to_main.alias("to_main"), to_log.alias("to_log"))
