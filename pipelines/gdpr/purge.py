"""The sweep and the purge: the subjects' rows deleted from every table, then every older version
that still holds them (savepoints, log files, change-feed files, cleaned slices, metadata tables)
removed. Steps 3 and 4 of pipelines.gdpr.erase.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.gdpr.find import Target, each_table, read_rows, source_of
from pipelines.gdpr.scan import Subject, scan_lake
from pipelines.lake.buckets import bucketed, check_buckets
from pipelines.lake.catalog import LakeTable, gold_declared, lake_tables
from pipelines.lake.erasure_registry import dead_letters_of_erased, key_in
from pipelines.lake.frames import materialized
from pipelines.lake.hudi_timeline import (
    ERASURE_META,
    PURGE_FROM_META,
    READABLE_FROM_META,
    earliest_retained,
    latest_completion,
    latest_extra,
    newest_change,
    pending_writes,
)
from pipelines.lake.layout import BUCKETS_META, DELETED_FLAG, POSITIONS_META, dead_letter_path, gold_path, silver_path
from pipelines.lake.table_stats import has_completed_commit
from pipelines.metastore import catalog_sync
from pipelines.runtime.hudi_client import WriteClient
from pipelines.runtime.hudi_writes import save
from pipelines.runtime.lake import Lake
from pipelines.transform import gold

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- sweep


def _delete_rows(spark: SparkSession, table: LakeTable, rows: DataFrame) -> None:
    """Delete the rows through the table's own writer options (key, partition, index, lock).

    Tables whose rows carry `_hoodie_is_deleted` get an upsert of the rows flagged, at their
    own ordering value, as every other delete of theirs; the others (change logs, ledgers,
    dead letters) a delete of their keys.
    """
    data = rows.drop(*[c for c in rows.columns if c.startswith("_hoodie_") and c != DELETED_FLAG])
    if DELETED_FLAG in data.columns:
        data, operation = data.withColumn(DELETED_FLAG, F.lit(True)), "upsert"
    else:
        operation = "delete"
    if bucketed(table.options):  # a delete hashed into another bucket than its row's would miss it
        newest = latest_extra(spark, table.path, POSITIONS_META) or {}  # the newest ingest commit
        check_buckets(table.name, table.path, table.options, newest.get(BUCKETS_META))
    options = {**table.options, "hoodie.datasource.write.operation": operation}
    save(data, table.path, options)
    catalog_sync.committed(spark, table.path, table.options)


def sweep(lake: Lake, target: Target, registry: DataFrame) -> dict[str, dict[str, object]]:
    """Delete the subject's rows from every table of the lake that holds rows of it; then let gold follow silver.

    In the tables of each declared table with a subject: every version naming the customers, and
    every version of their rows (`target.rows`, by that table's own key); in gold, the customers'
    rows; in the dead letters, the records naming an erased customer or row (the registry's
    pseudonyms under the lake's erasure key, which `register` wrote first).
    """
    spark, root, decl = lake.spark, lake.root, lake.declaration

    def one(table: LakeTable) -> tuple[str, dict[str, object]] | None:
        if table.path == dead_letter_path(root):
            mine = dead_letters_of_erased(read_rows(spark, table.path), registry, lake.erasure_key, decl)
        else:
            df = read_rows(spark, table.path)
            predicate = target.predicate(table.name, df)
            if predicate is None:
                return None
            mine = df.filter(predicate)
        mine = materialized(mine)
        n = mine.count()
        if not n:
            return None
        _delete_rows(spark, table, mine)
        log.info("%s: %d rows deleted", table.name, n)
        return table.name, {"rows_removed": n, "instant": latest_completion(spark, table.path)}

    done = each_table([t for t in lake_tables(root, decl) if has_completed_commit(t.path)], one)
    touched: dict[str, dict[str, object]] = dict(d for d in done if d is not None)
    # Gold reads the shop's silver customers and orders (when they are declared, gold_declared).
    if gold_declared(decl) and any(name in ("silver/customers", "silver/orders") for name in touched):
        before = {t: latest_completion(spark, gold_path(t, root)) for t in (gold.STATE, gold.LTV, gold.DAILY)}
        gold.gold_cycle(spark, root, silver_path("customers", root), silver_path("orders", root))
        for t, was in before.items():
            now = latest_completion(spark, gold_path(t, root))
            if now != was:
                touched[f"gold/{t}"] = {"recomputed": True, "instant": now}
    return touched


# ---------------------------------------------------------------- purge of older versions


class Purger(WriteClient):
    """The services client with the settings of an erasure: keep only the newest version of everything."""

    OVERRIDES: ClassVar[dict[str, str]] = {
        "hoodie.clean.policy": "KEEP_LATEST_COMMITS",
        "hoodie.clean.commits.retained": "1",
        "hoodie.cleaner.commits.retained": "1",
        # A clean whenever asked, whatever the table's own trigger (the dead letters' waits for 10 commits).
        "hoodie.clean.trigger.strategy": "NUM_COMMITS",
        "hoodie.clean.max.commits": "1",
    }

    def __init__(self, spark: SparkSession, table: LakeTable) -> None:
        super().__init__(spark, LakeTable(table.name, table.path, {**table.options, **self.OVERRIDES}))

    def savepoints(self) -> list[str]:
        found, it = [], self.meta.reloadActiveTimeline().getSavePointTimeline().filterCompletedInstants() \
            .getInstants().iterator()
        while it.hasNext():
            found.append(it.next().requestedTime())
        return found

    def compact_all(self, after: str) -> list[str]:
        """Compact until a compaction planned after `after` (the sweep) has run: no log file predates it."""
        done: list[str] = []
        for _ in range(4):
            report = self.compact()
            done += report["executed"]
            # Done once a plan made after the sweep ran, or when nothing had log files to compact.
            if any(instant > after for instant in done) or not (report["planned"] or report["executed"]):
                break
        return done

    def newest_slices(self) -> list[tuple[str, str, str]]:
        """(partition, file id, base instant) of the newest file slice of every file group."""
        hudi = self.jvm.org.apache.hudi
        view = hudi.common.table.view.HoodieTableFileSystemView.fileListingBasedFileSystemView(
            self.context, self.meta, self.meta.reloadActiveTimeline().getCommitsTimeline().filterCompletedInstants())
        found = []
        for partition in hudi.common.fs.FSUtils.getAllPartitionPaths(
                self.context, self.meta.getStorage(), self.table.path, False):
            slices = view.getLatestFileSlices(partition).iterator()
            while slices.hasNext():
                piece = slices.next()
                found.append((partition, piece.getFileId(), piece.getBaseInstantTime()))
        view.close()
        return found

    def slices_written_since(self, since: str) -> list[str]:
        """File ids whose newest file slice a commit started at or after `since` wrote."""
        return [file_id for _, file_id, base in self.newest_slices() if base >= since]

    def clean_up_to(self, marker: str, timeout: float = 300) -> list[dict[str, object]]:
        """Clean until the cleaner keeps nothing older than `marker`.

        The cleaner never goes past a write in flight: a concurrent writer's commit that
        started before the marker holds it back until it ends.
        """
        cleans, deadline = [], time.monotonic() + timeout
        while True:
            while [i for i in pending_writes(self.spark, self.table.path) if i < marker] \
                    and time.monotonic() < deadline:
                time.sleep(1)
            cleans.append(done := self.clean())
            # Hudi 1.0.2 records no clean when its plan is empty: then nothing older is left
            # (keeping one commit, the plan covers every slice the newest ones replaced).
            if "earliest_retained" not in done \
                    or (earliest_retained(self.spark, self.table.path) or "") >= marker \
                    or time.monotonic() > deadline:
                return cleans
            time.sleep(2)  # never hold the table's lock in a tight loop: writers need it to commit

    def metadata_partitions(self) -> set[str]:
        return set(self.meta.getTableConfig().getMetadataPartitions())

    def marker(self, readable_from: str, purge_from: str | None) -> str:
        """An empty replace commit saying that no incremental read may start before `readable_from`, and, with
        `purge_from`, that a reader at or after it may read on from this marker (PURGE_FROM_META)."""
        jvm = self.jvm
        self.meta.reloadActiveTimeline()
        action = jvm.org.apache.hudi.common.table.timeline.HoodieTimeline.REPLACE_COMMIT_ACTION
        self.client.setOperationType(jvm.org.apache.hudi.common.model.WriteOperationType.CLUSTER)
        instant = self.client.startCommit(action, self.meta)
        requested = self.meta.createNewInstant(
            jvm.org.apache.hudi.common.table.timeline.HoodieInstant.State.REQUESTED, action, instant)
        self.meta.reloadActiveTimeline().transitionReplaceRequestedToInflight(
            requested, jvm.org.apache.hudi.common.util.Option.empty())
        extra = jvm.java.util.HashMap()
        extra.put(READABLE_FROM_META, readable_from)
        extra.put(ERASURE_META, "purge")
        if purge_from is not None:
            extra.put(PURGE_FROM_META, purge_from)
        empty = self.spark.sparkContext._jsc.emptyRDD()
        self.client.commit(instant, empty, jvm.org.apache.hudi.common.util.Option.of(extra), action,
                           jvm.java.util.HashMap())
        return instant


def change_feed_holders(lake: Lake, subject: Subject) -> dict[str, set[str]]:
    """Per table with a change feed, the file groups whose newest slice has a `.cdc` file holding the subject.

    A commit that changed one of the subject's rows before the erasure (an update, a move to
    quarantine, a delete in the source) keeps the before-image in the `.cdc` file of the
    slice it wrote. While that slice is the newest of its file group no clean removes it,
    and the sweep, which found no live row there, did not write the file group: it must be
    written once more, like those the sweep wrote. Only those files are decoded.
    """
    # "<table>/<partition>/.<file id>_<instant>", what a `.cdc` file's path starts with -> (table, file id)
    newest: dict[str, tuple[str, str]] = {}
    for table in lake_tables(lake.root, lake.declaration):
        if table.options.get("hoodie.table.cdc.enabled") != "true" or not has_completed_commit(table.path):
            continue
        with Purger(lake.spark, table) as client:
            for partition, file_id, base in client.newest_slices():
                stem = "/".join(p for p in (table.name, partition, f".{file_id}_{base}") if p)
                newest[stem] = (table.name, file_id)

    def in_newest_slice(rel: str) -> bool:
        return rel.endswith(".cdc") and rel.rsplit(".log.", 1)[0] in newest

    found: dict[str, set[str]] = {}
    for finding in scan_lake(lake, subject, only=in_newest_slice).findings:
        name, file_id = newest[finding.path.rsplit(".log.", 1)[0]]
        found.setdefault(name, set()).add(file_id)
    return found


@dataclass(frozen=True)
class PurgePlan:
    """What one purge removes, decided by the erasure before it runs.

    `names`: the tables purged, their versions older than the sweep (`sweep_started`, an instant)
    going. `moved`: per declared table, the keys (key_text) of rows now of another customer whose
    older versions named the subject. The change-feed files of the commit that moved one hold that
    version as a before-image in the newest slice of its file group, which no clean removes: those
    file groups are written once more too. `holders`: file groups per table whose newest `.cdc` files
    hold the subject (change_feed_holders), written once more as well.
    """

    names: frozenset[str]
    sweep_started: str
    moved: dict[str, frozenset[str]] = field(default_factory=dict)
    holders: dict[str, set[str]] = field(default_factory=dict)


def purge(lake: Lake, plan: PurgePlan, progress: Callable[[str], None]) -> dict[str, dict[str, object]]:
    """Remove every older version of the plan's tables of the lake that may still hold the subject."""
    spark, sweep_started, moved, holders = lake.spark, plan.sweep_started, plan.moved, plan.holders

    def one(table: LakeTable) -> dict[str, object]:
        progress(f"purging {table.name}")
        started = time.monotonic()
        done: dict[str, object] = {}
        with Purger(spark, table) as client:
            if savepoints := client.savepoints():
                for instant in savepoints:
                    client.client.deleteSavepoint(instant)
                done["savepoints_deleted"] = savepoints
            if table.merge_on_read:
                done["compactions"] = client.compact_all(sweep_started)
            if table.options.get("hoodie.table.cdc.enabled") == "true":
                # The change-feed files of the erasure's own commits hold the deleted rows'
                # before-images, in the newest slice: write those file groups once more.
                file_ids = set(client.slices_written_since(sweep_started))
                decl = source_of(table.name, lake.declaration)
                if moved and decl is not None and moved.get(decl.name):
                    file_ids |= _file_groups_of(spark, table, decl.key, moved[decl.name])
                file_ids |= holders.get(table.name, set())
                done["rewritten_file_groups"] = _rewrite(spark, table, sorted(file_ids))
            readable_from = latest_completion(spark, table.path)
            assert readable_from is not None, f"{table.name} has completed commits"
            # Readers that had read the newest change may read on after the marker (an earlier round's purge and
            # this one changed no row since).
            done["marker"] = marker = client.marker(readable_from, newest_change(spark, table.path, readable_from))
            done["cleans"] = client.clean_up_to(marker)
            if savepoints:
                client.client.savepoint("lakehouse-gdpr", "re-created after an erasure")
                done["savepoint_recreated"] = latest_completion(spark, table.path)
            # The record index (and column stats, on tables written before they were turned
            # off) keep deleted keys and values in the metadata table's logs and HFiles.
            rebuild = client.metadata_partitions() - {"files"}
        if rebuild:
            _rebuild_metadata(spark, table)
            done["metadata_table_rebuilt"] = sorted(rebuild)
        # Its compactions, rewrites and cleans are commits the catalog has not seen.
        catalog_sync.committed(spark, table.path, table.options)
        done["seconds"] = round(time.monotonic() - started, 1)
        return done

    tables = [t for t in lake_tables(lake.root, lake.declaration) if t.name in plan.names
              and has_completed_commit(t.path)]
    return {t.name: done for t, done in zip(tables, each_table(tables, one), strict=True)}


def _file_groups_of(spark: SparkSession, table: LakeTable, key: tuple[str, ...], keys: frozenset[str]) -> set[str]:
    """File ids of the file groups holding these keys (key_text of the `key` columns) now."""
    rows = read_rows(spark, table.path).filter(key_in(key, keys)).select("_hoodie_file_name").distinct().collect()
    return {r[0].split("_")[0] for r in rows}


def _rewrite(spark: SparkSession, table: LakeTable, file_ids: list[str]) -> int:
    """Upsert the rows of these file groups unchanged: each gets a new slice, the old one goes with the clean."""
    if not file_ids:
        return 0
    rows = read_rows(spark, table.path).filter(F.split("_hoodie_file_name", "_")[0].isin(file_ids))
    rows = materialized(rows.drop(*[c for c in rows.columns if c.startswith("_hoodie_") and c != DELETED_FLAG]))
    if rows.isEmpty():
        return 0
    # Marked as the erasure's: it changes no row, readers have nothing to read of it (newest_change).
    save(rows, table.path, {**table.options, "hoodie.datasource.write.operation": "upsert", ERASURE_META: "rewrite"})
    return len(file_ids)


def _rebuild_metadata(spark: SparkSession, table: LakeTable) -> None:
    """Drop the metadata table (its logs and HFiles keep deleted keys) and build it again from the files."""
    with Purger(spark, table) as client:
        jvm = client.jvm
        util = jvm.org.apache.hudi.metadata.HoodieTableMetadataUtil
        util.deleteMetadataTable(client.meta, client.context, False)
        writer = jvm.org.apache.hudi.metadata.SparkHoodieBackedTableMetadataWriter.create(
            client.meta.getStorageConf(), client.config, client.context)
        writer.close()
