"""The bronze stream as an operator (or the `bronze_ingest_stream` DAG) runs it: `lakehouse stream ACTION`.

Tests and benchmarks that put faults around the stream drive it through the same commands the DAG
runs, each in its own process, so the stream under test is the supervised one (its own process and
JVM, its run folder's pid file, log and lock), not a query inside the test's process. Its lake, run
folder and stream overrides live under one `home`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pipelines.runtime.local_process import process_started

OVERRIDES_VARIABLE = "LAKEHOUSE_HUDI_OVERRIDES"
# The `lakehouse stream` subcommands that may start a stream: the ones that take --trigger-seconds.
STARTING_ACTIONS = ("ensure", "start", "restart", "upgrade")


class SupervisorError(RuntimeError):
    """A `lakehouse stream` command failed or did not say what was expected; the message holds its output."""


@dataclass
class Supervised:
    """The stream as `lakehouse stream ACTION` runs it, on a lake in `home`, reading Kafka at `bootstrap`.

    `overrides`: TOML appended to LAKEHOUSE_HUDI_OVERRIDES for the stream (stream limits, Kafka
    timeouts), in `home/stream.toml`; empty, the project's own settings. `extra_env`: more of the
    commands' environment (the stream inherits it).
    """

    home: Path
    bootstrap: str
    overrides: str = ""
    trigger_seconds: float = 2.0
    extra_env: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(init=False)

    def __post_init__(self) -> None:
        self.home = Path(self.home).resolve()
        self.home.mkdir(parents=True, exist_ok=True)
        files = [f for f in os.environ.get(OVERRIDES_VARIABLE, "").split(os.pathsep) if f]
        if self.overrides:
            mine = self.home / "stream.toml"
            mine.write_text(self.overrides)
            files.append(str(mine))
        self.env = {**os.environ, "LAKEHOUSE_ROOT": str(self.root), "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap,
                    "LAKEHOUSE_RUN_DIR": str(self.home / "run"), **self.extra_env}
        if files:
            self.env[OVERRIDES_VARIABLE] = os.pathsep.join(files)

    @property
    def root(self) -> Path:
        return self.home / "lake"

    @property
    def log_path(self) -> Path:
        return self.home / "run" / "bronze-stream" / "stream.log"

    def run(self, action: str, expect: str = "", timeout: float = 900) -> str:
        """`lakehouse stream ACTION`; its output. Raises unless it exits as it should (`status`: 0 when healthy,
        else 1; any other action: 0) with `expect` in its output."""
        starts = ["--trigger-seconds", f"{self.trigger_seconds:g}"] if action in STARTING_ACTIONS else []
        done = subprocess.run([sys.executable, "-m", "pipelines.cli", "stream", action, *starts], env=self.env,
                              capture_output=True, text=True, timeout=timeout)
        code = 1 if action == "status" and not done.stdout.startswith("healthy") else 0
        if done.returncode != code or expect not in done.stdout:
            raise SupervisorError(f"stream {action} (exit {done.returncode}): {done.stdout}{done.stderr}")
        return done.stdout.strip()

    def pid(self) -> int | None:
        """The supervised process's pid while it runs (pid and start time as its pid file says), else None."""
        with contextlib.suppress(FileNotFoundError, ValueError, KeyError, TypeError):
            recorded = json.loads((self.home / "run" / "bronze-stream" / "stream.pid").read_text())
            pid, started = int(recorded["pid"]), recorded.get("started")
            running = process_started(pid)
            if running is not None and (started is None or running == started):
                return pid
        return None

    def batches_started(self) -> int:
        return self.log_path.read_text(errors="replace").count(": started")

    def kill(self) -> None:
        """SIGKILL the supervised process's whole session, if it still runs."""
        with contextlib.suppress(TypeError, ProcessLookupError, PermissionError):
            os.killpg(self.pid(), signal.SIGKILL)  # type: ignore[arg-type]

    @contextlib.contextmanager
    def running(self) -> Iterator[Supervised]:
        """Started, and at the end stopped (its batch commits); killed if the block failed before."""
        self.run("start", "stream started")
        try:
            yield self
            self.run("stop", "stopped")
        finally:
            self.kill()
