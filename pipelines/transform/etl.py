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
from dataclasses import dataclass, replace
from functools import partial

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.lake.catalog import gold_missing, silver_options
from pipelines.lake.declaration import Declaration, TableDecl
from pipelines.lake.erasure_registry import read_registry, without_erased
from pipelines.lake.frames import materialized
from pipelines.lake.hudi_timeline import checkpoint, consumed
from pipelines.lake.layout import DELETED_FLAG, changelog_path, gold_path, quarantine_path, silver_path
from pipelines.lake.table_stats import has_completed_commit
from pipelines.lake.timeline_repair import repair_torn_timeline
from pipelines.runtime import console
from pipelines.runtime.lake import Lake
from pipelines.transform.changes import Window, bronze_changes, window
from pipelines.transform.gold import DAILY, LTV, STATE, gold_cycle
from pipelines.transform.silver import clean, silver_columns, split
from pipelines.transform.writes import write_with_checkpoint

log = logging.getLogger(__name__)


def _write(df: DataFrame, path: str, name: str, key: tuple[str, ...], marks: dict[str, str]) -> None:
    write_with_checkpoint(df, path, silver_options(name, key), marks)


def _carrying_new_columns(spark: SparkSession, table: TableDecl, w: Window, silver: str) -> Window:
    """`w`, or a full read when silver should carry a column that bronze has and silver lacks.

    Such a column is a `silver_extra` newly declared (or newly added in the source), or, for a
    table declared without `columns`, any column the source added: it would otherwise reach only
    the rows that change from now on; a full read gives it to every row, once (after it, silver has it).
    """
    if (table.columns and not table.silver_extra) or w.full or w.since is None or not has_completed_commit(silver):
        return w
    in_bronze = spark.read.format("hudi").load(w.path).columns
    in_silver = set(spark.read.format("hudi").load(silver).columns)
    if not (new := [c for c in silver_columns(table, in_bronze) if c not in in_silver]):
        return w
    log.warning("silver/%s: column(s) %s are in bronze, not yet in silver: rebuilding from a full read of bronze",
                table.name, ", ".join(new))
    return replace(w, full=True)


@dataclass(frozen=True)
class SilverStep:
    """What one cycle reads of a declared table, planned (lazily) before anything is written."""

    table: TableDecl
    window: Window
    changes: DataFrame  # per changed key, its newest bronze change (`_deleted` for a delete)
    columns: tuple[str, ...]  # what silver carries of them (`silver_columns`)


def plan_silver(lake: Lake, table: str) -> SilverStep | None:
    """The silver step of a declared table (None: nothing new in bronze).

    Raises DeclarationError when the declaration's cleaning, rules or derivations name a column
    bronze lacks (`clean` checks it against the columns read): `run_etl` plans every table
    before it writes any.
    """
    spark, root, decl = lake.spark, lake.root, lake.declaration.table(table)
    outputs = (silver_path(table, root), quarantine_path(table, root))
    source = changelog_path(table, root)
    # Both outputs read from the older of their checkpoints: re-reading is harmless, skipping is not.
    since = min((consumed(checkpoint(spark, p) if has_completed_commit(p) else {}, source) for p in outputs),
                key=lambda v: v or "")
    w = _carrying_new_columns(spark, decl, window(spark, source, since or None, insert_only=True),
                               outputs[0])
    # Declared columns: the extras named (bronze_changes keeps those it has); none declared: every column.
    changes = bronze_changes(spark, decl, w, root, extras=decl.silver_extra if decl.columns else None)
    if changes is None:
        return None
    columns = tuple(silver_columns(decl, changes.columns))
    clean(changes, decl, columns)  # only its checks of the declaration against bronze: nothing runs yet
    return SilverStep(decl, w, changes, columns)


def write_silver(lake: Lake, step: SilverStep | None) -> dict[str, int]:
    """One commit to silver/<table> and one to its quarantine, each with the window as its checkpoint; counts."""
    if step is None:
        return {}
    spark, root = lake.spark, lake.root
    table, key = step.table.name, list(step.table.key)
    outputs = (silver_path(table, root), quarantine_path(table, root))
    changes = step.changes
    # Read after the changes were planned and before they run: a change read before an erasure swept it.
    if step.table.subject and (registry := read_registry(spark, root)) is not None:
        changes = without_erased(changes, table, materialized(registry), lake.erasure_key, lake.declaration)
    changes = changes.persist()
    cleaned = clean(changes.filter(~F.col("_deleted")), step.table, step.columns).persist()
    try:
        raw = changes.filter(~F.col("_deleted")).drop("_deleted", "_source_ts")
        deleted = changes.filter(F.col("_deleted")).select(*key, "_lsn")
        valid, quarantined = split(cleaned, raw, key)
        invalid = cleaned.filter(F.col("failed_rule").isNotNull()).select(*key, "_lsn", "failed_rule")
        new_marks = {changelog_path(table, root): step.window.end}

        not_in_silver = deleted.unionByName(invalid.select(*key, "_lsn"))
        silver_rows = valid.withColumn(DELETED_FLAG, F.lit(False)).unionByName(
            not_in_silver.withColumn(DELETED_FLAG, F.lit(True)), allowMissingColumns=True)
        quarantined = quarantined.withColumn("_quarantined_at", F.current_timestamp())
        not_in_quarantine = deleted.unionByName(valid.select(*key, "_lsn"))
        quarantine_rows = quarantined.withColumn(DELETED_FLAG, F.lit(False)).unionByName(
            not_in_quarantine.withColumn(DELETED_FLAG, F.lit(True)), allowMissingColumns=True)

        counts = {"valid": valid.count(), "invalid": invalid.count(), "deleted": deleted.count()}
        _write(silver_rows, outputs[0], f"silver_{table}", step.table.key, new_marks)
        _write(quarantine_rows, outputs[1], f"silver_quarantine_{table}", step.table.key, new_marks)
        return counts
    finally:
        cleaned.unpersist()
        changes.unpersist()


def silver_cycle(lake: Lake, table: str) -> dict[str, int]:
    """bronze/_changelog/<table> -> silver/<table> and silver/_quarantine/<table>; returns counts."""
    return write_silver(lake, plan_silver(lake, table))


def output_paths(root: str, decl: Declaration) -> dict[str, str]:
    """Every table an etl cycle writes, by `layer/name` (silver, silver_quarantine, gold): the cycle's own list."""
    outputs = {f"{layer}/{t}": where(t, root) for t in decl.tables
               for layer, where in (("silver", silver_path), ("silver_quarantine", quarantine_path))}
    if not gold_missing(decl):
        outputs |= {f"gold/{name}": gold_path(name, root) for name in (LTV, DAILY, STATE)}
    return outputs


def run_etl(lake: Lake) -> dict[str, dict[str, int]]:
    """One cycle: every declared table's silver from bronze, then gold from silver when the declaration has gold's
    inputs; returns counts per output table."""
    spark, root, decl = lake.spark, lake.root, lake.declaration
    missing = gold_missing(decl)
    # A SIGKILL while Hudi wrote a timeline file leaves it cut short on a local disk, and the table unreadable.
    for path in output_paths(root, decl).values():
        repair_torn_timeline(path)
    # Every table planned first: a declaration that does not fit bronze stops the cycle before it writes anything.
    steps = {table: plan_silver(lake, table) for table in decl.tables}
    report = {f"silver/{table}": console.timed(log, f"silver/{table}", partial(write_silver, lake, step))
              for table, step in steps.items()}
    if missing:
        log.info("gold: skipped, the declaration (%s) lacks its inputs: %s", decl.path, ", ".join(missing))
        return report
    gold = gold_cycle(spark, root, silver_path("customers", root), silver_path("orders", root))
    return report | {f"gold/{table}": counts for table, counts in gold.items()}
