"""Debezium's connector kept streaming: Kafka Connect never restarts a FAILED task by itself.

Debezium 2.7's PostgreSQL task restarts itself when it loses the database, 10 s later
(`retriable.restart.connector.wait.ms`). When the database is still away then (an outage of more
than those 10 s), the new task's first query (the database's encoding) fails as not retriable and the
task stays FAILED whatever happens to the database afterwards; Debezium made that error retriable
after 2.7 (DBZ-7872). Until someone restarts the task nothing flows, the replication slot
holds the database's WAL, and the lake's freshness slips.

`ensure_running` is that someone, run every few minutes (the `debezium_connector` DAG, or
`lakehouse connector ensure` from cron). It restarts only what failed (Connect's `onlyFailed`,
KIP-745): the connector's offsets and slot are untouched, the task resumes where it stopped, and what
it sends again is a replay, harmless to the lake (the LSN rule). Each call goes through
pipelines.source.connect_rest, so it carries `[connect]`'s credentials and CA when given a `ConnectClient`
(a bare URL is an open REST port). Standard library only: the Airflow worker imports it without Spark or the
project's other dependencies.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from pipelines.errors import ConnectError
from pipelines.source.connect_rest import ConnectClient

# The configuration's variables of [connect] url and connector (pipelines.runtime.config.ALIASES), as the
# commands' help names them.
CONNECT_URL_VARIABLE = "LAKEHOUSE_CONNECT_URL"
CONNECTOR_VARIABLE = "LAKEHOUSE_CONNECTOR"
DEFAULT_CONNECT_URL = "http://127.0.0.1:8083"
DEFAULT_CONNECTOR = "shop-source"  # the name `lakehouse dev source start` gives it (lakehouse_dev.connect_config)


@dataclass(frozen=True)
class ConnectorState:
    """What Connect's `/connectors/<name>/status` says: the connector's state and each task's."""

    name: str
    state: str  # RUNNING, PAUSED, FAILED, UNASSIGNED, RESTARTING
    tasks: dict[int, str]
    trace: str | None = None  # the first line of the first failed one's trace

    @property
    def failed(self) -> bool:
        return self.state == "FAILED" or "FAILED" in self.tasks.values()

    @property
    def running(self) -> bool:
        return self.state == "RUNNING" and bool(self.tasks) and set(self.tasks.values()) == {"RUNNING"}

    def line(self) -> str:
        tasks = ", ".join(f"task {i} {s}" for i, s in sorted(self.tasks.items())) or "no task"
        return f"connector {self.name}: {self.state}, {tasks}" + (f" ({self.trace})" if self.trace else "")

    @classmethod
    def parse(cls, name: str, status: dict[str, Any]) -> ConnectorState:
        tasks = {int(t["id"]): t["state"] for t in status.get("tasks", [])}
        traces = [t.get("trace") for t in [status.get("connector", {}), *status.get("tasks", [])]
                  if t.get("state") == "FAILED" and t.get("trace")]
        return cls(name, status.get("connector", {}).get("state", "UNKNOWN"), tasks,
                   traces[0].strip().splitlines()[0][:300] if traces else None)


def client(target: str | ConnectClient) -> ConnectClient:
    """The REST client of `target`: itself, or an unauthenticated one at a bare URL."""
    return target if isinstance(target, ConnectClient) else ConnectClient(target.rstrip("/"))


def connector_state(target: str | ConnectClient, name: str, timeout: float = 10.0) -> ConnectorState:
    """The connector's state as Connect reports it now."""
    return ConnectorState.parse(name, client(target).status(name, timeout=timeout))


def restart_failed(target: str | ConnectClient, name: str) -> ConnectorState | None:
    """Restart the connector's failed parts (its offsets kept); what was found failed, else None (nothing done)."""
    found = connector_state(target, name)
    if not found.failed:
        return None
    client(target).restart(name, only_failed=True)
    return found


def ensure_running(target: str | ConnectClient, name: str, *, wait_seconds: float = 60.0, poll_seconds: float = 1.0
                   ) -> tuple[ConnectorState, ConnectorState | None]:
    """Restart the connector's failed parts, if any, and wait until every task runs.

    Returns (what was found, what the restart gave; None when nothing had failed). Raises ConnectError
    when Connect does not answer, or when the restarted task has not run within `wait_seconds` (the
    database still away: the next call tries again).
    """
    found = restart_failed(target, name)
    if found is None:
        return connector_state(target, name), None
    deadline = time.monotonic() + wait_seconds
    while True:
        now = connector_state(target, name)
        if now.running:
            return found, now
        if time.monotonic() >= deadline:
            raise ConnectError(f"restarted after {found.line()}; after {wait_seconds:.0f} s: {now.line()}")
        time.sleep(poll_seconds)
