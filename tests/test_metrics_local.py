"""`lakehouse dev metrics start/status/stop` as `make metrics-up` runs them: a metric pushed the way a batch job will,
scraped by the real Prometheus and read back through its HTTP API (no JVM; Debian's binaries, which
`make setup` installs).
"""

from __future__ import annotations

import json
import time

import pytest
from prometheus_client import CollectorRegistry, Gauge, push_to_gateway

from lakehouse_dev.prometheus import PUSHGATEWAY_JOB, SPARK_JOBS, STREAM_JOB, LocalMetrics, Prometheus
from pipelines.monitoring import metric_names
from pipelines.runtime.local_process import HOST, free_port, port_open
from tests.lake import run_cli

pytestmark = pytest.mark.integration

# Two scrape intervals (prometheus.yml: 5 s) and Prometheus' start, with room for a busy machine.
SCRAPED_WITHIN = 30.0


def scraped(prometheus: Prometheus, expr: str, series: int) -> list[dict]:
    """The query's result once it has `series` series (each target scraped once), or what it has after the wait."""
    deadline = time.monotonic() + SCRAPED_WITHIN
    while len(found := prometheus.query(expr)) < series and time.monotonic() < deadline:
        time.sleep(0.5)
    return found


def test_a_pushed_metric_is_scraped_and_queried_and_the_alerts_are_loaded(tmp_path) -> None:
    home = str(tmp_path / "metrics")
    stream_target = f"{HOST}:{free_port()}"  # nothing serves there: the stream job's target is down
    spark_target = f"{HOST}:{free_port()}"  # nor there: the stream driver's Spark UI
    up = run_cli("dev", "metrics", "start", "--port", "0", "--pushgateway-port", "0", "--stream-target", stream_target,
                 "--spark-target", spark_target, "--home", home)
    running = LocalMetrics(home)
    try:
        assert up.exit_code == 0, up.output
        assert running.port and running.pushgateway_port and running.stream_target == stream_target
        assert running.prometheus.url in up.stdout and running.pushgateway.url in up.stdout
        # Ready means scraping: both targets listed (health `unknown` until their first scrape).
        assert f"target {PUSHGATEWAY_JOB} http://{HOST}:{running.pushgateway_port}/metrics" in up.stdout
        assert f"target {STREAM_JOB} http://{stream_target}/metrics" in up.stdout

        registry = CollectorRegistry()
        pending = metric_names.ERASURE_PENDING
        Gauge(pending.name, pending.help, registry=registry).set(42.5)
        push_to_gateway(f"{HOST}:{running.pushgateway_port}", job="lakehouse_gdpr", registry=registry)

        found = scraped(running.prometheus, pending.name, 1)
        assert len(found) == 1, f"{pending.name} not scraped within {SCRAPED_WITHIN} s: {found}"
        # honor_labels: the pusher's job, not the gateway's, and no `exported_job`.
        assert found[0]["metric"]["job"] == "lakehouse_gdpr" and "exported_job" not in found[0]["metric"]
        assert float(found[0]["value"][1]) == 42.5

        health = {s["metric"]["job"]: (s["metric"]["instance"], s["value"][1])
                  for s in scraped(running.prometheus, "up", 2 + len(SPARK_JOBS))}
        assert health[PUSHGATEWAY_JOB] == (f"{HOST}:{running.pushgateway_port}", "1")
        assert health[STREAM_JOB] == (stream_target, "0")
        assert {job: health[job] for job in SPARK_JOBS} == dict.fromkeys(SPARK_JOBS, (spark_target, "0"))

        # The rules of docker/prometheus/alerts.yml, read from the repository by the copied config.
        groups = running.prometheus.api("/api/v1/rules")["groups"]
        assert {rule["name"] for group in groups for rule in group["rules"]} >= {
            "LakehouseStreamDown", "LakehouseErasureOverdue", "LakehouseTableFreshnessOverTarget"}

        # A second `start` keeps what runs, whatever it asks for.
        pids = (running.prometheus.pid(), running.pushgateway.pid())
        again = run_cli("dev", "metrics", "start", "--port", "9", "--home", home)
        assert again.exit_code == 0 and running.prometheus.url in again.stdout, again.output
        assert (running.prometheus.pid(), running.pushgateway.pid()) == pids

        # Another folder's Prometheus asking for a port in use fails, naming it, and leaves nothing running.
        other = tmp_path / "other"
        clash = run_cli("dev", "metrics", "start", "--port", "0", "--pushgateway-port", str(running.pushgateway_port),
                        "--home", str(other))
        assert clash.exit_code == 1 and f"{HOST}:{running.pushgateway_port} is taken" in clash.output, clash.output
        assert LocalMetrics(other).prometheus.pid() is None

        status = run_cli("dev", "metrics", "status", "--home", home)
        assert status.exit_code == 0, status.output
        assert f"target {PUSHGATEWAY_JOB} http://{HOST}:{running.pushgateway_port}/metrics up" in status.stdout
        assert f"target {STREAM_JOB} http://{stream_target}/metrics down" in status.stdout
        shown = run_cli("dev", "metrics", "status", "--json", "--home", home)
        assert shown.exit_code == 0, shown.output
        document = json.loads(shown.stdout)
        assert document["prometheus"]["url"] == running.prometheus.url
        assert {t["job"]: t["health"] for t in document["targets"]} == {
            PUSHGATEWAY_JOB: "up", STREAM_JOB: "down", **dict.fromkeys(SPARK_JOBS, "down")}
        dashboard = run_cli("dev", "metrics", "show", "--json", "--home", home, "--window", "1m")
        assert dashboard.exit_code == 0 and json.loads(dashboard.stdout)["window"] == "1m", dashboard.output
    finally:
        down = run_cli("dev", "metrics", "stop", "--home", home)
    assert down.exit_code == 0, down.output
    assert running.prometheus.pid() is None and running.pushgateway.pid() is None
    assert not port_open(running.port) and not port_open(running.pushgateway_port)
    stopped = run_cli("dev", "metrics", "status", "--home", home)
    assert stopped.exit_code == 1 and "make metrics-up" in stopped.output
