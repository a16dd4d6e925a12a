"""Which tables' services have work, decided from the tables' files without Spark; and the jobs the DAGs map
over (pipelines/services/quality_due.py decides the same for the quality suites).

With tens of declared tables most of them are idle at any hour, and each Spark job costs seconds of
JVM start before it finds nothing to do. So the Airflow DAGs decide first, in their own worker
(`pipelines.lake.timeline_files`: file listings and a few small Avro reads, no JVM; on EMR the worker has
neither Spark nor Hudi), and start a job only for the tables this decides have work. Each job takes up to
`tables_per_job` of them (hudi_configs/table_services.toml [jobs]): one JVM start for several tables, and
every job's start and run in the lake pool's one slot, which the ETL shares.

A decision leans towards work: a table it calls due may turn out to have none (the job checks again),
but a table with work is never left out. Each rule mirrors what the service itself does (Hudi 1.0.2's
planners, `table_services.ServicesClient`):

- compact (merge-on-read): a compaction plan is pending, or a log file was written by a delta
  commit completed after the newest compaction plan (a table's first commit, bulk-inserted base
  files, has none);
- expire (day-partitioned append-only tables): two or more days hold live files and the oldest of
  those but the newest is not after the cleaner's earliest commit to retain (whether every reader
  has consumed them the job checks);
- cluster (append-only tables): a clustering plan is pending, or a partition the plan strategy
  takes (`hoodie.clustering.plan.*`) holds two or more live files under the small-file limit;
- clean: a clean or rollback is pending; a failed write waits to be rolled back (its heartbeat
  expired); or, as Hudi's planner needs, enough commits since the last clean
  (`hoodie.clean.max.commits`) and a rewrite of file groups (a compaction, a copy-on-write commit,
  a replace commit) from that clean's earliest commit to retain up to, not including, the one the
  retention gives now; also whenever compaction, expiry or clustering runs on the table (the job
  has started anyway, and a commit-count retention may free what they replace at once);
- archive: the active timeline holds more instants than `hoodie.keep.max.commits`. Cleaning and
  archival run together, as they always did.

Instant times are the writers' local time (Hudi's default timeline time zone, which the project
keeps): the deciding worker must run in the same zone as the jobs (UTC on EMR).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TypedDict

import hudi_configs
from pipelines.errors import SettingError
from pipelines.lake import storage
from pipelines.lake.catalog import LakeTable, lake_tables
from pipelines.lake.declaration import Declaration
from pipelines.lake.timeline_files import (
    HEARTBEAT_EXPIRY_MS,
    DataFile,
    Instant,
    data_files,
    instant_datetime,
    instant_metadata,
    instant_time,
    timeline,
)

log = logging.getLogger(__name__)

SERVICES = ("compact", "expire", "cluster", "clean", "archive")


def tables_per_job() -> int:
    """How many tables one mapped job of either DAG takes at most: hudi_configs/table_services.toml [jobs] (why
    there), with the deployment's overrides."""
    value = int(hudi_configs.section("table_services", "jobs")["tables_per_job"])
    if value < 1:
        raise SettingError(f"table_services.toml [jobs] tables_per_job = {value}: at least 1")
    return value


# A job's label (its mapped task's name in the UI, its Spark application's and EMR step's name) stays under the
# 250 characters Airflow keeps of a mapped task's label, and "lakehouse services " + it under EMR's 256 of a step's.
_LABEL_LIMIT = 200


def job_label(names: Sequence[str]) -> str:
    """What a job covers, in at most _LABEL_LIMIT characters: the names in full when they fit, else each folder
    once (`bronze/t00, t03; bronze/_changelog/t01`), else as many names as fit and how many more."""
    plain = ", ".join(names)
    if len(plain) <= _LABEL_LIMIT:
        return plain
    folders: dict[str, list[str]] = {}
    for name in names:
        folder, _, leaf = name.rpartition("/")
        folders.setdefault(folder, []).append(leaf)
    compact = "; ".join(f"{folder}/{', '.join(leaves)}" if folder else ", ".join(leaves)
                        for folder, leaves in folders.items())
    if len(compact) <= _LABEL_LIMIT:
        return compact
    for shown in range(len(names) - 1, 0, -1):
        if len(label := f"{', '.join(names[:shown])} and {len(names) - shown} more") <= _LABEL_LIMIT:
            return label
    return f"{len(names)} tables"


def chunked(items: Sequence, size: int) -> list[list]:
    return [list(items[at:at + size]) for at in range(0, len(items), size)]


class WorkItem(TypedDict):
    """A work item of the DAGs' mapped tasks (dags/lakehouse_common.mapped_spark_tasks), a plain dict for XCom."""

    label: str  # names the task in the UI
    tables: list[str]  # what the job covers
    args: list[str]  # the `lakehouse` command line of the job


def work_item(names: list[str], args: list[str]) -> WorkItem:
    """The work item of one `lakehouse` job over `names`."""
    return {"label": job_label(names), "tables": names, "args": args}


def log_jobs(jobs: list[WorkItem], per_job: int) -> None:
    """Which tables each mapped job covers, by its map index (its label may abbreviate them)."""
    log.info("%d jobs of at most %d tables each%s", len(jobs), per_job, ":" if jobs else ": nothing to run")
    for at, item in enumerate(jobs):
        log.info("  map index %d: %s", at, ", ".join(item["tables"]))


# --------------------------------------------------------------------------- table services

class Unfinished(str):
    """A reason that is work left half-done (a pending plan, clean or rollback, a failed write, a timeline file a
    crash cut short): until it is finished, what it covers stays as it is for every reader (log files unmerged,
    files not rolled back, a table readers fail on), so its table goes in the run's first job."""


@dataclass(frozen=True)
class ServicesWork:
    """One table's due services (in SERVICES order) and why each is due: its part of a `lakehouse services` job."""

    table: str
    why: dict[str, str]

    @property
    def services(self) -> tuple[str, ...]:
        return tuple(s for s in SERVICES if s in self.why)

    @property
    def urgency(self) -> int:
        """The order of the run's jobs, most urgent first: work left unfinished (0); compaction (1: log files,
        which every snapshot read of the table merges, grow with each batch of the stream); expiry or clustering
        (2: past days' files); cleaning and archival alone (3: storage and timeline length)."""
        if any(isinstance(reason, Unfinished) for reason in self.why.values()):
            return 0
        if "compact" in self.why:
            return 1
        return 2 if {"expire", "cluster"} & set(self.why) else 3

    def table_arg(self) -> str:
        """Its `--table` value: the table with its own services (`bronze/orders:compact,clean,archive`), so one job
        runs on each table of its chunk what is due there, no more."""
        return f"{self.table}:{','.join(self.services)}"

    def line(self) -> str:
        return f"{self.table}: " + "; ".join(f"{s} ({self.why[s]})" for s in self.services)


def _option(options: dict[str, str], key: str, default: str) -> str:
    """A Hudi option by its name, or by the `hoodie.cleaner.*` alias Hudi accepts for `hoodie.clean.*`."""
    return options.get(key) or options.get(key.replace("hoodie.clean.", "hoodie.cleaner.")) or default


def _retained_from(commits: list[Instant], options: dict[str, str], now: datetime) -> str | None:
    """The earliest commit the cleaner retains if it runs now (Hudi's CleanerUtils.getEarliestCommitToRetain);
    None when the retention keeps everything (Hudi then plans no clean and no expiry)."""
    policy = _option(options, "hoodie.clean.policy", "KEEP_LATEST_COMMITS")
    if policy == "KEEP_LATEST_BY_HOURS":
        since = instant_time(now - timedelta(hours=float(_option(options, "hoodie.clean.hours.retained", "24"))))
        return next((c.requested for c in commits if c.requested >= since), None)
    if policy == "KEEP_LATEST_COMMITS":
        keep = int(_option(options, "hoodie.clean.commits.retained", "10"))
        return commits[len(commits) - keep].requested if len(commits) > keep else None
    return commits[-1].requested if commits else None  # by file versions: any rewrite may have freed one


def _compact_due(instants: list[Instant], files: list[DataFile]) -> str | None:
    plans = [i for i in instants if i.action == "compaction"]
    if pending := [p.requested for p in plans if p.completed is None]:
        return Unfinished(f"compaction plan {pending[0]} pending")
    since = plans[-1].requested if plans else ""
    completed = {i.requested: i.completed for i in instants if i.completed_as == "deltacommit"}
    first = instants[0].requested

    def completion(f: DataFile) -> str:  # a log file older than the active timeline: its commit was archived
        return completed.get(f.instant) or (f.instant if f.instant < first else "")

    logs = [f for f in files if f.log and completion(f) > since]
    if logs:
        return f"{len(logs)} log files written since " + (f"compaction {since}" if since else "the table began")
    return None


def live_files(path: str) -> dict[str, list[DataFile]]:
    """Per partition of the table at `path`, the base files a snapshot read opens (`_live_files`)."""
    instants = timeline(path)
    return _live_files(path, instants, data_files(path)) if instants else {}


def _live_files(path: str, instants: list[Instant], files: list[DataFile]) -> dict[str, list[DataFile]]:
    """Per partition, the newest base file of each file group a reader reads: written by a completed commit and
    not replaced by a replace commit (clustering, expiry, an erasure's purge) whose files the cleaner has not
    deleted yet."""
    committed = {i.requested for i in instants if i.is_commit}
    first = instants[0].requested
    replaced: set[tuple[str, str]] = set()
    for instant in instants:
        if instant.completed_as == "replacecommit":
            meta = instant_metadata(path, instant)
            replaced |= {(p, f) for p, ids in (meta.get("partitionToReplaceFileIds") or {}).items() for f in ids}
    newest: dict[tuple[str, str], DataFile] = {}
    for f in files:
        if f.log or (f.instant not in committed and f.instant >= first) or (f.partition, f.file_id) in replaced:
            continue
        if (f.partition, f.file_id) not in newest or f.instant > newest[(f.partition, f.file_id)].instant:
            newest[(f.partition, f.file_id)] = f
    live: dict[str, list[DataFile]] = {}
    for (partition, _), f in sorted(newest.items()):
        live.setdefault(partition, []).append(f)
    return live


def _day(partition: str) -> str | None:
    """`_ingest_date=2026-11-22` -> `20261122`; None for a partition that is not a day."""
    value = partition.rsplit("=", 1)[-1]
    try:
        return datetime.strptime(value, "%Y-%m-%d").strftime("%Y%m%d")
    except ValueError:
        return None


def _expire_due(live: dict[str, list[DataFile]], commits: list[Instant], options: dict[str, str],
                now: datetime) -> str | None:
    days = sorted(p for p in live if p and _day(p))
    if len(days) < 2 or (retain := _retained_from(commits, options, now)) is None:
        return None
    if old := [d for d in days[:-1] if (_day(d) or "") <= retain[:8]]:
        return f"{len(old)} past days up to {old[-1]} at or before the retention's {retain[:8]}"
    return None


def _cluster_due(instants: list[Instant], live: dict[str, list[DataFile]], options: dict[str, str]) -> str | None:
    if pending := [i.requested for i in instants if i.action == "clustering" and i.completed is None]:
        return Unfinished(f"clustering plan {pending[0]} pending")
    partitions = sorted(live)
    if _option(options, "hoodie.clustering.plan.partition.filter.mode", "NONE") == "RECENT_DAYS":
        skip = int(_option(options, "hoodie.clustering.plan.strategy.daybased.skipfromlatest.partitions", "0"))
        back = int(_option(options, "hoodie.clustering.plan.strategy.daybased.lookback.partitions", "2"))
        partitions = sorted(partitions, reverse=True)[skip:skip + back]
    limit = int(_option(options, "hoodie.clustering.plan.strategy.small.file.limit", "314572800"))
    small = {p: n for p in partitions if (n := sum(f.size < limit for f in live[p])) >= 2}
    if small:
        return ", ".join(f"{n} small files in {p or 'the table'}" for p, n in small.items())
    return None


def _failed_writes(path: str, instants: list[Instant], now: datetime) -> list[str]:
    """Writes left pending whose heartbeat expired: the clean rolls them back (lazy failed-write cleaning)."""
    failed = []
    for i in instants:
        if i.completed is not None or i.action not in ("commit", "deltacommit", "replacecommit"):
            continue
        if (now - instant_datetime(i.requested)).total_seconds() * 1000 < HEARTBEAT_EXPIRY_MS:
            continue  # too young to have missed a heartbeat
        fs, beat = storage.filesystem(f"{path.rstrip('/')}/.hoodie/.heartbeat/{i.requested}")
        mtime = fs.get_file_info(beat).mtime
        if mtime is None or (datetime.now(UTC) - mtime.astimezone(UTC)).total_seconds() * 1000 >= HEARTBEAT_EXPIRY_MS:
            failed.append(i.requested)
    return failed


def _clean_due(path: str, instants: list[Instant], commits: list[Instant], options: dict[str, str],
               append_only: bool, now: datetime) -> str | None:
    if pending := [i for i in instants if i.completed is None and i.action in ("clean", "rollback")]:
        return Unfinished(f"{pending[0].action} {pending[0].requested} pending")
    if failed := _failed_writes(path, instants, now):
        return Unfinished(f"failed write {failed[0]} to roll back")
    cleans = [i for i in instants if i.completed_as == "clean"]
    last = instant_metadata(path, cleans[-1]) if cleans else {}
    since = last.get("lastCompletedCommitTimestamp") or ""
    if sum(c.requested > since for c in commits) < int(_option(options, "hoodie.clean.max.commits", "1")):
        return None
    if (retain := _retained_from(commits, options, now)) is None:
        return None
    kept = last.get("earliestCommitToRetain") or ""
    # What makes older file slices removable: a newer slice (a compaction, a copy-on-write commit) or replaced
    # file groups, once older than the earliest commit retained; those before the last clean's it has removed.
    # Append-only tables' commits only add file groups.
    rewrites = ("replacecommit",) if append_only else ("commit", "replacecommit")
    if freed := [c.requested for c in commits if c.completed_as in rewrites and kept <= c.requested < retain]:
        return f"{len(freed)} rewrites from {freed[0]} now older than the earliest commit retained, {retain}"
    return None


def _archive_due(instants: list[Instant], commits: list[Instant], options: dict[str, str]) -> str | None:
    keep = int(_option(options, "hoodie.keep.max.commits", "30"))
    others = sum(i.completed_as in ("clean", "rollback") for i in instants)
    if len(commits) > keep or others > keep:
        return f"{max(len(commits), others)} instants on the active timeline, more than {keep}"
    return None


def table_services_due(table: LakeTable, now: datetime | None = None) -> dict[str, str]:
    """The services due on `table` now, each with why; {} when none is (or the table has no commit yet)."""
    now = now or datetime.now()
    instants = timeline(table.path)
    commits = [i for i in instants if i.is_commit]
    if not commits:
        return {}
    options = hudi_configs.services(table.options)
    why: dict[str, str] = {}
    try:
        files = data_files(table.path) if table.merge_on_read or table.append_only else []
        if table.merge_on_read and (reason := _compact_due(instants, files)):
            why["compact"] = reason
        if table.append_only:
            live = _live_files(table.path, instants, files)
            if reason := _expire_due(live, commits, options, now):
                why["expire"] = reason
            if reason := _cluster_due(instants, live, options):
                why["cluster"] = reason
        if reason := _clean_due(table.path, instants, commits, options, table.append_only, now):
            why["clean"] = reason
        if reason := _archive_due(instants, commits, options):
            why["archive"] = reason
    except (OSError, ValueError, IndexError) as exc:  # a file a crash cut short: the job repairs it
        reason = Unfinished(f"timeline not readable here ({type(exc).__name__}: {exc}); "
                            "the job repairs it and decides")
        applicable = [s for s in SERVICES if (s != "compact" or table.merge_on_read)
                      and (s not in ("expire", "cluster") or table.append_only)]
        return dict.fromkeys(applicable, reason)
    if rewriting := [s for s in ("compact", "expire", "cluster") if s in why]:
        why.setdefault("clean", f"with {', '.join(rewriting)}: a commit-count retention may free what it replaces")
    if why:  # cleaning and archival run together, as they always did
        why.setdefault("clean", "with archive")
        why.setdefault("archive", "with clean")
    return why


def services_due(root: str, decl: Declaration, now: datetime | None = None) -> list[ServicesWork]:
    """Every table of the lake at `root` (`decl`'s catalog) with a due service, in the catalog's order (bronze
    first), one work item each."""
    return [ServicesWork(t.name, why) for t in lake_tables(root, decl) if (why := table_services_due(t, now))]


def services_work(root: str, decl: Declaration, now: datetime | None = None,
                  per_job: int | None = None) -> list[WorkItem]:
    """The `hudi_table_services` DAG's decision for the lake at `root` (`decl`'s tables): every table with a due
    service logged with why, the tables with nothing due named too; then the due tables in jobs of at most
    `per_job` (`tables_per_job()`), the most urgent first (`ServicesWork.urgency`; the catalog's order within a
    rank), each job's tables logged."""
    per_job = per_job or tables_per_job()
    work = services_due(root, decl, now)
    for w in work:
        log.info("due: %s", w.line())
    idle = [t.name for t in lake_tables(root, decl) if t.name not in {w.table for w in work}]
    log.info("%d tables with a service due; nothing due on the other %d: %s", len(work), len(idle), ", ".join(idle))
    ordered = sorted(work, key=lambda w: w.urgency)  # stable: the catalog's order within a rank
    jobs = [work_item([w.table for w in chunk], ["services", *(a for w in chunk for a in ("--table", w.table_arg()))])
            for chunk in chunked(ordered, per_job)]
    log_jobs(jobs, per_job)
    return jobs
