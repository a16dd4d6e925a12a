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
import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from pipelines.deploy.jobs import JOB_ENV
from pipelines.deploy.stream_target import ACTIONS, StreamError, StreamTarget
from pipelines.ingest.stream import ControlFiles, Health, Limits, judge, kafka_ends, limits, not_caught_up
from pipelines.lake.declaration import declared
from pipelines.runtime.local_process import LocalProcess
from pipelines.runtime.settings import INGEST_TRIGGER_SECONDS, PROJECT_ROOT, kafka_bootstrap, lake_root


def default_run_dir() -> Path:
    return Path(os.environ.get("LAKEHOUSE_RUN_DIR") or PROJECT_ROOT / ".run") / "bronze-stream"


class StreamProcess(LocalProcess):
    """The supervised `lakehouse ingest`, ready once its heartbeat says it runs; gone once no heartbeat lives."""

    label = "the stream"
    # SIGTERM to the driver alone: it lets its batch finish (up to 300 s), then exits; its JVM must
    # not die under it. SIGKILL, if it comes to that, takes the whole session.
    stop_group = False
    error = StreamError
    poll_seconds = 0.5

    def __init__(self, run_dir: Path, argv: list[str], env: dict[str, str], files: ControlFiles, lim: Limits) -> None:
        self.run_dir, self.argv, self.env, self.files, self.lim = run_dir, argv, env, files, lim
        self.start_timeout, self.kill_timeout = lim.start_timeout_seconds, lim.kill_timeout_seconds

    @property
    def pid_path(self) -> Path:
        return self.run_dir / "stream.pid"

    @property
    def log_path(self) -> Path:
        return self.run_dir / "stream.log"

    def command(self) -> list[str]:
        return self.argv

    def popen_options(self) -> dict[str, Any]:
        # LAKEHOUSE_LOG_FILE: the stream's Spark and library logs go to its log too.
        return {"env": {**os.environ, **self.env, "LAKEHOUSE_LOG_FILE": str(self.log_path)}, "cwd": PROJECT_ROOT}

    def prepare(self, log_start: int) -> None:
        with self.log_path.open("a") as log:
            log.write(f"\n== started by the supervisor at {time.strftime('%Y-%m-%d %H:%M:%S')}\n")

    def unready(self, pid: int, deadline: float) -> str | None:
        hb = self.files.heartbeat()
        return None if hb is not None and hb.state == "running" and hb.pid == pid else "no heartbeat of it yet"

    def exited(self, pid: int | None) -> bool:
        return (pid is None or self.pid() != pid) and not judge(self.files.heartbeat(), self.lim).live


class LocalStream(StreamTarget):
    def __init__(self, run_dir: Path | None = None, root: str | None = None,
                 trigger_seconds: float = INGEST_TRIGGER_SECONDS, lim: Limits | None = None) -> None:
        self.run_dir = run_dir or default_run_dir()
        self.root = root or lake_root()
        self.files = ControlFiles(self.root)
        self.lim = lim or limits()
        command = [str(PROJECT_ROOT / ".venv" / "bin" / "lakehouse"), "ingest",
                   "--trigger-seconds", f"{trigger_seconds:g}"]
        env = {**{k: os.environ[k] for k in JOB_ENV if os.environ.get(k)},
               "LAKEHOUSE_ROOT": self.root, "LAKEHOUSE_TARGET": "local"}
        self.process = StreamProcess(self.run_dir, command, env, self.files, self.lim)

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """A lock in the run folder: two `ensure` runs at once start one stream."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with (self.run_dir / "supervisor.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def pid(self) -> int | None:
        """The supervised process, while it runs (pid and start time both match the pid file)."""
        return self.process.pid()

    def health(self) -> Health:
        return judge(self.files.heartbeat(), self.lim)

    def status(self) -> str:
        pid = self.pid()
        proc = f"process {pid} running" if pid else "no supervised process"
        health = self.health()
        return f"{health.state}: {health.why}; {proc} (log {self.process.log_path})"

    def ensure(self) -> str:
        health = self.health()
        if health.running:  # healthy, or waiting for Kafka: a restart would wait too
            return f"running: {health.why}"
        if (held := self.files.stop_request()) and not health.live and not self.pid():
            return (f"held: stopped by {held['by']} at {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(held['at']))}"
                    " UTC; `start`, `restart` or `upgrade` runs it again")
        if health.live or self.pid():  # stalled, or a process whose heartbeat is missing or stale
            return f"restarted ({health.state}: {health.why}): {self.stop()}; {self.start()}"
        return f"started ({health.state}: {health.why}): {self.start()}"

    def start(self) -> str:
        if self.pid() or self.health().live:
            raise StreamError(f"a stream is already running: {self.health().why}")
        self.files.clear_stop()
        # Not `process.launch`: a stream slow to beat is left running, for the next `ensure` to judge.
        pid, log_start = self.process.spawn()
        self.process.wait_ready(pid, time.monotonic() + self.lim.start_timeout_seconds, log_start)
        return f"stream started, pid {pid}"

    def wait(self, timeout: float) -> str:
        """Wait until the stream has committed everything on its topics at the call (`not_caught_up`)."""
        started, topics = time.monotonic(), list(declared().topics())
        ends = kafka_ends(kafka_bootstrap(), topics)
        while why := not_caught_up(self.files.heartbeat(), ends):
            if time.monotonic() - started > timeout:
                raise StreamError(f"not caught up after {timeout:g} s: {why}")
            time.sleep(1.0)
        return (f"caught up in {time.monotonic() - started:.1f} s: every record on the {len(topics)} topics "
                "when asked is in bronze or a dead letter")

    def stop(self) -> str:
        """Stop request, then SIGTERM, then SIGKILL, each after its timeout; the batch in progress commits whole."""
        pid = self.pid()
        self.files.request_stop("lakehouse stream stop")
        if pid is None and not self.health().live:
            return "no stream running"
        if self.process.wait_exit(pid, self.lim.stop_timeout_seconds):
            return "stream stopped after its batch"
        if pid is not None:
            ended = self.process.terminate(pid, self.lim.kill_timeout_seconds)
            if ended == signal.SIGTERM:
                return "stream stopped by SIGTERM"
            if ended == signal.SIGKILL:
                return "stream killed (SIGKILL): its batch in progress is re-run on the next start"
        raise StreamError(f"the stream did not stop: {self.health().why}")


@click.command("stream")
@click.argument("action", type=click.Choice([*ACTIONS, "wait"]), default="status")
@click.option("--run-dir", type=click.Path(path_type=Path), default=None,
              help="Pid file, log and lock of the supervised stream  [default: $LAKEHOUSE_RUN_DIR/bronze-stream, "
                   ".run/bronze-stream]")
@click.option("--trigger-seconds", type=click.FloatRange(min=0), default=INGEST_TRIGGER_SECONDS, show_default=True,
              help="Micro-batch interval of a stream this starts.")
@click.option("--timeout", type=click.FloatRange(min=0), default=600.0, show_default=True,
              help="`wait`: seconds to wait before giving up (exit 1, saying what is left).")
def stream(action: str, run_dir: Path | None, trigger_seconds: float, timeout: float) -> None:
    """Supervise the bronze ingest stream on this machine (what the bronze_ingest_stream DAG runs).

    \b
    status   health from the stream's heartbeat (exit 0 whatever it is)
    ensure   start one if none runs, restart one that died or stalled, else nothing
    start    start one (fails if one runs)
    stop     stop request (the batch in progress commits), then SIGTERM, then SIGKILL;
             the stream stays stopped (`ensure` leaves it) until start, restart or upgrade
    restart  stop, then start from the same checkpoint
    upgrade  the same, so that the code installed now runs (after `git pull` or a new wheel)
    wait     until the running stream has committed every record on its topics now (before a planned
             stop, or a job that must see them in bronze); exit 1 after --timeout, saying what is left

    Health limits and timeouts: hudi_configs/stream.toml.
    """
    try:
        target = LocalStream(run_dir, trigger_seconds=trigger_seconds)
        click.echo(target.wait(timeout) if action == "wait" else target.run(action))
    except StreamError as exc:
        raise click.ClickException(str(exc)) from exc
