"""The bronze stream on the local target: one `lakehouse ingest` process, supervised through a run folder.

What `lakehouse stream status|ensure|start|stop|restart|upgrade|wait` and the local `bronze_ingest_stream`
DAG run. The run folder holds the process's pid file, its log, and a lock that serialises supervisors, so
two `ensure` runs at once start one stream. The process is the contract's ingest command,
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
from pipelines.deploy.stream_target import StreamTarget
from pipelines.errors import StreamError
from pipelines.ingest.stream import ControlFiles, Health, Limits, StreamState, judge, kafka_ends, limits, not_caught_up
from pipelines.runtime.commands import JSON_OPTION, command_lake, echo_json
from pipelines.runtime.lake import Lake
from pipelines.runtime.local_process import LocalProcess
from pipelines.runtime.settings import INGEST_TRIGGER_SECONDS, PROJECT_ROOT


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


def status_line(found: dict[str, Any]) -> str:
    """`stream status`'s text of a `LocalStream.snapshot`: the stream's health and why, then its process."""
    proc = f"process {found['pid']} running" if found["pid"] else "no supervised process"
    return f"{found['state']}: {found['why']}; {proc} (log {found['log']})"


class LocalStream(StreamTarget):
    """The stream of `lake` as a local process that this machine supervises (`lakehouse stream ...`)."""

    def __init__(self, lake: Lake, run_dir: Path | None = None, trigger_seconds: float = INGEST_TRIGGER_SECONDS,
                 lim: Limits | None = None) -> None:
        self.lake, self.run_dir = lake, run_dir or default_run_dir()
        self.root = lake.root
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

    def snapshot(self) -> dict[str, Any]:
        """What `stream status` reports, read once: the heartbeat's judgement and the supervised process."""
        health = self.health()
        return {"state": health.state, "why": health.why, "healthy": health.state == StreamState.HEALTHY,
                "live": health.live, "pid": self.pid(), "log": str(self.process.log_path)}

    def status(self) -> str:
        return status_line(self.snapshot())

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
        started, topics = time.monotonic(), list(self.lake.declaration.topics())
        ends = kafka_ends(self.lake.config.kafka, topics)
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


RUN_DIR_OPTION = click.option(
    "--run-dir", type=click.Path(path_type=Path), default=None,
    help="Pid file, log and lock of the supervised stream  [default: $LAKEHOUSE_RUN_DIR/bronze-stream, "
         ".run/bronze-stream]")
TRIGGER_OPTION = click.option("--trigger-seconds", type=click.FloatRange(min=0), default=INGEST_TRIGGER_SECONDS,
                              show_default=True, help="Micro-batch interval of a stream this starts.")


@click.group("stream")
def stream() -> None:
    """Supervise the bronze ingest stream on this machine (what the bronze_ingest_stream DAG runs).

    Health limits and timeouts: hudi_configs/stream.toml.
    """


@stream.command("status")
@RUN_DIR_OPTION
@JSON_OPTION
def stream_status(run_dir: Path | None, as_json: bool) -> None:
    """Health from the stream's heartbeat, and the supervised process; exit 0 only when the stream is healthy."""
    target = LocalStream(command_lake(), run_dir)
    found = target.snapshot()
    if as_json:
        echo_json(found)
    else:
        click.echo(status_line(found))
    if not found["healthy"]:
        raise SystemExit(1)


@stream.command("ensure")
@RUN_DIR_OPTION
@TRIGGER_OPTION
def stream_ensure(run_dir: Path | None, trigger_seconds: float) -> None:
    """Start one if none runs, restart one that died or stalled, else nothing; a stopped stream stays stopped."""
    click.echo(LocalStream(command_lake(), run_dir, trigger_seconds=trigger_seconds).run("ensure"))


@stream.command("start")
@RUN_DIR_OPTION
@TRIGGER_OPTION
def stream_start(run_dir: Path | None, trigger_seconds: float) -> None:
    """Start one (fails if one runs)."""
    click.echo(LocalStream(command_lake(), run_dir, trigger_seconds=trigger_seconds).run("start"))


@stream.command("stop")
@RUN_DIR_OPTION
def stream_stop(run_dir: Path | None) -> None:
    """Stop request (the batch in progress commits), then SIGTERM, then SIGKILL, each after its timeout; the stream
    stays stopped (`ensure` leaves it) until start, restart or upgrade."""
    click.echo(LocalStream(command_lake(), run_dir).run("stop"))


@stream.command("restart")
@RUN_DIR_OPTION
@TRIGGER_OPTION
def stream_restart(run_dir: Path | None, trigger_seconds: float) -> None:
    """Stop, then start from the same checkpoint."""
    click.echo(LocalStream(command_lake(), run_dir, trigger_seconds=trigger_seconds).run("restart"))


@stream.command("upgrade")
@RUN_DIR_OPTION
@TRIGGER_OPTION
def stream_upgrade(run_dir: Path | None, trigger_seconds: float) -> None:
    """Stop, then start from the same checkpoint, so that the code installed now runs (after `git pull` or a new
    wheel)."""
    click.echo(LocalStream(command_lake(), run_dir, trigger_seconds=trigger_seconds).run("upgrade"))


@stream.command("wait")
@RUN_DIR_OPTION
@click.option("--timeout", type=click.FloatRange(min=0), default=600.0, show_default=True,
              help="Seconds to wait before giving up (exit 1, saying what is left).")
def stream_wait(run_dir: Path | None, timeout: float) -> None:
    """Until the running stream has committed every record on its topics now (before a planned stop, or a job
    that must see them in bronze); exit 1 after --timeout, saying what is left."""
    click.echo(LocalStream(command_lake(), run_dir).wait(timeout))
