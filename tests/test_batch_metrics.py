"""The batch jobs' pushes, scraped by the real Prometheus from the real Pushgateway: each metric at the value the
job's own output says, or the lake's tables say, and Hudi's own reporter's series beside them.

The commands run in this process (`run_cli`: the suite's Spark session, no JVM to start) on a copy of the
base lake, with LAKEHOUSE_PUSHGATEWAY pointing at a gateway started by the project's own code
(dev/lakehouse_dev/prometheus.py, one for the module). Each check waits for a scrape after the job's push
(the gateway's `push_time_seconds` of the group, as Prometheus scraped it), then compares through
Prometheus' HTTP API. Hudi's reporter pushes on a period; `Metrics.shutdownAllMetrics` makes it push
now, and stops it (no reporter of this test pushes into the next one's gateway).
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from lakehouse_dev.prometheus import LocalMetrics, Prometheus
from pipelines.lake.layout import quarantine_path, silver_path
from pipelines.lake.table_stats import read_table
from pipelines.lake.timeline_files import timeline
from pipelines.monitoring import metric_names as m
from pipelines.runtime.lake import Lake
from tests.lake import LakeCopy, run_cli
from tests.model import is_malformed

pytestmark = pytest.mark.integration

SCRAPED_WITHIN = 40.0  # Prometheus scrapes every 5 s; Hudi's reporter pushes as it shuts down


@pytest.fixture(scope="module")
def metrics(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalMetrics]:
    with LocalMetrics(tmp_path_factory.mktemp("metrics"), port=0, pushgateway_port=0) as running:
        yield running


@pytest.fixture
def pushing(metrics: LocalMetrics, lake: LakeCopy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LakeCopy:
    """The lake copy, its jobs pushing to the module's gateway."""
    for key, value in {"LAKEHOUSE_ROOT": lake.root, "KAFKA_BOOTSTRAP_SERVERS": lake.bootstrap,
                       "LAKEHOUSE_PUSHGATEWAY": f"127.0.0.1:{metrics.pushgateway_port}",
                       "LAKEHOUSE_GDPR_INBOX": str(tmp_path / "inbox"),
                       "LAKEHOUSE_ERASURE_KEY_FILE": str(tmp_path / "erasure.key")}.items():
        monkeypatch.setenv(key, value)
    return lake


def _values(prometheus: Prometheus, expr: str, *labels: str) -> dict:
    """The query's values by the labels named: one label's value, a tuple of several, "" for none."""
    found = {tuple(s["metric"].get(k, "") for k in labels): float(s["value"][1]) for s in prometheus.query(expr)}
    return {(k[0] if len(k) == 1 else k if k else ""): v for k, v in found.items()}


def _scraped_push(prometheus: Prometheus, job: str, lake: str, since: float) -> str:
    """Wait for a scrape of the group's push made after `since`; returns the group's label filter."""
    group = f'job="{job}", lake="{lake}"'
    deadline = time.monotonic() + SCRAPED_WITHIN
    while not [s for s in prometheus.query(f"push_time_seconds{{{group}}}") if float(s["value"][1]) >= since]:
        assert time.monotonic() < deadline, f"no push of {job} scraped within {SCRAPED_WITHIN} s"
        time.sleep(0.5)
    return group


def _run_figures(prometheus: Prometheus, group: str, started: float, ended: float) -> None:
    """Every run pushes its duration (within the run's wall time) and, succeeded, when it ended."""
    (duration,) = _values(prometheus, f"{m.JOB_DURATION.name}{{{group}}}").values()
    (success,) = _values(prometheus, f"{m.JOB_LAST_SUCCESS.name}{{{group}}}").values()
    assert 0 < duration <= ended - started and started <= success <= ended, (duration, success, started, ended)


def _hudi_flush(spark: SparkSession) -> None:
    spark.sparkContext._jvm.org.apache.hudi.metrics.Metrics.shutdownAllMetrics()


def _new_rows(path: str, before: set[str]) -> int:
    """Rows of the table written by commits not in `before` (their `_hoodie_commit_time`)."""
    new = {i.requested for i in timeline(path) if i.is_commit and i.completed} - before
    times = read_table(path, ["_hoodie_commit_time"]).column("_hoodie_commit_time").to_pylist()
    return sum(t in new for t in times)


def _commits(path: str) -> set[str]:
    return {i.requested for i in timeline(path) if i.is_commit and i.completed}


def test_ingest_once_etl_and_services_push_what_they_did(spark: SparkSession, pushing: LakeCopy, metrics: LocalMetrics,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    lake, prometheus, root = pushing, metrics.prometheus, pushing.root
    # Log files stay for the services to compact (inline mode would compact them in the ingest).
    monkeypatch.setenv("LAKEHOUSE_TABLE_SERVICES", "external")
    decl = Lake.at(root).declaration
    names = decl.names
    tables = {decl.topic(t): t for t in names}
    new = lake.source.changes(lake.cfg)
    lake.produce(new)

    # ingest --once: the stream's per-table figures, for what it read now (the base lake's records were read before).
    started = time.time()
    done = run_cli("ingest", "--once")
    assert done.exit_code == 0, done.output
    group = _scraped_push(prometheus, m.INGEST_ONCE, root, started)
    _run_figures(prometheus, group, started, time.time())
    records = _values(prometheus, f"{m.BATCH_RECORDS.name}{{{group}}}", "table")
    assert records == {t: float(n) for t, n in Counter(tables[x.topic] for x in new).items()} | {
        t: 0.0 for t in names if t not in {tables[x.topic] for x in new}}
    assert _values(prometheus, f"{m.BATCH_BYTES.name}{{{group}}}", "table") == {
        t: float(sum(len(x.value or b"") for x in new if tables[x.topic] == t)) for t in names}
    assert _values(prometheus, f"{m.DEAD_LETTERS.name}{{{group}}}", "table") == {
        t: float(sum(is_malformed(x) for x in new if tables[x.topic] == t)) for t in names}
    commits = _values(prometheus, f"{m.COMMITS.name}{{{group}}}", "table")
    assert {t for t, n in commits.items() if n > 0} == {t for t, n in records.items() if n > 0}
    assert _values(prometheus, f"{m.TABLE_FRESHNESS.name}{{{group}}}", "table") == dict.fromkeys(names, 0.0)
    assert not prometheus.query(f"{m.STREAM_HEARTBEAT.name}{{{group}}}"), "a run that ended has no heartbeat"

    # etl: per silver table, rows checked and quarantined as its tables' new rows say; rows written as Hudi says.
    before = {t: (_commits(silver_path(t, root)), _commits(quarantine_path(t, root))) for t in names}
    started = time.time()
    done = run_cli("etl")
    assert done.exit_code == 0, done.output
    ended = time.time()
    _hudi_flush(spark)
    changed = re.search(r"etl: (\d+) of (\d+) tables changed", done.output)
    assert changed and int(changed.group(1)) > 0, done.output
    group = _scraped_push(prometheus, m.ETL, root, started)
    _run_figures(prometheus, group, started, ended)
    quarantined = {t: _new_rows(quarantine_path(t, root), before[t][1]) for t in names}
    accepted = {t: _new_rows(silver_path(t, root), before[t][0]) for t in names}
    assert sum(quarantined.values()) > 0 and sum(accepted.values()) > 0, "the workload's changes reach silver"
    assert _values(prometheus, f"{m.QUARANTINED_ROWS.name}{{{group}}}", "table") == {
        t: float(n) for t, n in quarantined.items()}
    assert _values(prometheus, f"{m.SILVER_CHECKED_ROWS.name}{{{group}}}", "table") == {
        t: float(accepted[t] + quarantined[t]) for t in names}
    written = _values(prometheus, f"{m.ETL_WRITTEN_ROWS.name}{{{group}}}", "layer", "table")
    assert {layer for layer, _ in written} == {"silver", "silver_quarantine", "gold"}
    # Hudi's own reporter, from the same commits (one per table and run): `<hoodie.table.name>_commit_*`.
    deadline = time.monotonic() + SCRAPED_WITHIN
    while not prometheus.query('{__name__="silver_orders_commit_totalRecordsWritten", job="hudi"}'):
        assert time.monotonic() < deadline, "Hudi's reporter pushed nothing that Prometheus scraped"
        time.sleep(0.5)
    for t in names:
        for layer, path, hudi_name, was in (("silver", silver_path(t, root), f"silver_{t}", before[t][0]),
                                            ("silver_quarantine", quarantine_path(t, root),
                                             f"silver_quarantine_{t}", before[t][1])):
            hudi = _values(prometheus, f'{{__name__="{hudi_name}_commit_totalRecordsWritten", job="hudi"}}')
            if not _commits(path) - was:  # no commit of this run: nothing written, nothing Hudi reports
                assert written[(layer, t)] == 0 and not hudi, (layer, t, written, hudi)
                continue
            assert hudi == {"": written[(layer, t)]}, (layer, t, hudi, written[(layer, t)])
            duration = _values(prometheus, f'{{__name__="{hudi_name}_commit_duration", job="hudi"}}')
            assert len(duration) == 1 and min(duration.values()) > 0, (hudi_name, duration)

    # services: what each table's JSON line says it did, and the seconds each service took.
    started = time.time()
    chosen = [f"bronze/{t}" for t in names]
    done = run_cli("services", *(x for t in chosen for x in ("--table", t)), "--only", "compact", "--only", "clean")
    assert done.exit_code == 0, done.output
    ended = time.time()
    lines = {d["table"]: d for d in map(json.loads, done.stdout.splitlines()) if d.get("table") in chosen}
    assert lines.keys() == set(chosen), done.stdout
    group = _scraped_push(prometheus, m.SERVICES, root, started)
    _run_figures(prometheus, group, started, ended)
    compactions = _values(prometheus, f"{m.SERVICE_COMPACTIONS.name}{{{group}}}", "table")
    assert compactions == {t: float(len(d["compact"]["executed"])) for t, d in lines.items()}
    assert sum(compactions.values()) > 0, "the log files the ingest appended were compacted"
    assert _values(prometheus, f"{m.SERVICE_CLEANED_FILES.name}{{{group}}}", "table") == {
        t: float(d["clean"]["files_deleted"]) for t, d in lines.items()}
    seconds = _values(prometheus, f"{m.SERVICE_DURATION.name}{{{group}}}", "table", "service")
    assert seconds.keys() == {(t, s) for t in chosen for s in ("compact", "clean")}
    assert 0 < sum(seconds.values()) <= ended - started
    assert _values(prometheus, f"{m.SERVICE_FAILURES.name}{{{group}}}", "table") == dict.fromkeys(chosen, 0.0)

    # A second etl with nothing new: the counters keep their totals (a push adds to the group's last values).
    etl_group = f'job="{m.ETL}", lake="{root}"'
    totals = _values(prometheus, f"{m.SILVER_CHECKED_ROWS.name}{{{etl_group}}}", "table")
    started = time.time()
    assert run_cli("etl").exit_code == 0
    group = _scraped_push(prometheus, m.ETL, root, started)
    assert _values(prometheus, f"{m.SILVER_CHECKED_ROWS.name}{{{group}}}", "table") == totals


def test_quality_and_an_erasure_push_what_they_did(pushing: LakeCopy, metrics: LocalMetrics) -> None:
    prometheus, root = metrics.prometheus, pushing.root

    # quality: suites per table and outcome, as the summary line counts them.
    started = time.time()
    done = run_cli("quality", "--layer", "silver")
    ended = time.time()
    summary = re.search(r"quality: (\d+) of (\d+) suites passed", done.output)
    assert summary, done.output
    group = _scraped_push(prometheus, m.QUALITY, root, started)
    _run_figures(prometheus, group, started, ended)
    suites = _values(prometheus, f"{m.QUALITY_SUITES.name}{{{group}}}", "table", "outcome")
    assert sum(v for (_, o), v in suites.items() if o == "passed") == int(summary.group(1))
    assert sum(suites.values()) == int(summary.group(2)) > 0
    passed = _values(prometheus, f"{m.QUALITY_SUITE_PASSED.name}{{{group}}}", "suite")
    assert len(passed) == int(summary.group(2)) and sum(passed.values()) == int(summary.group(1))

    # A request filed: the inbox's group says one waits, filed when its file says.
    (key,) = Lake.at(root).declaration.table("customers").key
    customer = min(read_table(silver_path("customers", root), [key]).column(key).to_pylist())
    started = time.time()
    done = run_cli("gdpr", "request", "--customer-id", str(customer), "--reference", "REQ-52")
    assert done.exit_code == 0, done.output
    filed = Path(pushing.dir) / "inbox" / "REQ-52.json"  # the fixture's LAKEHOUSE_GDPR_INBOX
    group = _scraped_push(prometheus, m.INBOX, root, started)
    assert _values(prometheus, f"{m.ERASURE_PENDING.name}{{{group}}}") == {"": 1.0}
    assert _values(prometheus, f"{m.ERASURE_OLDEST_PENDING.name}{{{group}}}") == {
        "": json.loads(filed.read_text())["filed_at"]}

    # The erasure of the inbox: one verified request, the rows its certificate says it removed; the inbox empty.
    started = time.time()
    done = run_cli("gdpr", "erase", "--pending")
    assert done.exit_code == 0, done.output
    ended = time.time()
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    certificate = json.loads(Path(summary["certificate"]).read_text())
    group = _scraped_push(prometheus, m.ERASE, root, started)
    _run_figures(prometheus, group, started, ended)
    assert _values(prometheus, f"{m.ERASURE_REQUESTS.name}{{{group}}}", "status") == {
        "verified": 1.0, "not_verified": 0.0}
    rows = _values(prometheus, f"{m.ERASURE_ROWS.name}{{{group}}}", "table")
    assert rows == {t: float(d.get("rows_removed", 0)) for t, d in certificate["tables"].items()}
    assert sum(rows.values()) == summary["rows_removed"] > 0
    group = _scraped_push(prometheus, m.INBOX, root, started)
    assert _values(prometheus, f"{m.ERASURE_PENDING.name}{{{group}}}") == {"": 0.0}
    assert _values(prometheus, f"{m.ERASURE_OLDEST_PENDING.name}{{{group}}}") == {"": 0.0}
