"""The real source: a throwaway PostgreSQL 15 cluster with the contract's `shop` database, captured by
the Debezium PostgreSQL connector in Kafka Connect, publishing to the local Kafka.

The generator plays database and connector at once, so parser and generator share one reading of
the contract; this module runs the real thing instead, without Docker: PostgreSQL from Debian's
package (`postgresql-15`, installed by `make setup` when missing) and Kafka Connect plus Debezium from
the jars `make setup` resolves (jvm/pom.xml, profile `connect`). Everything a run keeps (the cluster,
Connect's configs, offsets and log, the ports) lives in one folder, so `source status` and `source
down` find a running source again, and the offsets file stays beside the replication slot it
belongs to (a stale offsets file against a new slot resumes from an LSN that no longer exists).
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.contract import SCHEMA, TABLES, TOPIC_PREFIX
from pipelines.devtools.kafka_local import HOST, JAVA_OPTS_VARIABLE, _command_line, _java, _port_open
from pipelines.settings import PROJECT_ROOT, jvm_dir, kafka_bootstrap, unavailable_placeholder

DATABASE = "shop"
PG_USER = "postgres"
# Debian's PostgreSQL 15 binaries, not on PATH (LAKEHOUSE_PG_BIN points elsewhere).
PG_BIN_DEFAULT = "/usr/lib/postgresql/15/bin"
CONNECTOR = "shop-source"
SLOT = "shop_debezium"
PUBLICATION = "shop_publication"
# The contract's section 1, one file for `source up` and for docker/compose.yaml's postgres.
SHOP_DDL_FILE = PROJECT_ROOT / "docker" / "shop.sql"
# Connect's own log: its INFO lines are how a stuck connector explains itself; the per-record
# chatter is turned down.
CONNECT_LOG4J = """\
log4j.rootLogger=INFO, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.org.apache.kafka.clients=WARN
log4j.logger.org.apache.kafka.common=WARN
log4j.logger.org.reflections=ERROR
log4j.logger.org.eclipse.jetty=WARN
"""
CONNECT_HEAP = ("-Xmx512m", "-Xms128m")


class SourceError(RuntimeError):
    """The real source could not be started, reached or stopped; the message says which part and why."""


def pg_bin() -> Path:
    return Path(os.environ.get("LAKEHOUSE_PG_BIN") or PG_BIN_DEFAULT)


def postgres_available() -> bool:
    """Whether this machine has the real source's database (`make demo` asks the same of the Makefile's PG_BIN)."""
    return (pg_bin() / "initdb").is_file() and (pg_bin() / "pg_ctl").is_file()


def connector_config(pg_port: int, *, partitions: int = 3) -> dict[str, str]:
    """The Debezium connector as the contract describes it (section 1), plus what 2.7 needs said.

    - `plugin.name=pgoutput`: 2.7's default is decoderbufs, a server extension Debian does not ship.
    - `publication.autocreate.mode=filtered`: a publication of the two tables only (the default,
      all tables, makes UPDATE and DELETE fail on any table without a replica identity).
    - `skipped.operations=none`: Debezium skips truncates by default, the contract has them.
    - `topic.creation.*`: Connect creates the topics, keyed records spread over partitions.
    """
    return {
        "name": CONNECTOR,
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "tasks.max": "1",
        "database.hostname": HOST,
        "database.port": str(pg_port),
        "database.user": PG_USER,
        "database.password": "",
        "database.dbname": DATABASE,
        "topic.prefix": TOPIC_PREFIX,
        "plugin.name": "pgoutput",
        "slot.name": SLOT,
        "publication.name": PUBLICATION,
        "publication.autocreate.mode": "filtered",
        "table.include.list": ",".join(f"{SCHEMA}.{t}" for t in TABLES),
        "decimal.handling.mode": "string",
        "unavailable.value.placeholder": unavailable_placeholder(),
        "skipped.operations": "none",
        "tombstones.on.delete": "true",
        "snapshot.mode": "initial",
        "topic.creation.default.partitions": str(partitions),
        "topic.creation.default.replication.factor": "1",
    }


def worker_config(bootstrap: str, rest_port: int, offsets: Path, *, schemas_enable: bool,
                  offset_flush_ms: int) -> dict[str, str]:
    """A standalone Connect worker: JSON keys without schema (`{"id": 42}`, the contract's key) and
    JSON values with or without the schema (the two converter settings of the contract)."""
    return {
        "bootstrap.servers": bootstrap,
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "key.converter.schemas.enable": "false",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter.schemas.enable": str(schemas_enable).lower(),
        "offset.storage.file.filename": str(offsets),
        # How much a SIGKILL replays: everything delivered since the last flush.
        "offset.flush.interval.ms": str(offset_flush_ms),
        "listeners": f"http://{HOST}:{rest_port}",
        "rest.advertised.host.name": HOST,
        "plugin.discovery": "only_scan",
    }


def _as_postgres_user() -> dict[str, Any]:
    """`initdb` and `pg_ctl` refuse to run as root: as root, run them as the `postgres` user."""
    if os.geteuid() != 0:
        return {}
    try:
        pwd.getpwnam(PG_USER)
    except KeyError as exc:
        raise SourceError(f"running as root but there is no `{PG_USER}` user to run PostgreSQL as; "
                          "install Debian's postgresql-15 (make setup does)") from exc
    return {"user": PG_USER, "group": PG_USER}


def _run(command: list[str], what: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, check=False, capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        raise SourceError(f"{what} failed (exit {result.returncode}): {(result.stderr or result.stdout).strip()}")
    return result


@dataclass
class PostgresCluster:
    """A PostgreSQL cluster of its own in `data_dir`, on 127.0.0.1:`port` only (no Unix socket), trust auth."""

    data_dir: Path
    port: int = 5433

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir).resolve()

    @property
    def dsn(self) -> str:
        return f"postgresql://{PG_USER}@{HOST}:{self.port}/{DATABASE}"

    @property
    def log_path(self) -> Path:
        return self.data_dir.parent / "postgres.log"

    def start(self) -> PostgresCluster:
        """initdb on first use, start with `wal_level=logical`, create `shop` and its tables if missing."""
        if not postgres_available():
            raise SourceError(f"no PostgreSQL 15 binaries in {pg_bin()} (LAKEHOUSE_PG_BIN); "
                              "`make setup` installs Debian's postgresql-15")
        as_pg = _as_postgres_user()
        if not (self.data_dir / "PG_VERSION").exists():
            self._init(as_pg)
        if not self.is_running():
            # TCP on 127.0.0.1 only (no socket folder to own); a throwaway cluster trades durability
            # for speed (fsync, synchronous commit off): a crashed machine means a new source.
            options = (f"-c wal_level=logical -c listen_addresses={HOST} -p {self.port} "
                       "-c unix_socket_directories='' -c fsync=off -c synchronous_commit=off")
            self.log_path.touch()
            if as_pg:
                shutil.chown(self.log_path, PG_USER, PG_USER)
            _run([str(pg_bin() / "pg_ctl"), "start", "-w", "-t", "60", "-D", str(self.data_dir),
                  "-l", str(self.log_path), "-o", options], f"starting PostgreSQL on {HOST}:{self.port}", **as_pg)
        self._create_database()
        return self

    def stop(self) -> None:
        if self.is_running():
            _run([str(pg_bin() / "pg_ctl"), "stop", "-w", "-m", "fast", "-D", str(self.data_dir)],
                 "stopping PostgreSQL", **_as_postgres_user())

    def is_running(self) -> bool:
        if not (self.data_dir / "postmaster.pid").exists():
            return False
        status = subprocess.run([str(pg_bin() / "pg_ctl"), "status", "-D", str(self.data_dir)],
                                check=False, capture_output=True, **_as_postgres_user())
        return status.returncode == 0

    def connect(self, dbname: str = DATABASE) -> Any:
        import psycopg

        return psycopg.connect(host=HOST, port=self.port, user=PG_USER, dbname=dbname, autocommit=True)

    def _init(self, as_pg: dict[str, Any]) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.data_dir, 0o700)
        if as_pg:
            shutil.chown(self.data_dir, PG_USER, PG_USER)
            os.chmod(self.data_dir.parent, 0o755)  # our own folder, beside the server's log
            blocked = [p for p in self.data_dir.parents if not os.stat(p).st_mode & 0o001]
            if blocked:
                raise SourceError(f"the `{PG_USER}` user cannot reach {self.data_dir}: {blocked[0]} is not "
                                  "traversable by others; put the source's folder elsewhere")
        _run([str(pg_bin() / "initdb"), "-D", str(self.data_dir), "--auth=trust", f"--username={PG_USER}",
              "--encoding=UTF8", "--no-locale"], f"initdb of {self.data_dir}", **as_pg)

    def _create_database(self) -> None:
        with self.connect("postgres") as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone():
                conn.execute(f"CREATE DATABASE {DATABASE}")
        with self.connect() as conn:
            conn.execute(SHOP_DDL_FILE.read_text())


@dataclass
class ConnectWorker:
    """A standalone Kafka Connect worker running the Debezium connector, its state in `work_dir`.

    Detached (own session), so it outlives `source up`; found again through its pid file.
    """

    work_dir: Path
    bootstrap: str
    pg_port: int
    rest_port: int = 8083
    schemas_enable: bool = True
    offset_flush_ms: int = 1000
    _process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.work_dir = Path(self.work_dir).resolve()

    @property
    def log_path(self) -> Path:
        return self.work_dir / "connect.log"

    @property
    def pid_path(self) -> Path:
        return self.work_dir / "connect.pid"

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.rest_port}"

    def start(self, timeout: float = 180.0) -> ConnectWorker:
        """Start the worker (or adopt the running one) and wait until the connector streams."""
        jars = jvm_dir() / "connect"
        if not any(jars.glob("debezium-connector-postgres-*.jar")):
            raise SourceError(f"no Kafka Connect / Debezium jars in {jars}; run `make setup` first")
        if self.pid() is None:
            self.work_dir.mkdir(parents=True, exist_ok=True)
            worker = worker_config(self.bootstrap, self.rest_port, self.work_dir / "offsets.dat",
                                   schemas_enable=self.schemas_enable, offset_flush_ms=self.offset_flush_ms)
            (self.work_dir / "worker.properties").write_text("".join(f"{k}={v}\n" for k, v in worker.items()))
            (self.work_dir / "connector.json").write_text(json.dumps(connector_config(self.pg_port), indent=2))
            (self.work_dir / "log4j.properties").write_text(CONNECT_LOG4J)
            command = [_java(), *CONNECT_HEAP, *os.environ.get(JAVA_OPTS_VARIABLE, "").split(),
                       f"-Dlog4j.configuration=file:{self.work_dir / 'log4j.properties'}",
                       "-cp", f"{jars}/*", "org.apache.kafka.connect.cli.ConnectStandalone",
                       str(self.work_dir / "worker.properties"), str(self.work_dir / "connector.json")]
            with self.log_path.open("ab") as log:
                self._process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log,
                                                 stderr=subprocess.STDOUT, cwd=self.work_dir,
                                                 start_new_session=True)
            self.pid_path.write_text(f"{self._process.pid}\n")
        self._wait_running(time.monotonic() + timeout)
        return self

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM: Connect commits the offsets of what it delivered, so a restart replays nothing."""
        self._signal_and_wait(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """SIGKILL of the worker: what it delivered since its last offset flush is delivered again."""
        self._signal_and_wait(signal.SIGKILL, 30.0)

    def pid(self) -> int | None:
        try:
            pid = int(self.pid_path.read_text())
        except (FileNotFoundError, ValueError):
            return None
        if self._process is not None and self._process.pid == pid:
            return pid if self._process.poll() is None else None
        return pid if "ConnectStandalone" in _command_line(pid) else None

    def status(self) -> dict[str, Any] | None:
        """The connector's status from Connect's REST API, None while the API does not answer."""
        try:
            with urllib.request.urlopen(f"{self.url}/connectors/{CONNECTOR}/status", timeout=5) as response:
                return json.load(response)
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def _signal_and_wait(self, signum: int, timeout: float) -> None:
        pid = self.pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signum)
            deadline = time.monotonic() + timeout
            while self.pid() == pid:
                if time.monotonic() >= deadline:
                    if signum == signal.SIGKILL:
                        raise SourceError(f"Kafka Connect pid {pid} survived SIGKILL")
                    self._signal_and_wait(signal.SIGKILL, 30.0)
                    return
                time.sleep(0.1)
        self.pid_path.unlink(missing_ok=True)
        self._process = None

    def _wait_running(self, deadline: float) -> None:
        """RUNNING in Connect's REST API is not enough (the task may still be snapshotting or
        failing to connect): the replication slot must also be active, i.e. streaming."""
        while True:
            pid = self.pid()
            if pid is None:
                raise SourceError(self._failure("Kafka Connect exited during startup"))
            status = self.status() if _port_open(self.rest_port) else None
            tasks = (status or {}).get("tasks", [])
            failed = [t for t in tasks if t.get("state") == "FAILED"]
            if failed:
                raise SourceError(self._failure(f"connector task failed: {failed[0].get('trace', '')[:2000]}"))
            running = (status or {}).get("connector", {}).get("state") == "RUNNING" and tasks and all(
                t.get("state") == "RUNNING" for t in tasks)
            if running and slot_active(self.pg_port):
                return
            if time.monotonic() >= deadline:
                raise SourceError(self._failure(f"connector not streaming in time (status {status})"))
            time.sleep(0.5)

    def _failure(self, message: str) -> str:
        tail = self.log_path.read_text(errors="replace").splitlines()[-30:] if self.log_path.exists() else []
        errors = [line for line in tail if " ERROR " in line]
        return "\n".join([message, *errors[:5], f"--- last lines of {self.log_path} ---", *tail])


def slot_active(pg_port: int) -> bool:
    """Whether the connector's replication slot has a live consumer (Debezium is streaming)."""
    try:
        slot = slot_status(pg_port)
    except SourceError:
        return False
    return bool(slot and slot["active"])


def slot_status(pg_port: int) -> dict[str, Any] | None:
    """The replication slot: active, and lag in bytes between the server's WAL and what the
    connector confirmed as delivered (it confirms at each offset flush)."""
    import psycopg

    try:
        with psycopg.connect(host=HOST, port=pg_port, user=PG_USER, dbname=DATABASE, connect_timeout=5) as conn:
            row = conn.execute(
                "SELECT active, pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint, "
                "confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (SLOT,)).fetchone()
    except psycopg.Error as exc:
        raise SourceError(f"cannot query PostgreSQL on {HOST}:{pg_port}: {exc}") from exc
    if row is None:
        return None
    return {"slot": SLOT, "active": row[0], "lag_bytes": row[1], "confirmed_flush_lsn": row[2]}


@dataclass
class RealSource:
    """PostgreSQL plus Connect, their state and ports in `home` (`source.json` remembers the ports)."""

    home: Path
    pg_port: int = 5433
    rest_port: int = 8083
    bootstrap: str = field(default_factory=kafka_bootstrap)
    schemas_enable: bool = True
    offset_flush_ms: int = 1000

    def __post_init__(self) -> None:
        self.home = Path(self.home).resolve()
        saved = self.home / "source.json"
        if saved.exists():
            # A source that ran from this folder keeps its ports and settings: its offsets, slot and
            # topics belong together.
            doc = json.loads(saved.read_text())
            self.pg_port, self.rest_port, self.bootstrap = doc["pg_port"], doc["rest_port"], doc["bootstrap"]
            self.schemas_enable = doc["schemas_enable"]

    @property
    def postgres(self) -> PostgresCluster:
        return PostgresCluster(self.home / "postgres" / "data", self.pg_port)

    @property
    def connect(self) -> ConnectWorker:
        return ConnectWorker(self.home / "connect", self.bootstrap, self.pg_port, self.rest_port,
                             self.schemas_enable, self.offset_flush_ms)

    def up(self) -> tuple[PostgresCluster, ConnectWorker]:
        _require_kafka(self.bootstrap)
        self.home.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            os.chmod(self.home, 0o755)  # the `postgres` user runs the cluster below it
        (self.home / "source.json").write_text(json.dumps(
            {"pg_port": self.pg_port, "rest_port": self.rest_port, "bootstrap": self.bootstrap,
             "schemas_enable": self.schemas_enable}))
        postgres = self.postgres.start()
        worker = self.connect
        try:
            worker.start()
        except BaseException:
            worker.stop()
            raise
        return postgres, worker

    def down(self) -> None:
        self.connect.stop()
        self.postgres.stop()


DEFAULT_HOME = PROJECT_ROOT / ".pg-source"


def default_dsn() -> str | None:
    """The DSN of the source `make source-up` runs, None if there is none."""
    return RealSource(DEFAULT_HOME).postgres.dsn if (DEFAULT_HOME / "source.json").exists() else None


def _require_kafka(bootstrap: str) -> None:
    """Connect only logs (and retries) when Kafka is away: say so at once instead."""
    port = bootstrap.split(",")[0].strip().rpartition(":")[2]
    if not (port.isdigit() and _port_open(int(port))):
        raise SourceError(f"cannot reach Kafka at {bootstrap} on {HOST} (KAFKA_BOOTSTRAP_SERVERS); "
                          "`make kafka-up` starts the local broker")
