"""Table services of the lake's Hudi tables: compaction, expiry, clustering, cleaning, archival.

Run by `lakehouse services` (and so by Airflow's `hudi_table_services`) beside the
writers, through Hudi's own write client with the table's writer options plus the
services and lock options of `hudi_configs/table_services.toml`: it is one more writer
of the table under optimistic concurrency control.

- compaction (merge-on-read tables): a plan is scheduled only when Hudi's planner finds
  file slices with log files; then every pending plan is executed, including a plan
  left by an earlier run that died;
- expiry (append-only tables): whole past days are dropped (Hudi delete_partition) once
  they are older than the retention and every reader of the table has consumed them. The
  commit records from when on checkpoints stay readable (hudi_timeline.READABLE_FROM_META);
  the deletes of the days dropped are first upserted into the table's delete ledger (the
  ingest job's memory of deletes past the change log's retention), and full reads of a
  change log also read bronze main and the ledger, which keep every key's newest state,
  so nothing is lost with the days;
- clustering (append-only tables: bronze's change logs, the one place where small files
  pile up, one or two per ingest batch): past days' small files are rewritten into few
  large ones. Safe for incremental readers: clustered rows keep their `_hoodie_commit_time`
  and readers keep only rows of their window's commits (pipelines/transform/changes.py), and the
  replaced files stay until the clustering commit is older than the retention;
- cleaning: removes file slices older than the table's retention (and rolls back failed
  writes whose heartbeat expired: lazy failed-write cleaning);
- archival: moves old instants out of the active timeline.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import hudi_configs
from pipelines.catalog import LAKE_TABLES, Table, lake_table
from pipelines.hudi_timeline import READABLE_FROM_META, checkpoint, consumed, meta_client, repair_torn_timeline
from pipelines.ingest.state import LEDGER_COLUMNS, hudi_options
from pipelines.settings import (
    quarantine_path,
    silver_path,
)
from pipelines.table_stats import exists
from pipelines.transform import gold
from pipelines.transform.etl import silver_options

log = logging.getLogger(__name__)

SERVICES = ("compact", "expire", "cluster", "clean", "archive")
# Hudi instant times: local time (the timeline time zone, LOCAL by default), to the millisecond.
_INSTANT = "%Y%m%d%H%M%S%f"


@dataclass(frozen=True)
class LakeTable:
    name: str  # as `lakehouse status` and the DAG's task ids spell it: bronze/customers, ...
    path: str
    options: dict[str, str] = field(repr=False)
    readers: tuple[str, ...] = ()  # tables that checkpoint their reads of this one: expiry waits for them
    # A change log's delete ledger (name, path, options): expiry moves the deletes of the days it drops there.
    ledger: tuple[str, str, dict[str, str]] | None = field(default=None, repr=False)

    @property
    def merge_on_read(self) -> bool:
        return self.options.get("hoodie.datasource.write.table.type") == "MERGE_ON_READ"

    @property
    def append_only(self) -> bool:
        return self.options.get("hoodie.datasource.write.operation") in ("insert", "bulk_insert")


def lake_tables(root: str) -> list[LakeTable]:
    """Every Hudi table the pipeline writes (pipelines.catalog), with the options its writer uses."""
    tables = []
    for t in LAKE_TABLES:
        path, options = t.path(root), writer_options(t)
        if t.writer == "changelog":  # silver reads it; expiry moves its deletes to the source's ledger
            ledger = lake_table(f"bronze/_deletes/{t.source}")
            tables.append(LakeTable(t.name, path, options,
                                    readers=(silver_path(t.source, root), quarantine_path(t.source, root)),
                                    ledger=(ledger.name, ledger.path(root), writer_options(ledger))))
        else:
            tables.append(LakeTable(t.name, path, options))
    return tables


def writer_options(table: Table) -> dict[str, str]:
    """The options the writer of a catalog table uses (hoodie.table.name: its name, with `_` for `/`)."""
    hudi_name = table.name.replace("/_", "_").replace("/", "_")
    if table.layer == "bronze":
        return hudi_options(table.writer, hudi_name)
    if table.layer == "silver":
        return silver_options(hudi_name)
    return gold.options(table.name.split("/", 1)[1])


class _Client:
    """A Hudi SparkRDDWriteClient on one table, with the services' options (`options`: others, as given)."""

    def __init__(self, spark: SparkSession, table: LakeTable, options: dict[str, str] | None = None) -> None:
        jvm = spark.sparkContext._jvm
        self._jvm = jvm
        self._spark = spark
        self._table = table
        hudi = jvm.org.apache.hudi
        self.meta = meta_client(spark, table.path)
        props = jvm.java.util.Properties()
        for key, value in (hudi_configs.services(table.options) if options is None else options).items():
            props.setProperty(key, value)
        schema = hudi.common.table.TableSchemaResolver(self.meta).getTableAvroSchema(False).toString()
        self._config = (hudi.config.HoodieWriteConfig.newBuilder().withPath(table.path).withProperties(props)
                        .withSchema(schema).build())
        self._context = hudi.client.common.HoodieSparkEngineContext(spark.sparkContext._jsc)
        self.client = hudi.client.SparkRDDWriteClient(self._context, self._config)

    def __enter__(self) -> _Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()

    def _pending(self, kind: str) -> list[str]:
        timeline = self.meta.reloadActiveTimeline()
        pending = getattr(timeline, f"filterPending{kind}Timeline")().getInstants().iterator()
        found = []
        while pending.hasNext():
            found.append(pending.next().requestedTime())
        return found

    def compact(self) -> dict[str, object]:
        planned = self.client.scheduleCompaction(self._jvm.org.apache.hudi.common.util.Option.empty())
        return {"planned": planned.get() if planned.isPresent() else None, "executed": self.run_compactions()}

    def run_compactions(self) -> list[str]:
        """Execute every pending compaction plan, oldest first (one a crash cut short is rolled back and run again)."""
        done = []
        for instant in self._pending("Compaction"):
            self.client.compact(instant)
            done.append(instant)
        return done

    def cluster(self) -> dict[str, object]:
        """Plan (days other than the newest, files under the small-file limit) and run every pending plan."""
        planned = self.client.scheduleClustering(self._jvm.org.apache.hudi.common.util.Option.empty())
        done = []
        for instant in self._pending("Clustering"):
            self.client.cluster(instant, True)
            done.append(instant)
        return {"planned": planned.get() if planned.isPresent() else None, "executed": done}

    def expire(self) -> dict[str, object]:
        """Drop the days (partitions) that are past the retention and that every reader has consumed.

        A day is a candidate when it is not the newest (ingest appends to it) and its date
        is not after the retention boundary: the cleaner's "earliest commit to retain",
        computed by Hudi's own CleanerUtils from the table's retention. The newest candidate
        E goes, with every older day, when each active commit that wrote any of those days
        is older than the boundary and completed no later than every reader's checkpoint.
        """
        hudi = self._jvm.org.apache.hudi
        days = sorted(hudi.common.fs.FSUtils.getAllPartitionPaths(
            self._context, self.meta.getStorage(), self._table.path, True))
        commits = self.meta.reloadActiveTimeline().getCommitsTimeline().filterCompletedInstants()
        retain = hudi.common.util.CleanerUtils.getEarliestCommitToRetain(
            self.meta.getActiveTimeline().getCommitsTimeline(), self._config.getCleanerPolicy(),
            self._config.getCleanerCommitsRetained(), self._jvm.java.time.Instant.now(),
            self._config.getCleanerHoursRetained(), self.meta.getTableConfig().getTimelineTimezone())
        if len(days) < 2 or not retain.isPresent():
            return {"expired": []}
        boundary = retain.get().requestedTime()
        candidates = [d for d in days[:-1] if _day(d).strftime("%Y%m%d") <= boundary[:8]]
        if not candidates:
            return {"expired": []}
        # Commits that may have written a candidate day: ingest days are UTC dates, instant times
        # local time, so a day's commits all start before the end of the next day.
        horizon = (_day(candidates[-1]) + timedelta(days=2)).strftime(_INSTANT)[:17]
        writes: dict[str, tuple[str, str]] = {}  # day -> (newest requested time, newest completion time)
        instants = commits.findInstantsBefore(horizon).getInstants().iterator()
        while instants.hasNext():
            instant = instants.next()
            for day in map(str, commits.readCommitMetadata(instant).getPartitionToWriteStats().keySet()):
                requested, completed = writes.get(day, ("", ""))
                writes[day] = (max(requested, instant.requestedTime()), max(completed, instant.getCompletionTime()))
        consumed = self._consumed()
        for i in range(len(candidates) - 1, -1, -1):
            dropped = candidates[: i + 1]
            seen = [writes[d] for d in dropped if d in writes]
            requested = max((r for r, _ in seen), default="")
            readable_from = max((c for _, c in seen), default="")
            if requested < boundary and (consumed is None or readable_from <= consumed):
                kept = self._keep_deletes(dropped)
                self._delete_partitions(dropped, readable_from)
                return {"expired": dropped, "readable_from": readable_from or None, "deletes_kept": kept}
        return {"expired": [], "waiting_for_readers": consumed}

    def _consumed(self) -> str | None:
        """The oldest checkpoint the table's readers hold on it (None: no reader has one)."""
        marks = [consumed(checkpoint(self._spark, r), self._table.path) for r in self._table.readers if exists(r)]
        return min((m for m in marks if m), default=None)

    def _keep_deletes(self, days: list[str]) -> int:
        """Upsert the deletes of `days` into the table's delete ledger before the days go.

        A change log is the ingest job's memory of deletes for the days it retains; the
        ledger keeps them after (an older insert replayed later must not bring a row back).
        Upserts ordered by `_lsn`: a re-run after a crash between this and the drop adds nothing.
        """
        if self._table.ledger is None:
            return 0
        _, path, options = self._table.ledger
        values = [_day(d).strftime("%Y-%m-%d") for d in days]
        deletes = (self._spark.read.format("hudi").load(self._table.path)
                   .filter(F.col("_ingest_date").isin(values) & (F.col("_op") == "d"))
                   .groupBy("id").agg(F.max_by(F.struct(*LEDGER_COLUMNS), F.col("_lsn")).alias("d"))
                   .select("d.*").localCheckpoint())
        n = deletes.count()
        if n:
            deletes.write.format("hudi").options(**hudi_configs.services(options)).mode("append").save(path)
        return n

    def _delete_partitions(self, days: list[str], readable_from: str) -> None:
        # Through the datasource: its commit carries the write options' `_lakehouse.*` metadata.
        empty = self._spark.read.format("hudi").load(self._table.path).limit(0)
        empty = empty.drop(*[c for c in empty.columns if c.startswith("_hoodie")])
        writer = empty.write.format("hudi").options(**hudi_configs.services(self._table.options)) \
            .option("hoodie.datasource.write.operation", "delete_partition") \
            .option("hoodie.datasource.write.partitions.to.delete", ",".join(days))
        if readable_from:
            writer = writer.option(READABLE_FROM_META, readable_from)
        writer.mode("append").save(self._table.path)

    def clean(self) -> dict[str, object]:
        meta = self.client.clean()
        if meta is None:
            return {"files_deleted": 0}
        return {"files_deleted": meta.getTotalFilesDeleted(), "earliest_retained": meta.getEarliestCommitToRetain()}

    def archive(self) -> dict[str, object]:
        before = self.meta.reloadActiveTimeline().countInstants()
        self.client.archive()
        return {"instants_archived": before - self.meta.reloadActiveTimeline().countInstants()}


def run_services(spark: SparkSession, root: str, tables: Sequence[str] | None = None,
                 services: tuple[str, ...] = SERVICES) -> dict[str, dict[str, object]]:
    """Run `services` on the named tables (all by default); returns what each did, per table.

    A table that does not exist yet is skipped; compaction applies to merge-on-read tables,
    clustering and expiry to append-only ones (the change logs).
    """
    known = {t.name: t for t in lake_tables(root)}
    names = list(tables) if tables else list(known)
    if unknown := [n for n in names if n not in known]:
        raise ValueError(f"unknown table(s) {', '.join(unknown)}: expected some of {', '.join(known)}")
    report: dict[str, dict[str, object]] = {}
    for name in names:
        table = known[name]
        repair_torn_timeline(table.path)  # a crashed writer's cut timeline file fails every reader of it
        if not exists(table.path):
            report[name] = {"skipped": "no table yet"}
            continue
        done: dict[str, object] = {}
        with _Client(spark, table) as client:
            for service in services:
                if (service == "compact" and not table.merge_on_read) or \
                        (service in ("cluster", "expire") and not table.append_only):
                    continue
                started = time.monotonic()
                done[service] = getattr(client, service)()
                log.info("%s %s: %s (%.1fs)", name, service, done[service], time.monotonic() - started)
        report[name] = done
    return report


def _day(partition: str) -> datetime:
    """`_ingest_date=2026-11-22` -> that date."""
    return datetime.strptime(partition.rsplit("=", 1)[-1], "%Y-%m-%d")
