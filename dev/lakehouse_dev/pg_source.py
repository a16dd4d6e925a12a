"""The real source: a throwaway PostgreSQL 15 cluster with the contract's `shop` database, captured by
the Debezium PostgreSQL connector in Kafka Connect, publishing to the local Kafka.

The generator plays database and connector at once, so parser and generator share one reading of
the contract; this module runs the real thing instead, without Docker: PostgreSQL from Debian's
package (`postgresql-15`, installed by `make setup` when missing) and Kafka Connect plus Debezium from
the jars `make setup` resolves (jvm/pom.xml, profile `connect`). Everything a run keeps (the cluster,
Connect's configs, offsets and log, the ports) lives in one folder, so `source status` and `source
stop` find a running source again, and the offsets file stays beside the replication slot it
belongs to (a stale offsets file against a new slot resumes from an LSN that no longer exists).

The captured tables are the declaration's (contract section 7, `LAKEHOUSE_TABLES`): `source start` checks it
against the database before Connect starts and creates the connector with the declared tables;
`sync` makes a running source follow a changed declaration (the product's pipelines/source/sync.py).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lakehouse_dev.connect_config import CONNECTOR, DATABASE, PG_USER, SIGNAL_DDL, connector_config, psycopg_options  # noqa: F401
from lakehouse_dev.connect_worker import ConnectWorker, SourceError
from lakehouse_dev.source_target import check_and_prepare, dev_target, published
from lakehouse_dev.tls import LocalTls, private_file, scram_sha_256, secret_file
from pipelines.lake.declaration import Declaration
from pipelines.runtime.config import KafkaSettings, Secret, SourceSettings
from pipelines.runtime.declared import read_declaration
from pipelines.runtime.kafka_clients import require_kafka
from pipelines.runtime.local_process import HOST, LocalProcess
from pipelines.runtime.settings import PROJECT_ROOT, kafka_bootstrap
from pipelines.source.check import Target
from pipelines.source.sync import SyncOptions, SyncReport
from pipelines.source.sync import sync as sync_source

# Debian's PostgreSQL 15 binaries, not on PATH (LAKEHOUSE_PG_BIN points elsewhere).
PG_BIN_DEFAULT = "/usr/lib/postgresql/15/bin"
# The contract's section 1, one file for `source start` and for docker/compose.yaml's postgres.
SHOP_DDL_FILE = PROJECT_ROOT / "docker" / "shop.sql"


def pg_bin() -> Path:
    return Path(os.environ.get("LAKEHOUSE_PG_BIN") or PG_BIN_DEFAULT)


def postgres_available() -> bool:
    """Whether this machine has the real source's database (`lakehouse dev demo` chooses its source by it)."""
    return (pg_bin() / "initdb").is_file() and (pg_bin() / "postgres").is_file()


def _as_postgres_user() -> dict[str, Any]:
    """`initdb` and `postgres` refuse to run as root: as root, run them as the `postgres` user."""
    if os.geteuid() != 0:
        return {}
    try:
        pwd.getpwnam(PG_USER)
    except KeyError as exc:
        raise SourceError(f"running as root but there is no `{PG_USER}` user to run PostgreSQL as; "
                          "install Debian's postgresql-15 (make setup does)") from exc
    return {"user": PG_USER, "group": PG_USER}


# A secure cluster's pg_hba.conf: TLS and scram-sha-256 only, for the captured database and Debezium's
# replication connection alike; a connection without TLS or without the password matches no line.
SECURE_HBA = """\
hostssl all all 127.0.0.1/32 scram-sha-256
hostssl replication all 127.0.0.1/32 scram-sha-256
"""


@dataclass
class PostgresCluster(LocalProcess):
    """A PostgreSQL cluster of its own in `data_dir`, on 127.0.0.1:`port` only (no Unix socket), trust auth.

    `secure`: TLS (a certificate for 127.0.0.1 and localhost signed by the state folder's own CA,
    lakehouse_dev.tls) and scram-sha-256 with a generated password for the `postgres` role, in a 0600
    file of the state folder (`password_file`); no line of its pg_hba.conf admits a connection without
    both. The password reaches the server only as its SCRAM verifier, through initdb's --pwfile.

    The postmaster runs detached, found again through the postmaster.pid it writes itself.
    """

    label = "PostgreSQL"
    writes_pid_file = False
    # The fast shutdown `pg_ctl stop -m fast` asks for, to the postmaster alone: it ends its backends itself.
    stop_signal = signal.SIGINT
    stop_group = False
    error = SourceError
    stop_timeout = 60.0

    data_dir: Path
    port: int = 5433
    secure: bool = False

    def __post_init__(self) -> None:
        self.data_dir = Path(self.data_dir).resolve()

    @property
    def dsn(self) -> str:
        """libpq's URI of `shop`; a secure cluster's names its CA and a passfile, never the password."""
        plain = f"postgresql://{PG_USER}@{HOST}:{self.port}/{DATABASE}"
        if not self.secure:
            return plain
        return f"{plain}?sslmode=verify-full&sslrootcert={self.tls.ca_file}&passfile={self.passfile}"

    @property
    def tls(self) -> LocalTls:
        """The secure cluster's CA and server certificate, beside the data folder."""
        return LocalTls(self.data_dir.parent / "tls")

    @property
    def password_file(self) -> Path:
        """The `postgres` role's password (a secure cluster's), readable by its owner alone."""
        return self.data_dir.parent / "password"

    @property
    def passfile(self) -> Path:
        """The same password as libpq's passfile (`host:port:database:user:password`), for `dsn`."""
        return self.data_dir.parent / "pgpass"

    @property
    def hba_file(self) -> Path:
        return self.data_dir.parent / "pg_hba.conf"

    def source_settings(self) -> SourceSettings:
        """The [source] section that reaches this cluster: a secure one's password as a file, its CA, verify-full."""
        if not self.secure:
            return SourceSettings(host=HOST, port=self.port, database=DATABASE, user=PG_USER)
        return SourceSettings(host=HOST, port=self.port, database=DATABASE, user=PG_USER,
                              password=Secret(file=self.password_file), sslmode="verify-full",
                              sslrootcert=self.tls.ca_file)

    @property
    def log_path(self) -> Path:
        return self.data_dir.parent / "postgres.log"

    @property
    def pid_path(self) -> Path:
        return self.data_dir / "postmaster.pid"

    @property
    def marker(self) -> str:
        return f"-D {self.data_dir} "

    def command(self) -> list[str]:
        # TCP on 127.0.0.1 only (no socket folder to own); a throwaway cluster trades durability
        # for speed (fsync, synchronous commit off): a crashed machine means a new source.
        plain = [str(pg_bin() / "postgres"), "-D", str(self.data_dir), "-c", "wal_level=logical",
                 "-c", f"listen_addresses={HOST}", "-p", str(self.port), "-c", "unix_socket_directories=",
                 "-c", "fsync=off", "-c", "synchronous_commit=off"]
        if not self.secure:
            return plain
        return [*plain, "-c", "ssl=on", "-c", f"ssl_cert_file={self.tls.server_cert}",
                "-c", f"ssl_key_file={self.tls.server_key}", "-c", "password_encryption=scram-sha-256",
                "-c", f"hba_file={self.hba_file}"]

    def popen_options(self) -> dict[str, Any]:
        return {"cwd": self.data_dir, **_as_postgres_user()}

    def start(self, timeout: float | None = None) -> PostgresCluster:
        """initdb on first use, start with `wal_level=logical`, create `shop` and its tables if missing."""
        if not postgres_available():
            raise SourceError(f"no PostgreSQL 15 binaries in {pg_bin()} (LAKEHOUSE_PG_BIN); "
                              "`make setup` installs Debian's postgresql-15")
        if not (self.data_dir / "PG_VERSION").exists():
            self._init(_as_postgres_user())
        if self.secure and self.pid() is None:
            self._secure_files(_as_postgres_user())
        super().start(timeout)
        self._create_database()
        return self

    def unready(self, pid: int, deadline: float) -> str | None:
        """`pg_ctl start -w`'s test: the postmaster says "ready" in its postmaster.pid (8th line)."""
        try:
            lines = self.pid_path.read_text().splitlines()
        except OSError:
            lines = []
        if len(lines) >= 8 and lines[0].strip() == str(pid) and lines[7].strip() == "ready":
            return None
        return f"not accepting connections on {HOST}:{self.port} yet"

    def _forget(self) -> None:
        # postmaster.pid is PostgreSQL's own: a clean shutdown removes it, and a crash (`kill`) leaves it
        # for the next start to find and see through, as after a real crash.
        self._process = None

    def wait_wal_written(self, timeout: float = 30.0) -> None:
        """Wait until every commit so far is in the WAL files, which a crash of the server keeps.

        This throwaway cluster commits asynchronously (`command`): a commit returns before its WAL
        is written, and a SIGKILL in the next 600 ms loses it. Production's `synchronous_commit=on`
        makes every commit that returned durable; this makes it so before a crash a test stages.
        """
        with self.connect() as conn:
            target = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
            deadline = time.monotonic() + timeout
            while not conn.execute("SELECT pg_current_wal_flush_lsn() >= %s::pg_lsn", (target,)).fetchone()[0]:
                if time.monotonic() > deadline:
                    raise SourceError(f"PostgreSQL on {HOST}:{self.port} wrote no WAL up to {target} "
                                      f"in {timeout:.0f} s")
                time.sleep(0.05)

    def connect(self, dbname: str = DATABASE) -> Any:
        """A connection in autocommit mode; a secure cluster's with its password, verifying its certificate."""
        import psycopg

        return psycopg.connect(**psycopg_options(self.source_settings(), dbname), autocommit=True)  # type: ignore[arg-type]

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
        auth = ["--auth=trust"]
        pwfile = self.data_dir.parent / "initdb-verifier"
        if self.secure:
            # initdb reads the file as the `postgres` user; it holds the SCRAM verifier, not the password.
            private_file(pwfile, scram_sha_256(secret_file(self.password_file)) + "\n")
            if as_pg:
                shutil.chown(pwfile, PG_USER, PG_USER)
            auth = ["--auth=scram-sha-256", f"--pwfile={pwfile}"]
        try:
            initdb = subprocess.run([str(pg_bin() / "initdb"), "-D", str(self.data_dir), *auth,
                                     f"--username={PG_USER}", "--encoding=UTF8", "--no-locale"],
                                    check=False, capture_output=True, text=True, **as_pg)
        finally:
            pwfile.unlink(missing_ok=True)
        if initdb.returncode != 0:
            raise SourceError(f"initdb of {self.data_dir} failed (exit {initdb.returncode}): "
                              f"{(initdb.stderr or initdb.stdout).strip()}")

    def _secure_files(self, as_pg: dict[str, Any]) -> None:
        """The certificate, its key (0600, the server's user's, as PostgreSQL demands), pg_hba.conf, the passfile."""
        if not self.password_file.exists():
            raise SourceError(f"{self.data_dir} was made without a password (not secure); "
                              "a secure source needs a folder of its own")
        tls = self.tls.ensure()
        if as_pg:
            shutil.chown(tls.server_key, PG_USER, PG_USER)
        self.hba_file.write_text(SECURE_HBA)
        self.hba_file.chmod(0o644)
        password = secret_file(self.password_file)
        private_file(self.passfile, f"{HOST}:*:*:{PG_USER}:{password}\n")  # any port: a proxy in front too

    def _create_database(self) -> None:
        with self.connect("postgres") as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)).fetchone():
                conn.execute(f"CREATE DATABASE {DATABASE}")
        with self.connect() as conn:
            conn.execute(SHOP_DDL_FILE.read_text())
            conn.execute(SIGNAL_DDL)


@dataclass
class RealSource:
    """PostgreSQL plus Connect, their state and ports in `home` (`source.json` remembers the ports)."""

    home: Path
    pg_port: int = 5433
    rest_port: int = 8083
    bootstrap: str = field(default_factory=kafka_bootstrap)
    schemas_enable: bool = True
    offset_flush_ms: int = 1000
    # Where Debezium reaches PostgreSQL when not at pg_port: a proxy in front of it (the fault tests' Toxiproxy).
    debezium_port: int | None = None
    # PostgreSQL with TLS and a password (PostgresCluster.secure), Connect's REST API with basic authentication.
    secure: bool = False
    # How Connect's Kafka clients reach the brokers (connect_worker.secure_kafka: a broker's SASL_SSL listener);
    # None: PLAINTEXT at `bootstrap`.
    kafka: KafkaSettings | None = None

    def __post_init__(self) -> None:
        self.home = Path(self.home).resolve()
        saved = self.home / "source.json"
        if saved.exists():
            # A source that ran from this folder keeps its ports and settings: its offsets, slot and
            # topics belong together.
            doc = json.loads(saved.read_text())
            self.pg_port, self.rest_port, self.bootstrap = doc["pg_port"], doc["rest_port"], doc["bootstrap"]
            self.schemas_enable, self.debezium_port = doc["schemas_enable"], doc.get("debezium_port")
            self.secure = doc.get("secure", False)
            self.kafka = KafkaSettings.model_validate(doc["kafka"]) if doc.get("kafka") else None
        if self.kafka is not None:
            self.bootstrap = self.kafka.bootstrap_servers

    @property
    def postgres(self) -> PostgresCluster:
        return PostgresCluster(self.home / "postgres" / "data", self.pg_port, secure=self.secure)

    @property
    def connect(self) -> ConnectWorker:
        return ConnectWorker(self.home / "connect", self.bootstrap, self.pg_port, self.rest_port,
                             self.schemas_enable, self.offset_flush_ms, debezium_port=self.debezium_port,
                             source=self.postgres.source_settings() if self.secure else None, kafka=self.kafka,
                             rest_auth=self.secure)

    def up(self, declaration: Declaration | None = None, timeout: float | None = None
           ) -> tuple[PostgresCluster, ConnectWorker]:
        """Start (or adopt) PostgreSQL and Connect, capturing the declared tables (`declaration`, else
        the one in force): checked against the database first (pipelines.errors.DeclarationMismatch),
        the connector created with them; an adopted connector, or tables declared since the last
        run, are brought in line as `sync` does (new tables' rows by an incremental snapshot).
        `timeout`: how long Connect may take to stream (its initial snapshot comes first; default: the
        worker's start timeout)."""
        declaration = declaration or read_declaration()
        # Connect would only log (and retry) while Kafka is away.
        require_kafka(self.kafka or KafkaSettings(bootstrap_servers=self.bootstrap), SourceError)
        self.home.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            os.chmod(self.home, 0o755)  # the `postgres` user runs the cluster below it
        kafka = None if self.kafka is None else self.kafka.model_dump(mode="json", exclude_none=True)
        (self.home / "source.json").write_text(json.dumps(
            {"pg_port": self.pg_port, "rest_port": self.rest_port, "bootstrap": self.bootstrap,
             "schemas_enable": self.schemas_enable, "debezium_port": self.debezium_port,
             "secure": self.secure, "kafka": kafka}))
        postgres = self.postgres.start()
        with postgres.connect() as conn:
            check_and_prepare(conn, self.target(), declaration)
            before = published(conn)  # Debezium sets it to its own tables when its task starts
        worker = self.connect
        worker.declaration = declaration
        try:
            worker.start(timeout)
        except BaseException:
            worker.stop()
            raise
        self._apply(declaration, before)
        return postgres, worker

    def sync(self, declaration: Declaration | None = None, timeout: float = 120.0) -> SyncReport:
        """Make the running source capture exactly the declared tables (the product's `lakehouse source sync`,
        pipelines/source/sync.py, on this source's database and Connect)."""
        declaration = declaration or read_declaration()
        postgres, worker = self.postgres, self.connect
        if not postgres.is_running():
            raise SourceError(f"PostgreSQL is not running (data {postgres.data_dir}); "
                              "`lakehouse dev source start` first")
        if worker.status() is None:
            raise SourceError(f"Kafka Connect does not answer at {worker.url} (log {worker.log_path}); "
                              "`lakehouse dev source start` first")
        with postgres.connect() as conn:
            before = published(conn)
        return self._apply(declaration, before, timeout)

    def target(self) -> Target:
        """The product's view of this source: its [source] (a secure cluster's password file, CA and verify-full)
        and its worker's [connect] (a secure worker's basic authentication)."""
        names = dev_target(self.pg_port, self.connect.url, self.schemas_enable)
        reach = self.postgres.source_settings()
        source = names.source.model_copy(update={k: getattr(reach, k) for k in ("password", "sslmode", "sslrootcert")})
        return Target(source, self.connect.connect_settings(), self.schemas_enable)

    def _apply(self, declaration: Declaration, before: set[str] | None,
               timeout: float = 120.0) -> SyncReport:
        """The product's sync with this source's whole connector config; `before`: the publication's tables
        before anything changed (None: there was none, the connector's initial snapshot reads every table).
        Connect standalone keeps the new config in memory only: connector.json, which its next launch reads,
        is rewritten with it."""
        worker = self.connect
        target = self.target()
        options = SyncOptions(timeout, overrides=worker.connector(declaration),
                              captured_before=None if before is None else frozenset(before),
                              initial_snapshot=before is None)
        report = sync_source(target, declaration, options)
        config = target.client().config(CONNECTOR)
        (worker.work_dir / "connector.json").write_text(json.dumps(config, indent=2))
        return report

    def down(self) -> None:
        self.connect.stop()
        self.postgres.stop()


DEFAULT_HOME = PROJECT_ROOT / ".pg-source"


def default_dsn() -> str | None:
    """The DSN of the source `make source-up` runs, None if there is none."""
    return RealSource(DEFAULT_HOME).postgres.dsn if (DEFAULT_HOME / "source.json").exists() else None

