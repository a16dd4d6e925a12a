"""A real Spark standalone cluster on 127.0.0.1: one master and two workers of one core each.

What `local[2]` never shows, this does: the driver and the executors are separate JVMs, so the
Hudi bundle, the project's code and every file an executor reads must reach them, Hudi's timeline
server on the driver is called over HTTP, and an executor can die under a batch (`make cluster-up`,
then `LAKEHOUSE_SPARK_MASTER=spark://127.0.0.1:7077` for every job; pipelines/runtime/spark_conf.py).

The daemons are the pip pyspark's own (`bin/spark-class org.apache.spark.deploy.master.Master`,
`...worker.Worker`; the wheel has no sbin/ scripts), each a `LocalProcess`: pid file and log in
the cluster's folder (`.cluster/` for `make cluster-up`), found again by `stop` and `status`.
An executor is a child of its worker, in the worker's session: stopping or killing a worker ends
its executors with it, as losing a host would.
"""

from __future__ import annotations

import json
import os
import signal
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import click

from pipelines.errors import StartFailed
from pipelines.runtime.commands import echo_json
from pipelines.runtime.local_process import (
    HOST,
    LocalProcess,
    command_line,
    free_port,
    port_open,
    saved_state,
)
from pipelines.runtime.settings import PROJECT_ROOT, spark_home

DEFAULT_DIR = PROJECT_ROOT / ".cluster"
DEFAULT_PORT = 7077
# Not 8080, Spark's default: `make airflow` serves its UI there.
DEFAULT_UI_PORT = 8090
WORKERS = 2
WORKER_CORES = 1
# What a worker may hand its executors: spark.toml [cluster] asks 2g of heap per executor, and
# a JVM's own overhead comes on top of the heap.
WORKER_MEMORY = "3g"
# The master's and the workers' own heap (Spark's default is 1g each): they only schedule.
DAEMON_MEMORY = "256m"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"


def fetch_json(url: str, timeout: float = 3.0) -> Any:
    """GET a daemon's JSON page (the master's and each worker's web UI serve `/json/`)."""
    with urllib.request.urlopen(url, timeout=timeout) as answer:
        return json.load(answer)


def _daemon_env() -> dict[str, str]:
    # spark-class finds SPARK_HOME with whatever python3 is first on PATH; name the one of .venv.
    return {**os.environ, "SPARK_HOME": str(spark_home()), "SPARK_DAEMON_MEMORY": DAEMON_MEMORY}


@dataclass
class _Daemon(LocalProcess):
    """A master or a worker, started by spark-class with a properties file of its own.

    The properties file's path, in the JVM's command line, is what tells this cluster's
    daemon from any other Spark daemon on the machine.
    """

    home: Path
    name: str
    ui_port: int

    @property
    def pid_path(self) -> Path:
        return self.home / f"{self.name}.pid"

    @property
    def log_path(self) -> Path:
        return self.home / f"{self.name}.log"

    @property
    def properties_path(self) -> Path:
        return self.home / f"{self.name}.conf"

    @property
    def marker(self) -> str:
        return str(self.properties_path)

    @property
    def ui_url(self) -> str:
        return f"http://{HOST}:{self.ui_port}"

    def popen_options(self) -> dict[str, Any]:
        return {"cwd": self.home, "env": _daemon_env()}

    def spark_class(self, main_class: str, *args: str) -> list[str]:
        return [str(spark_home() / "bin" / "spark-class"), main_class, "--properties-file",
                str(self.properties_path), *args]

    def prepare(self, log_start: int) -> None:
        # The file's path in the JVM's command line is what marks this cluster's daemon (`marker`); its
        # one setting is Spark's default made explicit. The daemons log to stdout, our log file, at INFO.
        self.properties_path.write_text("spark.ui.showConsoleProgress=false\n")


@dataclass
class Master(_Daemon):
    label = "Spark master"

    port: int = DEFAULT_PORT

    @property
    def url(self) -> str:
        return f"spark://{HOST}:{self.port}"

    def command(self) -> list[str]:
        return self.spark_class(MASTER_CLASS, "--host", HOST, "--port", str(self.port),
                                "--webui-port", str(self.ui_port))

    def unready(self, pid: int, deadline: float) -> str | None:
        if not port_open(self.port):
            return f"not listening on {self.url} yet"
        try:
            state = fetch_json(f"{self.ui_url}/json/").get("status")
        except (urllib.error.URLError, OSError, ValueError):
            return f"no answer on {self.ui_url}/json/"
        return None if state == "ALIVE" else f"master status {state}"


@dataclass
class Worker(_Daemon):
    label = "Spark worker"
    stop_timeout = 20.0

    master: Master = field(repr=False, default=None)  # type: ignore[assignment]
    cores: int = WORKER_CORES
    memory: str = WORKER_MEMORY

    @property
    def work_dir(self) -> Path:
        """Where the worker runs its executors: `<work_dir>/<app id>/<executor id>/` (stdout, stderr, files)."""
        return self.home / f"{self.name}-work"

    def command(self) -> list[str]:
        return self.spark_class(WORKER_CLASS, self.master.url, "--host", HOST, "--cores", str(self.cores),
                                "--memory", self.memory, "--webui-port", str(self.ui_port),
                                "--work-dir", str(self.work_dir))

    def unready(self, pid: int, deadline: float) -> str | None:
        if self.master.pid() is None:
            raise StartFailed(f"{self.label} {self.name}: the master is not running")
        try:
            workers = fetch_json(f"{self.master.ui_url}/json/").get("workers", [])
        except (urllib.error.URLError, OSError, ValueError):
            return f"no answer from the master on {self.master.ui_url}/json/"
        mine = [w for w in workers if w.get("webuiaddress", "").endswith(f":{self.ui_port}")
                and w.get("state") == "ALIVE"]
        return None if mine else f"not registered with {self.master.url} yet"

    def executor_pids(self) -> list[int]:
        """The executor JVMs this worker runs now (children of its JVM)."""
        pid = self.pid()
        if pid is None:
            return []
        # A child is listed under the thread that started it (an ExecutorRunner's), not the main one.
        children = {c for t in Path(f"/proc/{pid}/task").glob("*/children") for c in _read(t).split()}
        return [int(c) for c in sorted(children) if EXECUTOR_CLASS in command_line(int(c))]


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:  # the thread ended meanwhile
        return ""


@dataclass
class LocalCluster:
    """The master and its workers, their ports kept in `<home>/cluster.json` for `stop` and `status`.

    `port` or `ui_port` 0: free ports, chosen at `start`.
    """

    home: Path
    port: int = DEFAULT_PORT
    ui_port: int = DEFAULT_UI_PORT
    workers: int = WORKERS
    master: Master = field(init=False)
    worker_list: list[Worker] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self.home = Path(self.home).resolve()
        saved = self._saved()
        if saved:
            self.port, self.ui_port, self.workers = saved["port"], saved["ui_port"], len(saved["worker_ui_ports"])
        ui_ports = saved["worker_ui_ports"] if saved else [0] * self.workers
        self.master = Master(self.home, "master", self.ui_port, port=self.port)
        self.worker_list = [Worker(self.home, f"worker{n + 1}", ui, master=self.master)
                            for n, ui in enumerate(ui_ports)]

    @property
    def url(self) -> str:
        return self.master.url

    @property
    def state_path(self) -> Path:
        return self.home / "cluster.json"

    def _saved(self) -> dict[str, Any] | None:
        return saved_state(self.state_path)

    def start(self, timeout: float = 90.0) -> Self:
        """Start whatever of the cluster is not running (all of it on a first start) and wait for it."""
        self.home.mkdir(parents=True, exist_ok=True)
        if self.master.pid() is None and self._saved() is None:
            self.master.port = self.port = self.port or free_port()
            asked = self.ui_port
            self.master.ui_port = self.ui_port = asked or free_port()
            for n, worker in enumerate(self.worker_list):
                worker.ui_port = asked + n + 1 if asked else free_port()
            self.state_path.write_text(json.dumps({"port": self.port, "ui_port": self.ui_port,
                                                   "worker_ui_ports": [w.ui_port for w in self.worker_list]}))
        try:
            self.master.start(timeout)
            for worker in self.worker_list:
                worker.start(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the workers (their executors with them), then the master; the folder keeps the logs."""
        for worker in self.worker_list:
            worker.stop()
        self.master.stop()
        self.state_path.unlink(missing_ok=True)

    def kill_worker(self, n: int) -> None:
        """SIGKILL worker `n` and its executors at once: a host lost for good."""
        self.worker_list[n].kill()

    def kill_executor(self, n: int) -> int | None:
        """SIGKILL the executor JVM(s) of worker `n`, the worker left running; the first pid killed, if any."""
        pids = self.worker_list[n].executor_pids()
        for pid in pids:
            LocalProcess.send(pid, signal.SIGKILL, group=False)
        return pids[0] if pids else None

    def state(self) -> dict[str, Any]:
        """The master's `/json/` page: its status, workers, running and completed applications."""
        return fetch_json(f"{self.master.ui_url}/json/")

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# Task metrics of an event log's SparkListenerTaskEnd, milliseconds (the shuffle write's is in ns).
_TASK_MS = {"run": "Executor Run Time", "deserialize": "Executor Deserialize Time",
            "result_serialization": "Result Serialization Time", "gc": "JVM GC Time"}


@dataclass
class AppTasks:
    """What an application's event log says of its tasks: where they ran and where their time went."""

    app_id: str = ""
    name: str = ""
    succeeded: Counter = field(default_factory=Counter)  # executor id -> tasks that succeeded there
    failed: list[str] = field(default_factory=list)  # the reason of each task that did not
    seconds: Counter = field(default_factory=Counter)  # summed over tasks: run, deserialize, ..., shuffle
    shuffle_bytes: int = 0  # read by tasks, local and remote

    @classmethod
    def read(cls, path: Path) -> AppTasks:
        """Parse an event log (Spark's JSON lines, `spark.eventLog.dir`), complete or in progress."""
        app = cls()
        for line in path.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:  # the last line of a log still being written
                continue
            kind = event.get("Event")
            if kind == "SparkListenerApplicationStart":
                app.app_id, app.name = event.get("App ID", ""), event.get("App Name", "")
            elif kind == "SparkListenerTaskEnd":
                reason = event["Task End Reason"]["Reason"]
                if reason != "Success":
                    app.failed.append(reason)
                    continue
                app.succeeded[event["Task Info"]["Executor ID"]] += 1
                metrics = event.get("Task Metrics") or {}
                for name, key in _TASK_MS.items():
                    app.seconds[name] += metrics.get(key, 0) / 1000
                read = metrics.get("Shuffle Read Metrics") or {}
                app.seconds["shuffle_fetch_wait"] += read.get("Fetch Wait Time", 0) / 1000
                app.seconds["shuffle_write"] += (metrics.get("Shuffle Write Metrics") or {}).get(
                    "Shuffle Write Time", 0) / 1e9
                app.shuffle_bytes += read.get("Remote Bytes Read", 0) + read.get("Local Bytes Read", 0)
        return app

    def summary(self) -> dict[str, Any]:
        return {"tasks": sum(self.succeeded.values()), "failed_tasks": len(self.failed),
                "task_seconds": {k: round(v, 1) for k, v in self.seconds.items()},
                "shuffle_mb": round(self.shuffle_bytes / 2**20, 1)}


_HOME = click.option("--home", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_DIR,
                     show_default=True, help="Folder of the daemons' pid files, logs, configs and work dirs.")


@click.group("cluster")
def cluster() -> None:
    """A local Spark standalone cluster (a master, two one-core workers) on 127.0.0.1."""


@cluster.command()
@click.option("--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT, show_default=True,
              help="The master's port (0: any free one).")
@click.option("--ui-port", type=click.IntRange(0, 65535), default=DEFAULT_UI_PORT, show_default=True,
              help="The master's web UI; the workers' are the next ports (0: any free ones).")
@_HOME
def start(port: int, ui_port: int, home: Path) -> None:
    """Start the master and the workers (what already runs is kept) and wait until all are registered."""
    try:
        running = LocalCluster(home, port, ui_port).start()
    except RuntimeError as error:
        raise click.ClickException(str(error)) from error
    _print_status(_status(running))
    click.echo(f"jobs run there with: export LAKEHOUSE_SPARK_MASTER={running.url}")


@cluster.command()
@_HOME
def stop(home: Path) -> None:
    """Stop the workers, their executors and the master."""
    LocalCluster(home).stop()
    click.echo("Spark cluster stopped")


@cluster.command()
@_HOME
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout instead of lines.")
def status(home: Path, as_json: bool) -> None:
    """The master URL, its web UI, the workers and the applications; exit 1 if the master is down."""
    found = LocalCluster(home)
    if found.master.pid() is None:
        if as_json:
            echo_json({"running": False, "home": str(found.home)})
        else:
            click.echo(f"no Spark master runs from {found.home}: `make cluster-up` starts one")
        raise SystemExit(1)
    state = _status(found)
    if as_json:
        echo_json(state)
    else:
        _print_status(state)


def _status(found: LocalCluster) -> dict[str, Any]:
    """The master, its workers and its applications, from the master's `/json/` page."""
    state = found.state()
    return {"running": True, "home": str(found.home), "master": found.url, "status": state.get("status"),
            "web_ui": found.master.ui_url,
            "workers": [{"id": w["id"], "state": w["state"], "cores": w["cores"], "memory_mb": w["memory"],
                         "cores_used": w["coresused"], "web_ui": w["webuiaddress"]} for w in state.get("workers", [])],
            "applications": [{"id": app["id"], "name": app["name"], "state": app["state"], "kind": kind[:-4]}
                             for kind in ("activeapps", "completedapps") for app in state.get(kind, [])]}


def _print_status(state: dict[str, Any]) -> None:
    click.echo(f"master {state['master']} ({state['status']}), web UI {state['web_ui']} "
               f"(applications: {state['web_ui']}/json/)")
    for w in state["workers"]:
        click.echo(f"worker {w['id']} {w['state']}: {w['cores']} core(s), {w['memory_mb']} MB, "
                   f"{w['cores_used']} in use, UI {w['web_ui']}")
    for app in state["applications"]:
        click.echo(f"application {app['id']} {app['name']} {app['state']} ({app['kind']})")
    click.echo(f"logs: {state['home']}/*.log; executors' logs under {state['home']}/worker*-work/")
