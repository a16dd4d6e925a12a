"""What keeping the bronze stream running means on any target: the actions, and one dispatch of them.

`lakehouse stream ACTION` (pipelines.deploy.stream_local) and the emr target's DAG task
(pipelines.deploy.stream_emr) run the same six actions; each target says how to start, stop,
judge and ensure its stream, and `StreamTarget.run` maps an action onto them, so both targets
accept the same actions and refuse any other the same way.

Pure Python: Airflow's environment imports it.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterator

from pipelines.errors import StreamError

ACTIONS = ("status", "ensure", "start", "stop", "restart", "upgrade")


class StreamTarget(ABC):
    """One target's stream: `run(action)` is the entry point, serialised by `exclusive` (status excepted)."""

    @abstractmethod
    def status(self) -> str:
        """Health from the heartbeat, and what runs the stream; changes nothing."""

    @abstractmethod
    def ensure(self) -> str:
        """Start a stream if none runs, restart one that died or stalled, else nothing; a held stop holds."""

    @abstractmethod
    def start(self) -> str:
        """Start a stream; refuse if one runs (one writer per checkpoint)."""

    @abstractmethod
    def stop(self) -> str:
        """Stop request (the batch in progress commits), then ever harder signals, each after its timeout."""

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Held while an action changes the stream; a target whose supervisors may overlap takes a lock."""
        yield

    def run(self, action: str) -> str:
        if action not in ACTIONS:
            raise StreamError(f"unknown action {action!r}: expected one of {', '.join(ACTIONS)}")
        if action == "status":
            return self.status()
        with self.exclusive():
            if action == "ensure":
                return self.ensure()
            if action == "start":
                return self.start()
            stopped = self.stop()
            if action == "stop":
                return stopped
            # restart and upgrade: the new process runs the code installed now (after `git pull`
            # or a new wheel, for an upgrade) from the same checkpoint.
            return f"{stopped}; {self.start()}"
