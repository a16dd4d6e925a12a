"""What each batch job pushes at the end of a run: its result turned into metric_names' metrics (no Spark here).

One function per job, called by its command (pipelines/cli/app.py, pipelines/gdpr/cli.py) with what the
run returned, so the figures pushed are the ones its summary line prints. Pushing, and how counters
add up over runs, is pipelines/monitoring/pushgateway.py's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from pipelines.lake.timeline_files import instant_metadata, timeline
from pipelines.monitoring import metric_names as m
from pipelines.monitoring.pushgateway import JobMetrics


def commits(path: str) -> set[str]:
    """The completed commits of a table's timeline (none for a table not made yet): taken before a run, the run's
    own commits are those after it that were not there."""
    try:
        return {i.requested for i in timeline(path) if i.is_commit and i.completed}
    except FileNotFoundError:
        return set()


def written(path: str, before: set[str]) -> tuple[int, int]:
    """Rows written and deleted by the table's commits that are not in `before`, from Hudi's own commit metadata
    (`numWrites`, `numDeletes` of each write stat: what Hudi's `totalRecordsWritten`/`totalRecordsDeleted` sum)."""
    writes = deletes = 0
    try:
        instants = [i for i in timeline(path) if i.is_commit and i.completed and i.requested not in before]
    except FileNotFoundError:
        return 0, 0
    for instant in instants:
        for stats in instant_metadata(path, instant).get("partitionToWriteStats", {}).values():
            for stat in stats:
                writes += int(stat.get("numWrites") or 0)
                deletes += int(stat.get("numDeletes") or 0)
    return writes, deletes


def etl(run: JobMetrics, report: Mapping[str, Mapping[str, int]], outputs: Mapping[str, str],
        before: Mapping[str, set[str]]) -> None:
    """`lakehouse etl`'s report ({"silver/orders": {"valid", "invalid", "deleted"}, "gold/...": ...}): per silver
    table the rows its rules checked and quarantined; per output table (`outputs`: "layer/name" -> path) the rows
    the run's commits wrote and deleted (`before`: each output's commits before the run)."""
    checked, quarantined = run.counter(m.SILVER_CHECKED_ROWS), run.counter(m.QUARANTINED_ROWS)
    for name, counts in report.items():
        layer, _, table = name.partition("/")
        if layer == "silver":  # every table's series, at 0 when nothing changed: a first increase is seen
            checked.labels(table).inc(counts.get("valid", 0) + counts.get("invalid", 0))
            quarantined.labels(table).inc(counts.get("invalid", 0))
    writes, deletes = run.counter(m.ETL_WRITTEN_ROWS), run.counter(m.ETL_DELETED_ROWS)
    for name, path in outputs.items():
        layer, _, table = name.partition("/")
        wrote, deleted = written(path, before.get(name, set()))
        writes.labels(layer, table).inc(wrote)
        deletes.labels(layer, table).inc(deleted)


def services(run: JobMetrics, report: Mapping[str, Mapping[str, Any]],
             timings: Mapping[str, Mapping[str, float]]) -> None:
    """`lakehouse services`' report (per table, what each service did) and the seconds each took."""
    for table, done in report.items():
        compact, cluster, clean = (done.get(s) or {} for s in ("compact", "cluster", "clean"))
        run.counter(m.SERVICE_COMPACTIONS).labels(table).inc(len(compact.get("executed") or ()))
        run.counter(m.SERVICE_CLUSTERINGS).labels(table).inc(len(cluster.get("executed") or ()))
        # A clean that found nothing returns no metadata, and says only files_deleted: 0.
        run.counter(m.SERVICE_CLEANS).labels(table).inc(1 if "earliest_retained" in clean else 0)
        run.counter(m.SERVICE_CLEANED_FILES).labels(table).inc(int(clean.get("files_deleted") or 0))
        run.counter(m.SERVICE_FAILURES).labels(table).inc(1 if "failed" in done else 0)
        for service, seconds in timings.get(table, {}).items():
            run.gauge(m.SERVICE_DURATION).labels(table, service).set(seconds)


def quality(run: JobMetrics, outcomes: Iterable[Any]) -> None:
    """`lakehouse quality`'s outcomes (`suite`, `success`): per table, suites passed and failed; per suite, its last."""
    suites, passed = run.counter(m.QUALITY_SUITES), run.gauge(m.QUALITY_SUITE_PASSED)
    for outcome in outcomes:
        table = outcome.suite.split(" ", 1)[0]  # "gold/customer_ltv -> silver/customers": its first table
        for name in ("passed", "failed"):
            suites.labels(table, name)
        suites.labels(table, "passed" if outcome.success else "failed").inc()
        passed.labels(outcome.suite).set(1 if outcome.success else 0)


class ErasureOutcome(Protocol):
    """What the erasure's metrics read of a certificate (pipelines.gdpr.certificate.Certificate)."""

    @property
    def verified(self) -> bool: ...

    @property
    def tables(self) -> Mapping[str, Mapping[str, Any]]: ...


def erasure(run: JobMetrics, certificates: Iterable[ErasureOutcome]) -> None:
    """`gdpr erase`'s certificates: requests by outcome, rows removed per table."""
    requests, rows = run.counter(m.ERASURE_REQUESTS), run.counter(m.ERASURE_ROWS)
    for status in ("verified", "not_verified"):
        requests.labels(status)
    for certificate in certificates:
        requests.labels("verified" if certificate.verified else "not_verified").inc()
        for table, done in certificate.tables.items():
            rows.labels(table).inc(int(done.get("rows_removed", 0)))


def inbox(run: JobMetrics, waiting: int, oldest: float | None) -> None:
    """The erasure inbox: requests waiting and when the oldest was filed (0: none)."""
    run.gauge(m.ERASURE_PENDING).set(waiting)
    run.gauge(m.ERASURE_OLDEST_PENDING).set(oldest or 0)
