"""The real source's Kafka Connect worker: a standalone Connect running the Debezium PostgreSQL connector,
and the replication slot it streams from, as `lakehouse dev source` and the tests see them.

A module of its own beside dev/lakehouse_dev/pg_source.py, which starts PostgreSQL and this worker
together (`RealSource`): the worker is the part that speaks Kafka Connect's REST API and waits for
the slot to stream, and the slot's figures are what `source status` and the soak report.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lakehouse_dev.connect_config import (
    BASIC_AUTH_EXTENSION,
    CONNECT_LOG4J,
    CONNECTOR,
    DATABASE,
    PG_USER,
    SLOT,
    connector_config,
    file_provider,
    file_reference,
    kafka_client_config,
    properties_text,
    psycopg_options,
    rest_jaas,
    worker_config,
)
from lakehouse_dev.kafka_local import SCRAM_USER, KafkaBroker, java_options
from lakehouse_dev.tls import private_file, secret_file
from pipelines.errors import StartFailed
from pipelines.lake.declaration import Declaration
from pipelines.runtime.config import ConnectSettings, KafkaSettings, Secret, SourceSettings
from pipelines.runtime.kafka_clients import java_properties
from pipelines.runtime.local_process import HOST, LocalProcess, java_command, port_open
from pipelines.runtime.settings import jvm_dir

CONNECT_HEAP = ("-Xmx512m", "-Xms128m")
# The REST API's user when it asks for basic authentication (`rest_auth`).
REST_USER = "lakehouse"


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
    # How Debezium and the slot checks reach PostgreSQL (its password and CA); None: trust auth, no TLS.
    source: SourceSettings | None = None
    # How Connect's own Kafka clients reach the brokers; None: PLAINTEXT at `bootstrap`.
    kafka: KafkaSettings | None = None
    rest_auth: bool = False  # the REST API asks for basic authentication (REST_USER, `rest_password_file`)

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
    def secrets_path(self) -> Path:
        """The FileConfigProvider's properties file: every secret of the worker's and the connector's configs."""
        return self.work_dir / "secrets.properties"

    @property
    def rest_password_file(self) -> Path:
        return self.work_dir / "rest-password"

    def connect_settings(self) -> ConnectSettings:
        """The [connect] section that reaches this worker, its password as a file."""
        if not self.rest_auth:
            return ConnectSettings(url=self.url, connector=CONNECTOR)
        return ConnectSettings(url=self.url, connector=CONNECTOR, username=REST_USER,
                               password=Secret(file=self.rest_password_file))

    def connector(self, declaration: Declaration | None = None) -> dict[str, str]:
        """The Debezium connector's config for this worker's PostgreSQL (`source`'s TLS, its password by reference)."""
        if self.source is None or self.source.password is None:
            return connector_config(self.database_port, declaration=declaration or self.declaration)
        return connector_config(self.database_port, declaration=declaration or self.declaration,
                                password=file_reference(self.secrets_path, "database.password"),
                                sslrootcert=self.source.sslrootcert)

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
        worker |= self._secured()
        # Escaped as Java reads it back: a client certificate's chain (`ssl.keystore.certificate.chain`) is PEM
        # text of several lines, which unescaped would end the value at its first line.
        (self.work_dir / "worker.properties").write_text(properties_text(worker))
        (self.work_dir / "connector.json").write_text(json.dumps(self.connector(), indent=2))
        (self.work_dir / "log4j.properties").write_text(CONNECT_LOG4J)

    def _secured(self) -> dict[str, str]:
        """The worker's settings of `source`, `kafka` and `rest_auth`, with the files they name: the secrets in
        `secrets_path` (0600), read by Connect's FileConfigProvider; the REST API's users in a 0600 file its JAAS
        file names. No secret is in worker.properties, connector.json or the command line."""
        settings: dict[str, str] = {}
        secrets: dict[str, str] = {}
        if self.source is not None and self.source.password is not None:
            secrets["database.password"] = self.source.password.reveal()
        if self.kafka is not None:
            clients, kept = kafka_client_config(java_properties(self.kafka), self.secrets_path)
            settings |= clients
            secrets |= kept
        if secrets:
            settings |= file_provider(self.work_dir)
            private_file(self.secrets_path, properties_text(secrets))
        if self.rest_auth:
            users = private_file(self.work_dir / "rest-users.properties",
                                 properties_text({REST_USER: secret_file(self.rest_password_file)}))
            (self.work_dir / "rest-jaas.conf").write_text(rest_jaas(users))
            settings["rest.extension.classes"] = BASIC_AUTH_EXTENSION
        return settings

    def command(self) -> list[str]:
        log4j = f"-Dlog4j.configuration=file:{self.work_dir / 'log4j.properties'}"
        jaas = [f"-Djava.security.auth.login.config={self.work_dir / 'rest-jaas.conf'}"] if self.rest_auth else []
        return java_command("org.apache.kafka.connect.cli.ConnectStandalone", str(self.work_dir / "worker.properties"),
                            str(self.work_dir / "connector.json"), classpath=f"{self.jars}/*",
                            options=[*CONNECT_HEAP, *java_options(), log4j, *jaas])

    def popen_options(self) -> dict[str, Any]:
        return {"cwd": self.work_dir}

    def headers(self) -> dict[str, str]:
        """What every request to the REST API carries: the basic authentication of `rest_auth`."""
        settings = self.connect_settings()
        if settings.username is None or settings.password is None:
            return {}
        pair = f"{settings.username}:{settings.password.reveal()}".encode()
        return {"Authorization": f"Basic {base64.b64encode(pair).decode()}"}

    def status(self) -> dict[str, Any] | None:
        """The connector's status from Connect's REST API, None while the API does not answer."""
        request = urllib.request.Request(f"{self.url}/connectors/{CONNECTOR}/status", headers=self.headers())
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
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
        streaming = running and slot_active(self.pg_port, self.source)
        return None if streaming else f"connector not streaming (status {status})"


def secure_kafka(broker: KafkaBroker) -> KafkaSettings:
    """The [kafka] section of `broker`'s SECURE listener: SASL_SSL, SCRAM-SHA-512 as SCRAM_USER, its own CA."""
    return KafkaSettings(bootstrap_servers=broker.secure_bootstrap, security_protocol="SASL_SSL",
                         sasl_mechanism="SCRAM-SHA-512", sasl_username=SCRAM_USER,
                         sasl_password=Secret(file=broker.scram_password_file), ssl_ca_file=broker.tls.ca_file)


def slot_active(pg_port: int, source: SourceSettings | None = None) -> bool:
    """Whether the connector's replication slot has a live consumer (Debezium is streaming)."""
    try:
        slot = slot_status(pg_port, source)
    except SourceError:
        return False
    return bool(slot and slot["active"])


def slot_status(pg_port: int, source: SourceSettings | None = None) -> dict[str, Any] | None:
    """The replication slot: active (and the process id of the backend streaming it), and lag in bytes between
    the server's WAL and what the connector confirmed as delivered (it confirms at each offset flush).

    `source`: how to reach PostgreSQL (a secure source's password and CA); None: trust auth at `pg_port`.
    """
    import psycopg

    options = psycopg_options(source or SourceSettings(host=HOST, port=pg_port, user=PG_USER, database=DATABASE))
    try:
        with psycopg.connect(**options, connect_timeout=5) as conn:  # type: ignore[arg-type]
            row = conn.execute(
                "SELECT active, pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint, "
                "confirmed_flush_lsn::text, active_pid FROM pg_replication_slots WHERE slot_name = %s",
                (SLOT,)).fetchone()
    except psycopg.Error as exc:
        raise SourceError(f"cannot query PostgreSQL on {HOST}:{pg_port}: {exc}") from exc
    if row is None:
        return None
    return {"slot": SLOT, "active": row[0], "lag_bytes": row[1], "confirmed_flush_lsn": row[2], "active_pid": row[3]}
