"""`lakehouse etl`: one incremental cycle, bronze -> silver -> gold (`pipelines.transform.gold`).

Each output table keeps its own checkpoint, the completion time of the last source commit
it consumed, in the metadata of the very commit that wrote the output
(`_lakehouse.checkpoint`). Output and checkpoint are therefore one atomic Hudi commit:
a cycle killed half-way leaves every table either before or after its step, and the next
cycle redoes exactly the missing steps. Every write is a keyed upsert or delete of the
latest state, so reading a window again changes nothing.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from functools import partial

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines import console, contract
from pipelines.catalog import silver_extra_columns, silver_options
from pipelines.erasure_registry import erasure_key, read_registry, without_erased
from pipelines.hudi_timeline import checkpoint, consumed, repair_torn_timeline, write_with_checkpoint
from pipelines.ingest.state import DELETED_FLAG, KEY
from pipelines.settings import changelog_path, gold_path, lake_root, quarantine_path, silver_path
from pipelines.spark import get_spark
from pipelines.table_stats import has_completed_commit
from pipelines.transform.changes import Window, bronze_changes, window
from pipelines.transform.gold import DAILY, LTV, STATE, gold_cycle
from pipelines.transform.silver import CLEANERS

log = logging.getLogger(__name__)


def _write(df: DataFrame, path: str, name: str, marks: dict[str, str]) -> None:
    write_with_checkpoint(df, path, silver_options(name), marks)


def _carrying_new_extras(spark: SparkSession, table: str, extras: tuple[str, ...], w: Window, silver: str) -> Window:
    """`w`, or a full read when the catalog names an extra column that bronze has and silver lacks.

    A column newly named in the catalog (or newly added in the source) would otherwise reach only
    the rows that change from now on; a full read gives it to every row, once (after it, silver has it).
    """
    if not extras or w.full or w.since is None or not has_completed_commit(silver):
        return w
    in_bronze = set(spark.read.format("hudi").load(w.path).columns)
    in_silver = set(spark.read.format("hudi").load(silver).columns)
    if not (new := [c for c in extras if c in in_bronze and c not in in_silver]):
        return w
    log.warning("silver/%s: the catalog's extra column(s) %s are in bronze, not yet in silver: rebuilding "
                "from a full read of bronze", table, ", ".join(new))
    return replace(w, full=True)


def silver_cycle(spark: SparkSession, table: str, root: str) -> dict[str, int]:
    """bronze/_changelog/<table> -> silver/<table> and silver/_quarantine/<table>; returns counts."""
    outputs = (silver_path(table, root), quarantine_path(table, root))
    source = changelog_path(table, root)
    # Both outputs read from the older of their checkpoints: re-reading is harmless, skipping is not.
    since = min((consumed(checkpoint(spark, p) if has_completed_commit(p) else {}, source) for p in outputs),
                key=lambda v: v or "")
    extras = silver_extra_columns(table)
    w = _carrying_new_extras(spark, table, extras, window(spark, source, since or None), outputs[0])
    changes = bronze_changes(spark, table, w, root, extras=extras)
    if changes is None:
        return {}
    carried = [c for c in extras if c in changes.columns]  # those bronze has
    if (registry := read_registry(spark, root)) is not None:  # a change read before an erasure swept it
        changes = without_erased(changes, table, registry.localCheckpoint(), erasure_key())
    changes = changes.persist()
    cleaned = CLEANERS[table](changes.filter(~F.col("_deleted")), carried).persist()
    try:
        raw = changes.filter(~F.col("_deleted")).drop("_deleted", "_source_ts")
        deleted = changes.filter(F.col("_deleted")).select(KEY, "_lsn")
        valid = cleaned.filter(F.col("failed_rule").isNull()).drop("failed_rule")
        invalid = cleaned.filter(F.col("failed_rule").isNotNull()).select(KEY, "_lsn", "failed_rule")
        new_marks = {source: w.until}

        not_in_silver = deleted.unionByName(invalid.select(KEY, "_lsn"))
        silver_rows = valid.withColumn(DELETED_FLAG, F.lit(False)).unionByName(
            not_in_silver.withColumn(DELETED_FLAG, F.lit(True)), allowMissingColumns=True)
        quarantined = raw.join(invalid.drop("_lsn"), KEY).withColumn("_quarantined_at", F.current_timestamp())
        not_in_quarantine = deleted.unionByName(valid.select(KEY, "_lsn"))
        quarantine_rows = quarantined.withColumn(DELETED_FLAG, F.lit(False)).unionByName(
            not_in_quarantine.withColumn(DELETED_FLAG, F.lit(True)), allowMissingColumns=True)

        counts = {"valid": valid.count(), "invalid": invalid.count(), "deleted": deleted.count()}
        _write(silver_rows, outputs[0], f"silver_{table}", new_marks)
        _write(quarantine_rows, outputs[1], f"silver_quarantine_{table}", new_marks)
        return counts
    finally:
        cleaned.unpersist()
        changes.unpersist()


def run_etl(spark: SparkSession | None = None, root: str | None = None) -> dict[str, dict[str, int]]:
    """One cycle: every silver table from bronze, then gold from silver; returns counts per output table."""
    spark = spark or get_spark("lakehouse-etl")
    root = root or lake_root()
    # A SIGKILL while Hudi wrote a timeline file leaves it cut short on a local disk, and the table unreadable.
    for path in [*(where(t, root) for t in contract.TABLES for where in (silver_path, quarantine_path)),
                 *(gold_path(name, root) for name in (LTV, DAILY, STATE))]:
        repair_torn_timeline(path)
    report = {f"silver/{table}": console.timed(log, f"silver/{table}", partial(silver_cycle, spark, table, root))
              for table in contract.TABLES}
    gold = gold_cycle(spark, root, silver_path("customers", root), silver_path("orders", root))
    return report | {f"gold/{table}": counts for table, counts in gold.items()}
