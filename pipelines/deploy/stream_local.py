"""The bronze stream on the local target: one `lakehouse ingest` process, supervised through a run folder.

What `lakehouse stream ACTION` and the local `bronze_ingest_stream` DAG run. The run folder
holds the process's pid file, its log, and a lock that serialises supervisors, so two
`ensure` runs at once start one stream. The process is the contract's ingest command,
`lakehouse ingest` (the Python driver is the process itself, so SIGTERM reaches the
code that lets the batch in progress finish), started in its own session so that it
outlives the Airflow task that started it. Health comes from the stream's heartbeat
(pipelines.ingest.stream), which also guards the checkpoint against a second writer started by
anything else.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from pipelines.deploy.jobs import JOB_ENV
from pipelines.ingest.stream import ControlFiles, Health, Limits, judge, limits, process_started
from pipelines.settings import INGEST_TRIGGER_SECONDS, PROJECT_ROOT, lake_root

ACTIONS = ("status", "ensure", "start", "stop", "restart", "upgrade")


def default_run_dir() -> Path:
    return Path(os.environ.get("LAKEHOUSE_RUN_DIR") or PROJECT_ROOT / ".run") / "bronze-stream"


class SupervisorError(RuntimeError):
    pass


class LocalStream:
    def __init__(self, run_dir: Path | None = None, root: str | None = None,
                 trigger_seconds: float = INGEST_TRIGGER_SECONDS, lim: Limits | None = None) -> None:
        self.run_dir = run_dir or default_run_dir()
        self.root = root or lake_root()
        self.files = ControlFiles(self.root)
        self.lim = lim or limits()
        self.command = [str(PROJECT_ROOT / ".venv" / "bin" / "lakehouse"), "ingest",
                        "--trigger-seconds", f"{trigger_seconds:g}"]
        self.env = {**{k: os.environ[k] for k in JOB_ENV if os.environ.get(k)},
                    "LAKEHOUSE_ROOT": self.root, "LAKEHOUSE_TARGET": "local"}
        self.pid_file = self.run_dir / "stream.pid"
        self.log_file = self.run_dir / "stream.log"
        self.env["LAKEHOUSE_LOG_FILE"] = str(self.log_file)  # the stream's Spark and library logs too

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with (self.run_dir / "supervisor.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def pid(self) -> int | None:
        """The supervised process, while it runs (pid and start time both match the pid file)."""
        try:
            recorded = json.loads(self.pid_file.read_text())
        except (FileNotFoundError, ValueError):
            return None
        return recorded["pid"] if process_started(recorded["pid"]) == recorded["started"] else None

    def health(self) -> Health:
        return judge(self.files.heartbeat(), self.lim)

    def status(self) -> str:
        pid = self.pid()
        proc = f"process {pid} running" if pid else "no supervised process"
        health = self.health()
        return f"{health.state}: {health.why}; {proc} (log {self.log_file})"

    def run(self, action: str) -> str:
        if action not in ACTIONS:
            raise SupervisorError(f"unknown action {action!r}: expected one of {', '.join(ACTIONS)}")
        if action == "status":
            return self.status()
        with self._locked():
            if action == "ensure":
                return self._ensure()
            if action == "start":
                return self._start()
            stopped = self._stop()
            if action == "stop":
                return stopped
            # restart and upgrade: the new process runs the code installed now (after `git pull`
            # or a new wheel in .venv, for an upgrade) from the same checkpoint.
            return f"{stopped}; {self._start()}"

    def _ensure(self) -> str:
        health = self.health()
        if health.state == "healthy":
            return f"running: {health.why}"
        if (held := self.files.stop_request()) and not health.live and not self.pid():
            return (f"held: stopped by {held['by']} at {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(held['at']))}"
                    " UTC; `start`, `restart` or `upgrade` runs it again")
        if health.live or self.pid():  # stalled, or a process whose heartbeat is missing or stale
            return f"restarted ({health.state}: {health.why}): {self._stop()}; {self._start()}"
        return f"started ({health.state}: {health.why}): {self._start()}"

    def _start(self) -> str:
        if self.pid() or self.health().live:
            raise SupervisorError(f"a stream is already running: {self.health().why}")
        self.files.clear_stop()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("a") as log:
            log.write(f"\n== started by the supervisor at {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
            log.flush()
            proc = subprocess.Popen(self.command, env={**os.environ, **self.env},
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, cwd=PROJECT_ROOT)
        self.pid_file.write_text(json.dumps({"pid": proc.pid, "started": process_started(proc.pid)}))
        deadline = time.monotonic() + self.lim.start_timeout_seconds
        while time.monotonic() < deadline:
            hb = self.files.heartbeat()
            if hb is not None and hb.state == "running" and hb.pid == proc.pid:
                return f"stream started, pid {proc.pid}"
            if proc.poll() is not None:
                raise SupervisorError(f"the stream exited with {proc.returncode} while starting: "
                                      f"{self._log_tail()}")
            time.sleep(1)
        raise SupervisorError(f"the stream (pid {proc.pid}) wrote no heartbeat within "
                              f"{self.lim.start_timeout_seconds:.0f} s: {self._log_tail()}")

    def _stop(self) -> str:
        """Stop request, then SIGTERM, then SIGKILL, each after its timeout; the batch in progress commits whole."""
        pid = self.pid()
        self.files.request_stop("lakehouse stream stop")
        if pid is None and not self.health().live:
            return "no stream running"
        if self._wait_gone(pid, self.lim.stop_timeout_seconds):
            return "stream stopped after its batch"
        if pid is not None:
            os.kill(pid, signal.SIGTERM)  # the driver lets its batch finish (up to 300 s), then exits
            if self._wait_gone(pid, self.lim.kill_timeout_seconds):
                return "stream stopped by SIGTERM"
            os.killpg(pid, signal.SIGKILL)
            if self._wait_gone(pid, self.lim.kill_timeout_seconds):
                return "stream killed (SIGKILL): its batch in progress is re-run on the next start"
        raise SupervisorError(f"the stream did not stop: {self.health().why}")

    def _wait_gone(self, pid: int | None, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (self.pid() is None if pid is not None else True) and not self.health().live:
                return True
            time.sleep(0.5)
        return False

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_file.read_text().splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


@click.command("stream")
@click.argument("action", type=click.Choice(ACTIONS), default="status")
@click.option("--run-dir", type=click.Path(path_type=Path), default=None,
              help="Pid file, log and lock of the supervised stream  [default: $LAKEHOUSE_RUN_DIR/bronze-stream, "
                   ".run/bronze-stream]")
@click.option("--trigger-seconds", type=click.FloatRange(min=0), default=INGEST_TRIGGER_SECONDS, show_default=True,
              help="Micro-batch interval of a stream this starts.")
def stream(action: str, run_dir: Path | None, trigger_seconds: float) -> None:
    """Supervise the bronze ingest stream on this machine (what the bronze_ingest_stream DAG runs).

    \b
    status   health from the stream's heartbeat (exit 0 whatever it is)
    ensure   start one if none runs, restart one that died or stalled, else nothing
    start    start one (fails if one runs)
    stop     stop request (the batch in progress commits), then SIGTERM, then SIGKILL;
             the stream stays stopped (`ensure` leaves it) until start, restart or upgrade
    restart  stop, then start from the same checkpoint
    upgrade  the same, so that the code installed now runs (after `git pull` or a new wheel)

    Health limits and timeouts: hudi_configs/stream.toml.
    """
    try:
        click.echo(LocalStream(run_dir, trigger_seconds=trigger_seconds).run(action))
    except SupervisorError as exc:
        raise click.ClickException(str(exc)) from exc
