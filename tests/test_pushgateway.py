"""The batch jobs' push helper against the real Pushgateway (no JVM): counters add up over runs, gauges a run
does not set stay, a failed run keeps the counters and the last success, a gateway that is down costs a warning."""

from __future__ import annotations

import logging
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import hudi_configs
from lakehouse_dev.prometheus import Pushgateway
from pipelines.ingest.exporter import StreamExporter
from pipelines.monitoring import metric_names as m
from pipelines.monitoring.pushgateway import JobMetrics
from pipelines.runtime.local_process import HOST, free_port

pytestmark = pytest.mark.integration

LAKE = "s3://bucket/lake one"  # a slash and a space: the grouping key's value is encoded


@pytest.fixture
def gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Pushgateway]:
    running = Pushgateway(tmp_path, free_port())
    running.start(30)
    monkeypatch.setenv("LAKEHOUSE_PUSHGATEWAY", f"{HOST}:{running.port}")
    try:
        yield running
    finally:
        running.stop()


def _held(gateway: Pushgateway, job: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The group's samples on the gateway: (name, labels without the group's) -> value."""
    with urllib.request.urlopen(f"{gateway.url}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("job", "lake", "instance")))):
            s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.labels.get("job") == job and s.labels.get("lake") == LAKE and s.name.startswith("lakehouse_")}


def _etl_run(quarantined: dict[str, int], succeeded: bool = True) -> bool:
    run = JobMetrics(m.ETL, LAKE)
    for table, n in quarantined.items():
        run.counter(m.QUARANTINED_ROWS).labels(table).inc(n)
    return run.push(succeeded=succeeded)


def test_counters_add_up_over_runs_and_a_failed_run_keeps_them(gateway: Pushgateway) -> None:
    q = m.QUARANTINED_ROWS.name
    assert _etl_run({"orders": 3, "customers": 1})
    assert _etl_run({"orders": 2})  # customers untouched: its total stays
    held = _held(gateway, m.ETL)
    assert held[(q, (("table", "orders"),))] == 5 and held[(q, (("table", "customers"),))] == 1
    success = held[(m.JOB_LAST_SUCCESS.name, ())]
    assert _etl_run({}, succeeded=False)  # its duration only: the counters and the last success stay
    after = _held(gateway, m.ETL)
    assert after[(q, (("table", "orders"),))] == 5 and after[(m.JOB_LAST_SUCCESS.name, ())] == success
    assert after[(m.JOB_DURATION.name, ())] != held[(m.JOB_DURATION.name, ())]


def test_ingest_once_pushes_the_stream_figures_but_not_its_heartbeat(gateway: Pushgateway) -> None:
    for seconds in (2.0, 30.0):
        run = JobMetrics(m.INGEST_ONCE, LAKE, m.INGEST_ONCE_METRICS)
        exporter = StreamExporter(run.registry)
        exporter.phases.labels("total").observe(seconds)
        exporter.records.labels("orders").inc(10)
        exporter.heartbeat.set(123.0)
        assert run.push()
    held = _held(gateway, m.INGEST_ONCE)
    assert held[(m.BATCH_RECORDS.name, (("table", "orders"),))] == 20
    total = (("phase", "total"),)
    assert held[(m.BATCH_DURATION.name + "_count", total)] == 2 and held[(m.BATCH_DURATION.name + "_sum", total)] == 32
    # Buckets add up by their bound, whichever way it was written (the gateway writes 5, Python 5.0).
    buckets = {float(dict(labels)["le"]): v for (name, labels), v in held.items()
               if name == m.BATCH_DURATION.name + "_bucket"}
    assert buckets[5.0] == 1 and buckets[30.0] == 2 and buckets[float("inf")] == 2 and buckets[1.0] == 0
    assert not [k for k in held if k[0] == m.STREAM_HEARTBEAT.name]


def test_no_gateway_no_push_and_a_dead_one_is_a_warning(monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv("LAKEHOUSE_PUSHGATEWAY", raising=False)
    assert _etl_run({"orders": 1}) and hudi_configs.metrics() == {}
    port = free_port()  # nothing listens there
    monkeypatch.setenv("LAKEHOUSE_PUSHGATEWAY", f"{HOST}:{port}")
    with caplog.at_level(logging.WARNING, logger="pipelines.monitoring.pushgateway"):
        assert not _etl_run({"orders": 1})
    (warning,) = caplog.records
    assert f"not pushed to the Pushgateway {HOST}:{port}" in warning.getMessage()
    # Hudi's reporter is pointed at the same gateway, with metrics.toml's options.
    options = hudi_configs.writer("silver", "table")
    assert options["hoodie.metrics.reporter.type"] == "PROMETHEUS_PUSHGATEWAY"
    assert (options["hoodie.metrics.pushgateway.host"], options["hoodie.metrics.pushgateway.port"]) == (HOST, str(port))
    assert options["hoodie.metrics.pushgateway.random.job.name.suffix"] == "false"
