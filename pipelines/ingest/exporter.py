"""The ingest stream's Prometheus exporter: what its batches did and how far each table is behind, served by the
stream's driver on 127.0.0.1 (LAKEHOUSE_EXPORTER_HOST: another address, 0.0.0.0 in docker/compose.yaml's containers)
for Prometheus' job `lakehouse_stream` (docker/prometheus/prometheus.yml).

The stream already says all of it, in each batch's line (`batch.BatchReport`) and in its heartbeat (the
cadence's freshness per table, Spark's progress): the exporter keeps those figures as metrics, and
computes nothing the stream does not. Two kinds of call, from the places that make those figures:

- `batch(report)` after each batch's line, and after each commit made between batches
  (`writer.BronzeBatchWriter`): records and bytes read and dead letters found per table, commits per
  table, seconds per phase;
- `beat(...)` with each heartbeat (`bronze._run_query`): the heartbeat's time, each table's freshness
  and target, and the Kafka lag that Spark's newest progress reports.

So the gauges are as fresh as the heartbeat (`[health] heartbeat_seconds`, 10 s, beside Prometheus'
5-s scrapes), and a hung driver, which writes no heartbeat, shows as a heartbeat that ages
(`LakehouseStreamHeartbeatStale`) rather than as figures that keep looking current.

Names, kinds and labels are pipelines.monitoring.metric_names'; the types are prometheus_client's. A `table` label
is the declared table's name (`orders`), as in the batch lines and `lakehouse status`. Counters count from
the process's start: a restart resets them, which `rate()` and `increase()` take in their stride.
Port: hudi_configs/stream.toml `[metrics] port` (`lakehouse ingest --metrics-port`); 0, none.
"""

from __future__ import annotations

import os
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

import hudi_configs
from pipelines.errors import StreamError
from pipelines.ingest.batch import BatchReport
from pipelines.ingest.stream import kafka_offsets
from pipelines.lake.declaration import Declaration
from pipelines.monitoring import metric_names
from pipelines.monitoring.layer_freshness import LayerFreshnessCollector
from pipelines.runtime.local_process import HOST

# Seconds of a phase, from a registry lookup to a catch-up batch (about 45 s on 2 cores)
# and the stall limit (`[health] stalled_after_seconds`, 600): the library's default buckets end at 10 s.
PHASE_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0)
# The phase label of a micro-batch's whole time (the line's "in 8.9s"); a commit between batches has none.
TOTAL_PHASE = "total"
# The address the exporter listens on, default 127.0.0.1; 0.0.0.0 where Prometheus runs in another container.
HOST_VARIABLE = "LAKEHOUSE_EXPORTER_HOST"


def bind_host() -> str:
    return os.environ.get(HOST_VARIABLE) or HOST


def configured_port() -> int:
    """hudi_configs/stream.toml `[metrics] port`, with the deployment's overrides (the test profile's is 0)."""
    return int(hudi_configs.section("stream", "metrics")["port"])


def configured_spark_ui_port() -> int:
    """hudi_configs/stream.toml `[metrics] spark_ui_port`: where the driver serves Spark's own metrics (0: nowhere)."""
    return int(hudi_configs.section("stream", "metrics").get("spark_ui_port", 0))


def spark_metrics_conf(ui_port: int) -> dict[str, str]:
    """The stream driver's Spark options for Spark's PrometheusServlet on its UI at `ui_port` (0: none)."""
    if not ui_port:
        return {}
    return hudi_configs.section("spark", "driver_metrics") | {"spark.ui.port": str(ui_port)}


class StreamExporter:
    """The stream's metrics, in a registry of their own; `serve` puts them on HTTP for Prometheus."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        # Its own registry, not the library's global one: a process may run several streams one after
        # another (the tests), and the global registry refuses a second metric of the same name.
        self.registry = registry or CollectorRegistry()
        m = metric_names
        self.records = self._counter(m.BATCH_RECORDS)
        self.bytes = self._counter(m.BATCH_BYTES)
        self.dead_letters = self._counter(m.DEAD_LETTERS)
        self.commits = self._counter(m.COMMITS)
        self.phases = Histogram(m.BATCH_DURATION.name, m.BATCH_DURATION.help, m.BATCH_DURATION.labels,
                                registry=self.registry, buckets=PHASE_BUCKETS)
        # The whole batch's series from the start, at 0: the first batch counts as an increase (Prometheus'
        # increase() ignores whatever a series' first sample already holds).
        self.phases.labels(TOTAL_PHASE)
        self.freshness = self._gauge(m.TABLE_FRESHNESS)
        self.target = self._gauge(m.TABLE_FRESHNESS_TARGET)
        self.lag = self._gauge(m.KAFKA_LAG)
        self.heartbeat = self._gauge(m.STREAM_HEARTBEAT)
        # The tables and topics of the last heartbeat: a series of one no longer declared is dropped.
        self._tables: set[str] = set()
        self._topics: set[str] = set()
        self._server: Any = None
        self._layers: LayerFreshnessCollector | None = None

    def _counter(self, metric: metric_names.Metric) -> Counter:
        assert metric.kind == "counter", metric
        return Counter(metric.name, metric.help, metric.labels, registry=self.registry)

    def _gauge(self, metric: metric_names.Metric) -> Gauge:
        assert metric.kind == "gauge", metric
        return Gauge(metric.name, metric.help, metric.labels, registry=self.registry)

    @classmethod
    def serve(cls, port: int) -> StreamExporter:
        """An exporter answering Prometheus' scrapes on `bind_host()`:`port` (a daemon thread of the library's).

        A port in use fails the stream's start, naming it: a stream that ran anyway would leave its
        job's scrapes to whatever holds the port, another stream's figures taken for its own.
        """
        # Counters' and histograms' `_created` series: a second series per label set that nothing here
        # queries (the rules use rate() and increase(), which see a reset without them).
        prometheus_client.disable_created_metrics()
        exporter, host = cls(), bind_host()
        try:
            exporter._server, _ = prometheus_client.start_http_server(port, addr=host, registry=exporter.registry)
        except OSError as error:
            raise StreamError(f"the stream's metrics exporter cannot listen on {host}:{port}: {error}; another "
                              "stream there? `lakehouse ingest --metrics-port` takes another port (0: no exporter)") \
                from error
        return exporter

    def follow(self, root: str, decl: Declaration) -> None:
        """Silver's and gold's freshness too, read from the lake at `root` under `decl` as Prometheus scrapes: a
        served exporter's, since those figures age between reads (a pushed one would hold them still)."""
        if self._server is None:
            return
        if self._layers is None:
            self._layers = LayerFreshnessCollector(root, decl)
            self.registry.register(self._layers)
        self._layers.follow(root, decl)

    @property
    def port(self) -> int | None:
        return self._server.server_address[1] if self._server is not None else None

    def close(self) -> None:
        """Stop answering scrapes (the stream has ended): Prometheus then sees the job down."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def batch(self, report: BatchReport, *, between: bool = False) -> None:
        """A batch's report, or (`between`) that of the commits made between batches, which read nothing.

        A table's own phases (`orders.plan`, `orders.table`, ...) are observed once per table under
        their part's name (`plan`, `table`): tables commit side by side, so those observations add up
        to more than the batch's `tables` phase, and a table's name would make a series per table
        and phase.
        """
        for table, read in report.read.items():
            self.records.labels(table).inc(read.records)
            self.bytes.labels(table).inc(read.bytes)
            self.dead_letters.labels(table).inc(read.dead_letters)
        for table in report.committed():
            self.commits.labels(table).inc()
        for name, seconds in report.phases.items():
            self.phases.labels(name.rpartition(".")[2]).observe(seconds)
        if not between:
            self.phases.labels(TOTAL_PHASE).observe(report.seconds)

    def beat(self, at: float, tables: dict[str, dict[str, Any]], progress: dict[str, Any] | None) -> None:
        """The heartbeat written at `at` (epoch seconds), with each table's freshness (`cadence.Cadence.freshness`)
        and Spark's newest progress of the query (`StreamingQuery.lastProgress`, None before the first)."""
        self.heartbeat.set(at)
        for table, fresh in tables.items():
            # Every table's series from the start, at 0: a table's first dead letter is an increase.
            for counter in (self.records, self.bytes, self.dead_letters, self.commits):
                counter.labels(table)
            self.freshness.labels(table).set(fresh["age"] or 0.0)
            self.target.labels(table).set(fresh["target"])
        for gone in self._tables - tables.keys():  # a stale value would look current
            self.freshness.remove(gone)
            self.target.remove(gone)
        self._tables = set(tables)
        lag = kafka_lag(progress)
        if lag is not None:
            for topic, behind in lag.items():
                self.lag.labels(topic).set(behind)
            for gone in self._topics - lag.keys():
                self.lag.remove(gone)
            self._topics = set(lag)


def kafka_lag(progress: dict[str, Any] | None) -> dict[str, int] | None:
    """Per topic, the records after where the stream's newest batch ended: Spark's progress of the Kafka
    source, its latest offsets (where each partition ends, as Spark last looked) minus its batch's end
    offsets. None when the progress has no Kafka offsets (no batch planned yet).

    Spark 3.5 also reports `minOffsetsBehindLatest`/`maxOffsetsBehindLatest`/`avgOffsetsBehindLatest`
    in the source's `metrics`, over every partition of every topic at once; the metric is per topic, so
    it is taken from the offsets those come from. Records read and waiting in a table's cadence are not
    lag: the table's freshness shows them.
    """
    latest, end = (kafka_offsets(progress, k) for k in ("latestOffset", "endOffset"))
    if not latest or end is None:
        return None
    return {topic: sum(max(0, o - end.get(topic, {}).get(p, o)) for p, o in partitions.items())
            for topic, partitions in latest.items()}
