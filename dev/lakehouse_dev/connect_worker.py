"""The real source's Kafka Connect worker: a standalone Connect running the Debezium PostgreSQL connector,
and the replication slot it streams from, as `lakehouse dev source` and the tests see them.

A module of its own beside dev/lakehouse_dev/pg_source.py, which starts PostgreSQL and this worker
together (`RealSource`): the worker is the part that speaks Kafka Connect's REST API and waits for
the slot to stream, and the slot's figures are what `source status` and the soak report.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lakehouse_dev.connect_config import (
    CONNECT_LOG4J,
    CONNECTOR,
    DATABASE,
    PG_USER,
    SLOT,
    connector_config,
    worker_config,
)
from lakehouse_dev.kafka_local import java_options
from pipelines.errors import StartFailed
from pipelines.lake.declaration import Declaration
from pipelines.runtime.local_process import HOST, LocalProcess, java_command, port_open
from pipelines.runtime.settings import jvm_dir

CONNECT_HEAP = ("-Xmx512m", "-Xms128m")


class SourceError(RuntimeError):
    """The real source could not be started, reached or stopped; the message says which part and why."""


@dataclass
class ConnectWorker(LocalProcess):
    """A standalone Kafka Connect worker running the Debezium connector, its state in `work_dir`.

    Detached (own session), so it outlives `source start`; found again through its pid file. `stop`
    (SIGTERM) lets Connect commit the offsets of what it delivered, so a restart replays nothing;
    `kill` (SIGKILL) delivers again what it delivered since its last offset flush.
    """

    label = "Kafka Connect"
    error = SourceError
    start_timeout = 180.0
    stop_timeout = 60.0
    kill_timeout = 30.0
    poll_seconds = 0.5

    work_dir: Path
    bootstrap: str
    pg_port: int
    rest_port: int = 8083
    schemas_enable: bool = True
    offset_flush_ms: int = 1000
    declaration: Declaration | None = None  # the captured tables' (None: the one in force)
    debezium_port: int | None = None  # where Debezium reaches PostgreSQL (a proxy in front of it); None: pg_port

    def __post_init__(self) -> None:
        self.work_dir = Path(self.work_dir).resolve()

    @property
    def database_port(self) -> int:
        """The port Debezium's connector is given for PostgreSQL."""
        return self.debezium_port or self.pg_port

    @property
    def log_path(self) -> Path:
        return self.work_dir / "connect.log"

    @property
    def pid_path(self) -> Path:
        return self.work_dir / "connect.pid"

    @property
    def marker(self) -> str:
        return f"ConnectStandalone {self.work_dir / 'worker.properties'}"

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.rest_port}"

    @property
    def jars(self) -> Path:
        return jvm_dir() / "connect"

    def start(self, timeout: float | None = None) -> ConnectWorker:
        """Start the worker (or adopt the running one) and wait until the connector streams."""
        if not any(self.jars.glob("debezium-connector-postgres-*.jar")):
            raise SourceError(f"no Kafka Connect / Debezium jars in {self.jars}; run `make setup` first")
        return super().start(timeout)

    def prepare(self, log_start: int) -> None:
        worker = worker_config(self.bootstrap, self.rest_port, self.work_dir / "offsets.dat",
                               schemas_enable=self.schemas_enable, offset_flush_ms=self.offset_flush_ms)
        (self.work_dir / "worker.properties").write_text("".join(f"{k}={v}\n" for k, v in worker.items()))
        connector = connector_config(self.database_port, declaration=self.declaration)
        (self.work_dir / "connector.json").write_text(json.dumps(connector, indent=2))
        (self.work_dir / "log4j.properties").write_text(CONNECT_LOG4J)

    def command(self) -> list[str]:
        log4j = f"-Dlog4j.configuration=file:{self.work_dir / 'log4j.properties'}"
        return java_command("org.apache.kafka.connect.cli.ConnectStandalone", str(self.work_dir / "worker.properties"),
                            str(self.work_dir / "connector.json"), classpath=f"{self.jars}/*",
                            options=[*CONNECT_HEAP, *java_options(), log4j])

    def popen_options(self) -> dict[str, Any]:
        return {"cwd": self.work_dir}

    def status(self) -> dict[str, Any] | None:
        """The connector's status from Connect's REST API, None while the API does not answer."""
        try:
            with urllib.request.urlopen(f"{self.url}/connectors/{CONNECTOR}/status", timeout=5) as response:
                return json.load(response)
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def unready(self, pid: int, deadline: float) -> str | None:
        """RUNNING in Connect's REST API is not enough (the task may still be snapshotting or
        failing to connect): the replication slot must also be active, i.e. streaming."""
        status = self.status() if port_open(self.rest_port) else None
        tasks = (status or {}).get("tasks", [])
        failed = [t for t in tasks if t.get("state") == "FAILED"]
        if failed:
            raise StartFailed(f"connector task failed: {failed[0].get('trace', '')[:2000]}")
        running = (status or {}).get("connector", {}).get("state") == "RUNNING" and tasks and all(
            t.get("state") == "RUNNING" for t in tasks)
        return None if running and slot_active(self.pg_port) else f"connector not streaming (status {status})"


def slot_active(pg_port: int) -> bool:
    """Whether the connector's replication slot has a live consumer (Debezium is streaming)."""
    try:
        slot = slot_status(pg_port)
    except SourceError:
        return False
    return bool(slot and slot["active"])


def slot_status(pg_port: int) -> dict[str, Any] | None:
    """The replication slot: active (and the process id of the backend streaming it), and lag in bytes between
    the server's WAL and what the connector confirmed as delivered (it confirms at each offset flush)."""
    import psycopg

    try:
        with psycopg.connect(host=HOST, port=pg_port, user=PG_USER, dbname=DATABASE, connect_timeout=5) as conn:
            row = conn.execute(
                "SELECT active, pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint, "
                "confirmed_flush_lsn::text, active_pid FROM pg_replication_slots WHERE slot_name = %s",
                (SLOT,)).fetchone()
    except psycopg.Error as exc:
        raise SourceError(f"cannot query PostgreSQL on {HOST}:{pg_port}: {exc}") from exc
    if row is None:
        return None
    return {"slot": SLOT, "active": row[0], "lag_bytes": row[1], "confirmed_flush_lsn": row[2], "active_pid": row[3]}
