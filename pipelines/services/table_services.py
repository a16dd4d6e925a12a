"""Table services of the lake's Hudi tables: compaction, expiry, clustering, cleaning, archival.

Run by `lakehouse services` (and so by Airflow's `hudi_table_services`: one job per group of the
tables `pipelines.services.due` finds work on, each table with its own due services) beside the
writers, through Hudi's own write client with the table's writer options plus the services and lock
options of `hudi_configs/table_services.toml`: it is one more writer of the table under optimistic
concurrency control.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

import hudi_configs
from pipelines.errors import UnknownTable
from pipelines.lake.catalog import LakeTable, lake_tables
from pipelines.lake.frames import materialized
from pipelines.lake.hudi_timeline import READABLE_FROM_META, checkpoint, consumed
from pipelines.lake.layout import LEDGER_COLUMNS
from pipelines.lake.table_stats import has_completed_commit
from pipelines.lake.timeline_repair import repair_torn_timeline
from pipelines.metastore import catalog_sync
from pipelines.runtime import console
from pipelines.runtime.hudi_client import WriteClient
from pipelines.runtime.hudi_writes import save
from pipelines.runtime.lake import Lake
from pipelines.services.due import SERVICES

log = logging.getLogger(__name__)
# Hudi instant times: local time (the timeline time zone, LOCAL by default), to the millisecond.
_INSTANT = "%Y%m%d%H%M%S%f"


class ServicesClient(WriteClient):
    """The write client with the services that are the lake's own: the change logs' expiry."""

    def expire(self) -> dict[str, object]:
        """Drop the days (partitions) that are past the retention and that every reader has consumed.

        A day is a candidate when it is not the newest (ingest appends to it) and its date
        is not after the retention boundary: the cleaner's "earliest commit to retain",
        computed by Hudi's own CleanerUtils from the table's retention. The newest candidate
        E goes, with every older day, when each active commit that wrote any of those days
        is older than the boundary and completed no later than every reader's checkpoint.
        """
        hudi = self.jvm.org.apache.hudi
        days = sorted(hudi.common.fs.FSUtils.getAllPartitionPaths(
            self.context, self.meta.getStorage(), self.table.path, True))
        commits = self.meta.reloadActiveTimeline().getCommitsTimeline().filterCompletedInstants()
        retain = hudi.common.util.CleanerUtils.getEarliestCommitToRetain(
            self.meta.getActiveTimeline().getCommitsTimeline(), self.config.getCleanerPolicy(),
            self.config.getCleanerCommitsRetained(), self.jvm.java.time.Instant.now(),
            self.config.getCleanerHoursRetained(), self.meta.getTableConfig().getTimelineTimezone())
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
        marks = [consumed(checkpoint(self.spark, r), self.table.path) for r in self.table.readers
                 if has_completed_commit(r)]
        return min((m for m in marks if m), default=None)

    def _keep_deletes(self, days: list[str]) -> int:
        """Upsert the deletes of `days` into the table's delete ledger before the days go.

        A change log is the ingest job's memory of deletes for the days it retains; the
        ledger keeps them after (an older insert replayed later must not bring a row back).
        Upserts ordered by `_lsn`: a re-run after a crash between this and the drop adds nothing.
        """
        if self.table.ledger is None:
            return 0
        _, path, options = self.table.ledger
        values = [_day(d).strftime("%Y-%m-%d") for d in days]
        deletes = materialized(self.spark.read.format("hudi").load(self.table.path)
                               .filter(F.col("_ingest_date").isin(values) & (F.col("_op") == "d"))
                               .groupBy(*self.table.key)
                               .agg(F.max_by(F.struct(*self.table.key, *LEDGER_COLUMNS), F.col("_lsn")).alias("d"))
                               .select("d.*"))
        n = deletes.count()
        if n:
            save(deletes, path, hudi_configs.services(options))
            catalog_sync.committed(self.spark, path, options)
        return n

    def _delete_partitions(self, days: list[str], readable_from: str) -> None:
        # Through the datasource: its commit carries the write options' `_lakehouse.*` metadata.
        empty = self.spark.read.format("hudi").load(self.table.path).limit(0)
        empty = empty.drop(*[c for c in empty.columns if c.startswith("_hoodie")])
        options = {**hudi_configs.services(self.table.options), "hoodie.datasource.write.operation": "delete_partition",
                   "hoodie.datasource.write.partitions.to.delete": ",".join(days)}
        if readable_from:
            options[READABLE_FROM_META] = readable_from
        save(empty, self.table.path, options)



@dataclass(frozen=True)
class ServicesPlan:
    """Which services run where: `services` on the named `tables` (None: every table), and a table in `per_table`
    its own there instead. Built once by the caller (the CLI's --table and --only)."""

    tables: Sequence[str] | None = None
    services: tuple[str, ...] = SERVICES
    per_table: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def run_services(lake: Lake, plan: ServicesPlan | None = None, *, keep_going: bool = False,
                 timings: dict[str, dict[str, float]] | None = None) -> dict[str, dict[str, object]]:
    """Run the `plan`'s services on the lake's tables (all of them on every table of its declaration by default);
    returns what each did, per table.

    A table that does not exist yet is skipped; compaction applies to merge-on-read tables,
    clustering and expiry to append-only ones (the change logs). With `keep_going`, a table whose
    services fail is logged and reported (`failed`), and the next tables' services run anyway: a job
    of the DAG takes several tables, and one table's failure must not put off the others' work by an
    hour. `timings` gets the seconds each service took, per table (the services job pushes them).
    """
    plan = plan or ServicesPlan()
    known = {t.name: t for t in lake_tables(lake.root, lake.declaration)}
    names = list(plan.tables) if plan.tables else list(known)
    if unknown := [n for n in names if n not in known]:
        raise UnknownTable(f"unknown table(s) {', '.join(unknown)}: expected some of {', '.join(known)}")
    report: dict[str, dict[str, object]] = {}
    for name in names:
        done: dict[str, object] = {}
        try:
            report[name] = _run_table(lake.spark, known[name], plan.per_table.get(name, plan.services), done,
                                      timings.setdefault(name, {}) if timings is not None else {})
        except Exception as exc:
            if not keep_going:
                raise
            log.exception("%s: services failed after %s", name, ", ".join(done) or "none")
            report[name] = {**done, "failed": console.first_line(exc)}
    return report


def _run_table(spark: SparkSession, table: LakeTable, services: tuple[str, ...],
               done: dict[str, object], seconds: dict[str, float]) -> dict[str, object]:
    """Run `services` on `table`, recording into `done` what each did as it goes (a failure's report keeps it)."""
    repair_torn_timeline(table.path)  # a crashed writer's cut timeline file fails every reader of it
    if not has_completed_commit(table.path):
        return {"skipped": "no table yet"}
    with ServicesClient(spark, table) as client:
        for service in services:
            if (service == "compact" and not table.merge_on_read) or \
                    (service in ("cluster", "expire") and not table.append_only):
                continue
            started = time.monotonic()
            done[service] = getattr(client, service)()
            seconds[service] = time.monotonic() - started
            log.info("%s %s: %s (%.1fs)", table.name, service, done[service], seconds[service])
    # A compaction or a clustering is a commit of the timeline, an expiry drops partitions.
    catalog_sync.committed(spark, table.path, table.options)
    return done


def _day(partition: str) -> datetime:
    """`_ingest_date=2026-11-22` -> that date."""
    return datetime.strptime(partition.rsplit("=", 1)[-1], "%Y-%m-%d")
