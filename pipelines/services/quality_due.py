"""Which quality suites have something new to check, decided from the tables' timelines without Spark:
the `data_quality` DAG's decision, as pipelines/services/due.py is the table services'.

A quality suite is due when a table it reads has a commit that changed data (not a compaction or
clustering) since the instant its last passing check recorded, when its declaration changed, or
(bronze) when the table's newest change is older than the freshness limit: that check fails without
any new commit, and must. A failed suite records nothing and is checked again on the next run.
Records are one small JSON file per suite in `<lake>/_quality/checked/`; deleting them makes the
next run check everything.

Instant times are the writers' local time (Hudi's default timeline time zone, which the project
keeps): the deciding worker must run in the same zone as the jobs (UTC on EMR).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from pipelines.lake import storage
from pipelines.lake.catalog import gold_declared, lake_table
from pipelines.lake.declaration import Declaration
from pipelines.lake.timeline_files import instant_datetime, timeline
from pipelines.services.due import WorkItem, chunked, log_jobs, tables_per_job, work_item

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SuiteSpec:
    """A quality suite as the decision sees it: the tables it reads, what defines its checks, the job it runs in."""

    name: str  # as `lakehouse quality` reports it: "silver/orders", "gold/customer_ltv -> silver/customers"
    inputs: tuple[str, ...]  # the lake tables it reads
    group: str  # the job that runs it: its declared table, or "gold"
    definition: str = ""  # a digest of the declaration its checks come from ("" for gold's, which are code)

    @property
    def layer(self) -> str:
        return self.name.split("/", 1)[0]

    @property
    def file_name(self) -> str:
        """Its name as a file name (also Great Expectations' asset name)."""
        return self.name.replace("/", ".").replace(" -> ", "__")


def _digest(value: object) -> str:
    return hashlib.sha256(repr(value).encode()).hexdigest()[:16]


def quality_suites(decl: Declaration) -> list[SuiteSpec]:
    """Every suite of `lakehouse quality` for declaration `decl`, in its order: each declared table's bronze and
    silver suites, then gold's when gold runs. Pure Python: the DAG decides from it."""
    specs = [SuiteSpec(f"bronze/{n}", (f"bronze/{n}",), n, _digest(t)) for n, t in decl.tables.items()]
    specs += [SuiteSpec(f"silver/{n}", (f"silver/{n}", f"silver/_quarantine/{n}"), n, _digest(t))
              for n, t in decl.tables.items()]
    if gold_declared(decl):
        specs += [SuiteSpec("gold/customer_ltv", ("gold/customer_ltv", "silver/customers"), "gold"),
                  SuiteSpec("gold/customer_ltv -> silver/customers", ("gold/customer_ltv", "silver/customers"),
                            "gold"),
                  SuiteSpec("gold/daily_revenue", ("gold/daily_revenue",), "gold"),
                  SuiteSpec("gold/daily_revenue -> silver/orders", ("gold/daily_revenue", "silver/orders"), "gold")]
    return specs


def quality_root(root: str) -> str:
    """The lake's quality folder: Great Expectations' project, its Data Docs, and the records of passed checks."""
    return f"{root.rstrip('/')}/_quality"


def _record_path(quality: str, spec: SuiteSpec) -> str:
    return f"{quality}/checked/{spec.file_name}.json"


def newest_change(path: str) -> str | None:
    """Instant of the newest completed commit of the table at `path` that changed rows; None if it has none."""
    changes = [i.requested for i in timeline(path) if i.changes_data]
    return changes[-1] if changes else None


def suite_versions(spec: SuiteSpec, root: str, decl: Declaration) -> dict[str, str | None]:
    """Each table the suite reads (of `decl`'s catalog, at `root`) -> its newest change: what a passing check of it
    vouches for."""
    return {name: newest_change(lake_table(name, decl).path(root)) for name in spec.inputs}


@dataclass(frozen=True)
class Record:
    """What the last passing check of a suite vouched for."""

    versions: dict[str, str | None]
    definition: str
    checked_at: str

    def json(self) -> str:
        return json.dumps({"versions": self.versions, "definition": self.definition, "checked_at": self.checked_at},
                          sort_keys=True)


def record_checked(quality: str, spec: SuiteSpec, versions: dict[str, str | None]) -> None:
    """Record in the quality folder `quality` (the lake's, or the local copy a run works in, which goes back to an
    object store with the rest) that `spec` passed on its tables as of `versions` (read before the check began: a
    commit during the check leaves the suite due)."""
    storage.write_text(_record_path(quality, spec),
                       Record(versions, spec.definition, datetime.now(UTC).isoformat(timespec="seconds")).json())


def last_checked(root: str, spec: SuiteSpec) -> Record | None:
    path = _record_path(quality_root(root), spec)
    if not storage.exists(path):
        return None
    data = json.loads(storage.read_text(path))
    return Record(data["versions"], data["definition"], data["checked_at"])


@dataclass(frozen=True)
class SuiteDecision:
    spec: SuiteSpec
    due: bool
    why: str


def _suite_decision(spec: SuiteSpec, root: str, decl: Declaration, max_age: timedelta,
                    now: datetime) -> SuiteDecision:
    """Whether `spec` is due and why: what its last passing check vouched for against its tables now."""
    versions = suite_versions(spec, root, decl)
    record = last_checked(root, spec)
    if record is None:
        return SuiteDecision(spec, True, "never passed a check")
    if record.definition != spec.definition:
        return SuiteDecision(spec, True, "its declaration changed")
    if changed := [f"{t} at {v}" for t, v in versions.items() if record.versions.get(t) != v]:
        return SuiteDecision(spec, True, "changed: " + ", ".join(changed))
    newest = versions.get(spec.inputs[0])
    if spec.layer == "bronze" and (newest is None or instant_datetime(newest) < now - max_age):
        return SuiteDecision(spec, True, f"no change for more than {max_age}: the freshness check is due")
    since = ", ".join(f"{t} at {v}" for t, v in versions.items())
    return SuiteDecision(spec, False, f"unchanged since its check at {record.checked_at} ({since})")


def quality_due(root: str, decl: Declaration, max_age: timedelta = timedelta(hours=24),
                now: datetime | None = None) -> list[SuiteDecision]:
    """Every suite of `decl` on the lake at `root` with whether it is due and why (an unchanged one: since when)."""
    now = now or datetime.now()
    return [_suite_decision(spec, root, decl, max_age, now) for spec in quality_suites(decl)]


def quality_work(root: str, decl: Declaration, max_age: timedelta = timedelta(hours=24), now: datetime | None = None,
                 per_job: int | None = None) -> list[WorkItem]:
    """The `data_quality` DAG's decision for the lake at `root` and its declaration `decl`: every suite logged
    (checked, and why, or not checked again, and since when); then the declared tables with due suites (their
    bronze and silver ones), and gold's, in jobs of at most `per_job` of them (`tables_per_job()`), in the
    declaration's order (gold last: its suites read silver's tables), each job's tables logged."""
    per_job = per_job or tables_per_job()
    groups: dict[str, list[str]] = {}
    for d in quality_due(root, decl, max_age, now):
        log.info("%s: %s %s", d.spec.name, "checked:" if d.due else "not checked again,", d.why)
        if d.due:
            groups.setdefault(d.spec.group, []).append(d.spec.name)
    jobs = [work_item([group for group, _ in chunk],
                      ["quality", *(a for _, names in chunk for name in names for a in ("--suite", name))])
            for chunk in chunked(list(groups.items()), per_job)]
    log_jobs(jobs, per_job)
    return jobs
