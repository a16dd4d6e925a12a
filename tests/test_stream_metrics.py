"""The stream's exporter scraped by the real Prometheus: every metric the stream exports, at the values its batch
lines, its heartbeat, its tables' timelines and the records sent say.

The real stream (`lakehouse ingest`, its own process and JVM, its exporter on a free port) on a fresh lake
and broker, a workload with malformed records sent before it starts and read in a few capped batches (so
that Spark's progress has lag to report), and Prometheus started by the project's own code
(dev/lakehouse_dev/prometheus.py) with its stream target on that port. Once the stream has read every
record and nothing waits, the test waits for a scrape after that and compares through Prometheus'
HTTP API. No Spark in this process: the lake is read from its files.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from lakehouse_dev.generator import ShopSource, WorkloadConfig, ensure_topics, produce
from lakehouse_dev.kafka_local import KafkaBroker
from lakehouse_dev.prometheus import SPARK_JOBS, STREAM_JOB, LocalMetrics, Prometheus
from pipelines import cli
from pipelines.ingest.batch import BatchReport
from pipelines.ingest.exporter import TOTAL_PHASE
from pipelines.ingest.stream import ControlFiles
from pipelines.lake.layout import changelog_path, main_path
from pipelines.lake.timeline_files import timeline
from pipelines.monitoring import dashboard, metric_names
from pipelines.runtime.declared import read_declaration
from pipelines.runtime.local_process import HOST, free_port
from tests.kill import beside_job
from tests.lake import with_overrides
from tests.model import is_malformed

pytestmark = pytest.mark.integration

WORKLOAD = WorkloadConfig(seed=52, customers=20, orders=40, changes=120, malformed_fraction=0.05)
# Records per batch: the workload in a few batches, each leaving lag for Spark's progress to report.
PER_BATCH = 100
# The stream's start (a JVM), its batches, and a scrape after them (every 5 s), on a busy machine.
DONE_WITHIN = 150.0
SCRAPED_WITHIN = 30.0
# The batch lines' seconds have one decimal.
ROUNDING = 0.05


def _by_label(prometheus: Prometheus, expr: str, label: str) -> dict[str, float]:
    return {s["metric"][label]: float(s["value"][1]) for s in prometheus.query(expr)}


def _reports(log: Path) -> list[tuple[BatchReport, bool]]:
    """The log's batch lines, each with whether it is a commit between batches (no micro-batch of its own)."""
    return [(report, line.startswith("the waiting changes")) for line in log.read_text().splitlines()
            if (report := BatchReport.parse(line)) is not None]


def test_the_stream_exports_what_its_batch_lines_say(broker: KafkaBroker, tmp_path: Path) -> None:
    root = str(tmp_path / "lake")
    source = ShopSource(WORKLOAD.seed)
    sent = source.snapshot(WORKLOAD) + source.changes(WORKLOAD)
    ensure_topics(broker.bootstrap)
    produce(sent, broker.bootstrap)
    decl = read_declaration()  # the stream's, as the environment declares it
    tables = {decl.topic(t): t for t in decl.names}

    port, ui_port, gateway_port = free_port(), free_port(), free_port()
    env = {**os.environ, "LAKEHOUSE_ROOT": root, "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
           # Hudi's reporter in the stream's writers pushes there (hudi_configs/metrics.toml).
           "LAKEHOUSE_PUSHGATEWAY": f"{HOST}:{gateway_port}",
           # A heartbeat (and so the gauges) every second; every table with changes commits in its batch.
           "LAKEHOUSE_HUDI_OVERRIDES": with_overrides(tmp_path / "overrides.toml",
                                                      "[stream.health]\nheartbeat_seconds = 1\n"
                                                      "[stream.cadence]\nbusy_changes_per_second = 0\n")}
    log = tmp_path / "ingest.log"
    with log.open("w") as out:
        job = subprocess.Popen([sys.executable, "-m", "pipelines.cli", "ingest", "--trigger-seconds", "1",
                                "--max-offsets-per-trigger", str(PER_BATCH), "--metrics-port", str(port),
                                "--spark-ui-port", str(ui_port)],
                               env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    metrics = LocalMetrics(tmp_path / "metrics", port=0, pushgateway_port=gateway_port, stream_target=f"{HOST}:{port}",
                           spark_target=f"{HOST}:{ui_port}")
    try:
        metrics.start()  # while the stream's JVM starts
        prometheus = metrics.prometheus
        files = ControlFiles(root)

        def done() -> bool:
            """Every record read, and nothing waiting for a commit."""
            hb = files.heartbeat()
            return (sum(r.records for r, _ in _reports(log)) == len(sent) and hb is not None and hb.tables is not None
                    and all(t["waiting"] == 0 for t in hb.tables.values()) and hb.trigger_since is None)

        deadline = time.monotonic() + DONE_WITHIN
        while not done():
            assert job.poll() is None, "the stream stopped: " + log.read_text()[-3000:]
            assert time.monotonic() < deadline, "the stream did not read every record: " + log.read_text()[-3000:]
            time.sleep(0.5)
        # A heartbeat after the last batch (every second), then a scrape after that.
        after = time.time() + 1.5
        deadline = time.monotonic() + SCRAPED_WITHIN
        while not [s for s in prometheus.query(f'timestamp(up{{job="{STREAM_JOB}"}})') if float(s["value"][1]) > after]:
            assert time.monotonic() < deadline, f"no scrape of the stream within {SCRAPED_WITHIN} s"
            time.sleep(0.5)
        reports = _reports(log)

        # The stream serves exactly the stream's metrics (no `_created` series), and its scrape is up.
        job_filter = f'{{job="{STREAM_JOB}"}}'
        served = set(_by_label(prometheus, f"count by (__name__) ({job_filter})", "__name__"))
        # Silver's and gold's freshness has a series per silver or gold table: this lake has none yet.
        layers = {metric_names.LAYER_FRESHNESS, metric_names.LAYER_FRESHNESS_TARGET}
        expected = {m.name + s for m in metric_names.ALL if m.job == STREAM_JOB and m not in layers
                    for s in (metric_names.HISTOGRAM_SERIES if m.kind == "histogram" else ("",))}
        assert {n for n in served if n.startswith("lakehouse_")} == expected  # besides up, scrape_*, ALERTS
        assert _by_label(prometheus, f"up{job_filter}", "job") == {STREAM_JOB: 1.0}

        # Records and bytes per table: what was sent on its topic, and in all what the batch lines say.
        records = _by_label(prometheus, metric_names.BATCH_RECORDS.name, "table")
        assert records == {t: float(n) for t, n in Counter(tables[m.topic] for m in sent).items()}
        assert sum(records.values()) == sum(r.records for r, _ in reports) == len(sent)
        weight: Counter[str] = Counter()
        for m in sent:
            weight[tables[m.topic]] += len(m.value or b"")
        assert _by_label(prometheus, metric_names.BATCH_BYTES.name, "table") == {t: float(n) for t, n in weight.items()}

        # Dead letters per table: the malformed records sent on its topic (a table with none at 0).
        malformed = Counter(tables[m.topic] for m in sent if is_malformed(m))
        assert sum(malformed.values()) > 0, "the workload sends malformed records"
        assert _by_label(prometheus, metric_names.DEAD_LETTERS.name, "table") == {
            t: float(malformed[t]) for t in decl.names}

        # Commits per table: the lines that give it upserts or deletes, and its change log's and main's commits.
        lines = Counter(t for r, _ in reports for t in r.committed())
        commits = _by_label(prometheus, metric_names.COMMITS.name, "table")
        assert commits == {t: float(lines[t]) for t in decl.names}
        for t in decl.names:
            for path in (changelog_path(t, root), main_path(t, root)):
                assert sum(i.changes_data for i in beside_job(lambda p=path: timeline(p))) == commits[t], path

        # Seconds per phase: one observation per phase of each line (a table's own under its part's name), the
        # sums as the lines round them; the whole batch once per micro-batch.
        observed: Counter[str] = Counter()
        seconds: Counter[str] = Counter()
        for r, between in reports:
            for name, s in [*r.phases.items(), *([] if between else [(TOTAL_PHASE, r.seconds)])]:
                observed[name.rpartition(".")[2]] += 1
                seconds[name.rpartition(".")[2]] += s
        name = metric_names.BATCH_DURATION.name
        assert _by_label(prometheus, f"{name}_count", "phase") == {p: float(n) for p, n in observed.items()}
        sums = _by_label(prometheus, f"{name}_sum", "phase")
        assert sums.keys() == seconds.keys()
        wrong = {p: (sums[p], seconds[p]) for p in sums if abs(sums[p] - seconds[p]) > ROUNDING * observed[p] + 1e-6}
        assert not wrong, f"phase seconds (exported, the lines' sum): {wrong}"
        # Every observation below the longest batch's bucket: `le="+Inf"` is the count.
        assert _by_label(prometheus, f'{name}_bucket{{le="+Inf"}}', "phase") == {
            p: float(n) for p, n in observed.items()}

        # Freshness: nothing waits, so 0; each table's target as declared.
        assert _by_label(prometheus, metric_names.TABLE_FRESHNESS.name, "table") == {t: 0.0 for t in decl.names}
        assert _by_label(prometheus, metric_names.TABLE_FRESHNESS_TARGET.name, "table") == {
            t: float(decl.table(t).freshness_seconds) for t in decl.names}

        # Kafka lag: every scraped value (summed over the topics) was what some batch left unread, and now none.
        assert _by_label(prometheus, metric_names.KAFKA_LAG.name, "topic") == {topic: 0.0 for topic in tables}
        left = {len(sent) - sum(r.records for r, _ in reports[:i]) for i in range(len(reports) + 1)}
        samples = prometheus.query(f"{metric_names.KAFKA_LAG.name}[10m]")
        at: Counter[float] = Counter()
        for series in samples:
            for when, value in series["values"]:
                at[when] += float(value)
        assert set(at.values()) <= left, f"lag scraped {sorted(set(at.values()))}, batches left {sorted(left)}"

        # The heartbeat: written within the last seconds before the scrape (every second).
        heartbeat = metric_names.STREAM_HEARTBEAT.name
        (beat,) = prometheus.query(f"{heartbeat} - timestamp({heartbeat})")
        assert -5.0 <= float(beat["value"][1]) <= 0.5, beat

        # The operator's view (`lakehouse dev metrics show`) reads the same series: every table, as caught up as they
        # are, the worst lag scraped per topic, the stream up, and no alert but the dead letters' (the malformed
        # records; it fires once a scrape saw the count grow, so it may not yet).
        snap = dashboard.read(prometheus.url, "10m")
        assert [r.table for r in snap.tables] == sorted(decl.names)
        assert {r.table: (r.freshness_last, r.target) for r in snap.tables} == {
            t: (0.0, float(decl.table(t).freshness_seconds)) for t in decl.names}
        worst: dict[str, float] = {}
        for series in samples:
            worst[series["metric"]["topic"]] = max(float(v) for _, v in series["values"])
        assert snap.lag == {topic: (0.0, worst[topic]) for topic in tables}
        assert max(worst.values()) > 0, "the capped batches left lag for some scrape"
        assert snap.stream_up == 1.0
        assert {(a["alertname"], a["table"]) for a in snap.alerts} <= {
            ("LakehouseDeadLettersGrowing", t) for t, n in malformed.items() if n}
        shown = CliRunner().invoke(cli.main, ["dev", "metrics", "show", "--url", prometheus.url, "--window", "10m"])
        assert shown.exit_code == 0, shown.output
        assert "stream: up" in shown.output and all(t in shown.output for t in [*decl.names, *tables])

        # Spark's own, from the driver's UI (spark.toml [driver_metrics]): the streaming query's source and the
        # executors' figures, both scraped.
        assert _by_label(prometheus, 'up{job=~"lakehouse_spark.*"}', "job") == dict.fromkeys(SPARK_JOBS, 1.0)
        query = "metrics_lakehouse_ingest_driver_spark_streaming_bronze_ingest"
        for figure in ("inputRate_total_Value", "processingRate_total_Value", "latency_Value"):
            assert prometheus.query(f'{query}_{figure}{{job="lakehouse_spark"}}'), figure
        tasks = _by_label(prometheus, 'metrics_executor_completedTasks_total{job="lakehouse_spark_executors"}',
                          "executor_id")
        assert tasks.keys() == {"driver"} and tasks["driver"] > 0, tasks

        # Hudi's own reporter (its writers push to LAKEHOUSE_PUSHGATEWAY) is not checked here: in a long-running stream
        # a table's figures on the gateway can be an older commit's, or missing (hudi_configs/metrics.toml);
        # tests/test_batch_metrics.py checks its figures against the etl's commits.
    finally:
        metrics.stop()
        if job.poll() is None:  # its JVM too: what it holds back is no concern of this test's
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
