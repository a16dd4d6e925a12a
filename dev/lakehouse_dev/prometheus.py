"""Prometheus and its Pushgateway on this machine: where the pipeline's metrics are scraped and its alerts evaluated.

Debian's own binaries (`prometheus`, `prometheus-pushgateway`; `make setup` installs the packages),
each a `LocalProcess` started here, not by the packages' services: those listen on 9090 and 9091 of
every interface on a systemd host, so `make metrics-up` takes 19090 and 19091 on 127.0.0.1, and keeps
its configuration, time series and pushed metrics in a folder of its own (`.metrics/`).

The configuration is docker/prometheus/prometheus.yml, copied into the folder with its targets
set: the Pushgateway (the batch jobs push there at the end of a run), the ingest stream's exporter
(scraped as the job `lakehouse_stream`, wherever the stream serves it) and its driver's Spark UI
(Spark's own metrics, the jobs `lakehouse_spark` and `lakehouse_spark_executors`). The alerting rules,
docker/prometheus/alerts.yml, are read from the repository where they are. Nothing sends the alerts
on (no Alertmanager): Prometheus shows them on /alerts.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Self

import click

from pipelines.errors import PrometheusError
from pipelines.monitoring.dashboard import Snapshot, prometheus_api, read, render
from pipelines.runtime.commands import echo_json
from pipelines.runtime.local_process import HOST, LocalProcess, free_port, port_open, saved_state
from pipelines.runtime.settings import PROJECT_ROOT

DEFAULT_DIR = PROJECT_ROOT / ".metrics"
CONFIG_DIR = PROJECT_ROOT / "docker" / "prometheus"
TEMPLATE = CONFIG_DIR / "prometheus.yml"
DEFAULT_PORT = 19090
DEFAULT_PUSHGATEWAY_PORT = 19091
# Where the stream's exporter listens by default (the OpenTelemetry Prometheus exporter's port).
DEFAULT_STREAM_TARGET = f"{HOST}:9464"
STREAM_JOB = "lakehouse_stream"
PUSHGATEWAY_JOB = "pushgateway"
# Where the stream's driver serves its Spark UI by default (stream.toml [metrics] spark_ui_port).
DEFAULT_SPARK_TARGET = f"{HOST}:4040"
SPARK_JOBS = ("lakehouse_spark", "lakehouse_spark_executors")
# A machine's demo or test run lasts minutes: a day of series is plenty, and bounds the folder.
RETENTION = "1d"


class MetricsError(RuntimeError):
    """Prometheus or the Pushgateway cannot be started, or Prometheus refused a query."""


def render_config(template: Path, targets: dict[str, str]) -> str:
    """The configuration of `template` with each job of `targets` scraping that one target, its rule files absolute.

    The copy runs from another folder, and Prometheus reads rule files relative to its configuration.
    """
    import yaml  # here, not at the top: every `lakehouse` command imports this module, and pyyaml is a dev extra

    config = yaml.safe_load(template.read_text())
    config["rule_files"] = [str((template.parent / name).resolve()) for name in config.get("rule_files", [])]
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    if missing := sorted(set(targets) - set(jobs)):
        raise MetricsError(f"{template} has no scrape job {', '.join(missing)}")
    for name, target in targets.items():
        jobs[name]["static_configs"] = [{"targets": [target]}]
    header = f"# Made from {template} by `lakehouse dev metrics start`: edit that one.\n"
    return header + yaml.safe_dump(config, sort_keys=False)


@dataclass
class _Server(LocalProcess):
    """A Prometheus server or Pushgateway: a Go binary answering GET /-/ready with 200 once it serves."""

    binary: ClassVar[str]
    # Both log logfmt lines: `ts=... caller=... level=error msg=...`.
    error_line = re.compile(r"\blevel=(error|fatal)\b")

    home: Path
    port: int

    @property
    def name(self) -> str:
        return self.binary.removeprefix("prometheus-")

    @property
    def pid_path(self) -> Path:
        return self.home / f"{self.name}.pid"

    @property
    def log_path(self) -> Path:
        return self.home / f"{self.name}.log"

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def listen(self) -> str:
        return f"--web.listen-address={HOST}:{self.port}"

    def executable(self) -> str:
        found = shutil.which(self.binary)
        if found is None:
            raise MetricsError(f"no `{self.binary}` on PATH: `make prometheus` (part of `make setup`) installs "
                               "Debian's prometheus and prometheus-pushgateway")
        return found

    def prepare(self, log_start: int) -> None:
        # Taken, the port would fail our bind while the process that holds it answered the readiness probe.
        if port_open(self.port):
            raise MetricsError(f"cannot start {self.label}: {HOST}:{self.port} is taken by another process")

    def unready(self, pid: int, deadline: float) -> str | None:
        try:
            urllib.request.urlopen(f"{self.url}/-/ready", timeout=2).close()
        except (urllib.error.URLError, OSError) as error:  # HTTPError too: 503 while Prometheus loads its data
            return f"{self.url}/-/ready: {error}"
        return None


@dataclass
class Pushgateway(_Server):
    label = "Pushgateway"
    binary = "prometheus-pushgateway"

    @property
    def persistence_path(self) -> Path:
        """The pushed metrics, written every few minutes and at shutdown: a restart keeps them."""
        return self.home / "pushgateway.data"

    @property
    def marker(self) -> str:
        return f"--persistence.file={self.persistence_path}"

    def command(self) -> list[str]:
        return [self.executable(), self.listen, self.marker]


@dataclass
class Prometheus(_Server):
    label = "Prometheus"
    binary = "prometheus"

    pushgateway: str  # host:port of each target
    stream_target: str
    spark_target: str = DEFAULT_SPARK_TARGET

    @property
    def config_path(self) -> Path:
        return self.home / "prometheus.yml"

    @property
    def marker(self) -> str:
        return f"--config.file={self.config_path}"

    def prepare(self, log_start: int) -> None:
        super().prepare(log_start)
        self.config_path.write_text(render_config(TEMPLATE, {PUSHGATEWAY_JOB: self.pushgateway,
                                                             STREAM_JOB: self.stream_target,
                                                             **dict.fromkeys(SPARK_JOBS, self.spark_target)}))

    def unready(self, pid: int, deadline: float) -> str | None:
        """Ready once it serves and scrapes its targets: it applies its targets up to 5 s after it serves."""
        if why := super().unready(pid, deadline):
            return why
        try:
            active = {t["labels"]["job"] for t in self.api("/api/v1/targets", state="active")["activeTargets"]}
        except MetricsError as error:
            return str(error)
        wanted = {PUSHGATEWAY_JOB, STREAM_JOB, *SPARK_JOBS}
        return None if wanted <= active else f"scrape targets not applied yet: {sorted(active)}"

    def command(self) -> list[str]:
        return [self.executable(), self.marker, f"--storage.tsdb.path={self.home / 'data'}",
                f"--storage.tsdb.retention.time={RETENTION}", self.listen]

    def api(self, path: str, **params: str) -> Any:
        """The `data` of a GET on the HTTP API (`/api/v1/...`); MetricsError with Prometheus' reason if it fails."""
        try:
            return prometheus_api(self.url, path, **params)
        except PrometheusError as error:
            raise MetricsError(str(error)) from error

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's series, each `{"metric": {labels}, "value": [time, "value"]}`."""
        return self.api("/api/v1/query", query=expr)["result"]


@dataclass
class LocalMetrics:
    """The Pushgateway and the Prometheus that scrapes it, their settings kept in `<home>/metrics.json`.

    While they run (or after a crash left the file), that file's settings win over those asked
    for, so `stop` and `status` need only the folder. Port 0: a free one, chosen at `start`.
    """

    home: Path
    port: int = DEFAULT_PORT
    pushgateway_port: int = DEFAULT_PUSHGATEWAY_PORT
    stream_target: str = DEFAULT_STREAM_TARGET
    spark_target: str = DEFAULT_SPARK_TARGET
    prometheus: Prometheus = field(init=False)
    pushgateway: Pushgateway = field(init=False)

    def __post_init__(self) -> None:
        self.home = Path(self.home).resolve()
        if saved := self._saved():
            self.port, self.pushgateway_port = saved["port"], saved["pushgateway_port"]
            self.stream_target = saved["stream_target"]
            self.spark_target = saved.get("spark_target", DEFAULT_SPARK_TARGET)
        self._build()

    def _build(self) -> None:
        self.pushgateway = Pushgateway(self.home, self.pushgateway_port)
        self.prometheus = Prometheus(self.home, self.port, pushgateway=f"{HOST}:{self.pushgateway_port}",
                                     stream_target=self.stream_target, spark_target=self.spark_target)

    @property
    def state_path(self) -> Path:
        return self.home / "metrics.json"

    def _saved(self) -> dict[str, Any] | None:
        return saved_state(self.state_path)

    def start(self, timeout: float = 60.0) -> Self:
        """Start whichever of the two does not run, the gateway first, and wait until both are ready."""
        self.home.mkdir(parents=True, exist_ok=True)
        if self._saved() is None:
            self.port, self.pushgateway_port = self.port or free_port(), self.pushgateway_port or free_port()
            self._build()
            self.state_path.write_text(json.dumps({"port": self.port, "pushgateway_port": self.pushgateway_port,
                                                   "stream_target": self.stream_target,
                                                   "spark_target": self.spark_target}))
        deadline = time.monotonic() + timeout
        try:
            self.pushgateway.start(timeout)
            self.prometheus.start(max(0.0, deadline - time.monotonic()))
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop Prometheus, then the gateway; the folder keeps the series and the pushed metrics."""
        self.prometheus.stop()
        self.pushgateway.stop()
        self.state_path.unlink(missing_ok=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


_HOME = click.option("--home", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_DIR,
                     show_default=True, help="Folder of the configuration, the series, the pushed metrics, pid files "
                                             "and logs.")


@click.group("metrics")
def metrics() -> None:
    """Prometheus and its Pushgateway on 127.0.0.1, with the pipeline's alerting rules (docker/prometheus/)."""


_JSON = click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout instead of lines.")


@metrics.command()
@click.option("--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT, show_default=True,
              help="Prometheus' port: its UI, HTTP API and /alerts (0: any free one).")
@click.option("--pushgateway-port", type=click.IntRange(0, 65535), default=DEFAULT_PUSHGATEWAY_PORT,
              show_default=True, help="The Pushgateway's port, where the batch jobs push (0: any free one).")
@click.option("--stream-target", default=DEFAULT_STREAM_TARGET, show_default=True,
              help="host:port of the ingest stream's exporter, scraped as the job lakehouse_stream.")
@click.option("--spark-target", default=DEFAULT_SPARK_TARGET, show_default=True,
              help="host:port of the stream driver's Spark UI (stream.toml [metrics] spark_ui_port), scraped as "
                   "the jobs lakehouse_spark and lakehouse_spark_executors.")
@click.option("--timeout", default=60.0, show_default=True, help="Seconds to wait until both are ready.")
@_HOME
def start(port: int, pushgateway_port: int, stream_target: str, spark_target: str, timeout: float, home: Path) -> None:
    """Start the Pushgateway and Prometheus (what runs is kept, with its settings) and wait until both are ready."""
    try:
        _print_status(_status(LocalMetrics(home, port, pushgateway_port, stream_target, spark_target).start(timeout)))
    except RuntimeError as error:
        raise click.ClickException(str(error)) from error


@metrics.command()
@_HOME
def stop(home: Path) -> None:
    """Stop Prometheus and the Pushgateway (the series and pushed metrics stay in the folder)."""
    LocalMetrics(home).stop()
    click.echo("Prometheus and the Pushgateway stopped")


@metrics.command()
@_HOME
@_JSON
def status(home: Path, as_json: bool) -> None:
    """Where they serve and each scrape target's health; exit 1 if either is down."""
    found = LocalMetrics(home)
    if found.prometheus.pid() is None or found.pushgateway.pid() is None:
        if as_json:
            echo_json({"running": False, "home": str(found.home)})
        else:
            click.echo(f"Prometheus or the Pushgateway does not run from {found.home}: `make metrics-up` starts them")
        raise SystemExit(1)
    try:
        state = _status(found)
    except MetricsError as error:
        raise click.ClickException(str(error)) from error
    if as_json:
        echo_json(state)
    else:
        _print_status(state)


def _status(found: LocalMetrics) -> dict[str, Any]:
    """Both servers (url, pid, log) and Prometheus' active scrape targets with their health."""
    targets = found.prometheus.api("/api/v1/targets", state="active")["activeTargets"]
    return {"running": True, "home": str(found.home),
            "prometheus": {"url": found.prometheus.url, "pid": found.prometheus.pid(),
                           "alerts": f"{found.prometheus.url}/alerts", "log": str(found.prometheus.log_path)},
            "pushgateway": {"url": found.pushgateway.url, "pid": found.pushgateway.pid(),
                            "log": str(found.pushgateway.log_path)},
            "targets": [{"job": t["labels"]["job"], "url": t["scrapeUrl"], "health": t["health"],
                         "last_error": t.get("lastError") or None} for t in targets]}


def _print_status(state: dict[str, Any]) -> None:
    prometheus, pushgateway = state["prometheus"], state["pushgateway"]
    click.echo(f"Prometheus {prometheus['url']} (pid {prometheus['pid']}; alerts: {prometheus['alerts']}), "
               f"log {prometheus['log']}")
    click.echo(f"Pushgateway {pushgateway['url']} (pid {pushgateway['pid']}), log {pushgateway['log']}")
    for target in state["targets"]:
        error = f": {target['last_error']}" if target["last_error"] else ""
        click.echo(f"target {target['job']} {target['url']} {target['health']}{error}")


def snapshot_document(snap: Snapshot) -> dict[str, Any]:
    """`metrics show --json`: the snapshot's figures, each topic's lag as {"last", "max"}; None where no series."""
    document = dataclasses.asdict(snap)
    document["lag"] = {topic: {"last": last, "max": worst} for topic, (last, worst) in snap.lag.items()}
    return document


@metrics.command()
@click.option("--window", default="15m", show_default=True,
              help="How far back each figure looks (a PromQL duration: 90s, 15m, 2h): the last value recorded in it, "
                   "the worst, and the records, commits and dead letters counted in it (Prometheus' increase(), "
                   "extrapolated to the window's edges).")
@click.option("--watch", type=click.FloatRange(min=1), default=None, metavar="SECONDS",
              help="Draw it again every SECONDS until Ctrl-C.")
@click.option("--url", default=None, help="Prometheus to ask (e.g. http://prometheus:9090)  [default: the one `start` "
                                          "started from --home]")
@_HOME
@_JSON
def show(window: str, watch: float | None, url: str | None, home: Path, as_json: bool) -> None:
    """Each table's freshness, the stream's Kafka lag, its batches and the alerts firing, as Prometheus recorded them.

    The operator's dashboard (pipelines/monitoring/dashboard.py says why a terminal one): the series the alert
    rules read, so what it shows and what fires agree. Exit 1 if Prometheus does not answer.
    """
    if as_json and watch is not None:
        raise click.UsageError("--json prints one reading: leave out --watch")
    url = url or LocalMetrics(home).prometheus.url
    while True:
        try:
            snap = read(url, window)
        except PrometheusError as error:
            raise click.ClickException(str(error)) from error
        if as_json:
            echo_json(snapshot_document(snap))
            return
        if watch is None:
            click.echo(render(snap))
            return
        click.clear()
        click.echo(render(snap) + f"\n(every {watch:g} s; Ctrl-C ends)")
        time.sleep(watch)
