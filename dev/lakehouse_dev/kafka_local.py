"""A real single-node Apache Kafka broker (KRaft, no ZooKeeper) on 127.0.0.1, for development and tests.

The broker runs as a plain `java` process from the jars `make setup` resolves (jvm/pom.xml, profile
`kafka`), so tests and `make kafka-up` talk to the real Apache Kafka release the pom pins, without
Docker, and everything a run leaves behind (configs, KRaft logs, server.log, pid) sits in one folder.
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import click

from lakehouse_dev.tls import LocalTls, private_file, secret_file
from pipelines.runtime.commands import echo_json
from pipelines.runtime.local_process import HOST, LocalProcess, free_port, java_command, port_open
from pipelines.runtime.settings import PROJECT_ROOT, jvm_dir

# Kafka's own scripts default to 1G; half of it is plenty for test traffic and leaves room for Spark.
JVM_HEAP = ("-Xmx512m", "-Xms256m")
# More JVM options for the broker, its storage formatting and Kafka Connect (dev/lakehouse_dev/pg_source.py),
# space-separated. The test suites start some fifty short-lived brokers with QUICK_START: C1-only
# JIT and the serial collector, with which a broker reaches readiness on about 40% less CPU and
# idles on 30% less.
JAVA_OPTS_VARIABLE = "LAKEHOUSE_KAFKA_JAVA_OPTS"
QUICK_START = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
# Seconds one metadata probe may take; short, so a broker that dies meanwhile is noticed soon.
PROBE_TIMEOUT = 3.0
# Starts tried when a port the broker chose itself was taken before the broker bound it.
PORT_ATTEMPTS = 3
BIND_FAILURE = re.compile(rb"failed to bind to [\d.]+:(\d+): Address already in use")
# Exits 0 once a client can fetch cluster metadata (the admin client bootstraps in its constructor).
METADATA_PROBE = """
import sys
from kafka import KafkaAdminClient
KafkaAdminClient(bootstrap_servers=sys.argv[1], bootstrap_timeout_ms=int(sys.argv[2])).close()
"""

# Log to stdout, which the launcher redirects into server.log: one writer, and JVM crash output lands in
# the same file. Per-request and per-partition chatter and the ~450-line config dump (server.properties
# sits next to the log) are turned down; startup and shutdown lines stay.
LOG4J_PROPERTIES = """\
log4j.rootLogger=INFO, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka.request.logger=WARN
log4j.logger.state.change.logger=WARN
log4j.logger.kafka.log.LogCleaner=WARN
log4j.logger.org.apache.kafka.storage.internals.log=WARN
log4j.logger.kafka.log.UnifiedLog=WARN
log4j.logger.kafka.cluster.Partition=WARN
log4j.logger.kafka.server.ReplicaFetcherManager=WARN
log4j.logger.kafka.server.ReplicaAlterLogDirsManager=WARN
log4j.logger.kafka.server.KafkaConfig=WARN
log4j.logger.kafka.server.DelayedOperationPurgatory$ExpiredOperationReaper=WARN
log4j.logger.kafka.server.ClientQuotaManager$ThrottledChannelReaper=WARN
log4j.logger.kafka.server.NodeToControllerRequestThread=WARN
"""


def java_options() -> list[str]:
    """The options of JAVA_OPTS_VARIABLE, for every Kafka JVM this project starts (broker, tools, Connect)."""
    return os.environ.get(JAVA_OPTS_VARIABLE, "").split()


def _listeners(value: str) -> dict[str, int]:
    """{"PLAINTEXT": 9092, ...} of a `listeners` or `advertised.listeners` value (NAME://host:port,...)."""
    return {name: int(address.rsplit(":", 1)[1])
            for name, _, address in (item.strip().partition("://") for item in value.split(",") if item.strip())}


def _read_properties(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs if not key.lstrip().startswith("#")}


SCRAM_USER = "lakehouse"
# The ports `start` chooses when they are 0 (the PROXIED listener's only with a proxy_port).
_CHOSEN_PORTS = ("port", "controller_port", "proxied_port", "secure_port", "sasl_port", "mtls_port")
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
SCRAM_LOGIN = "org.apache.kafka.common.security.scram.ScramLoginModule required;"


@dataclass
class KafkaBroker(LocalProcess):
    """One broker+controller node whose whole state lives in `data_dir`.

    The process is detached (own session), so a broker started by `kafka start` outlives the CLI and is
    found again through broker.pid by `kafka stop` or a later `start()`.

    With `proxy_port` set, the broker also serves a second listener, PROXIED, for clients that reach it
    through a TCP proxy listening on `proxy_port` (Toxiproxy in the fault tests: dev/lakehouse_dev/
    toxiproxy.py). A Kafka client bootstraps from any address, then connects to the address the broker
    *advertises* for the listener its request came in on; a proxy in front of the PLAINTEXT listener
    alone would see the bootstrap only, and every later connection would go around it to the port
    PLAINTEXT advertises. PROXIED listens on its own port (`proxied_port`, what the proxy forwards to:
    `proxied_upstream`) and advertises the proxy's address instead, so that every connection of a client
    bootstrapped at `proxied_bootstrap` goes through the proxy, reconnects included. PLAINTEXT stays as it
    was (the broker's own inter-broker listener, and the tests' producers, which the fault must not cut).
    """

    label = "Kafka broker"
    # Kafka logs `[time] LEVEL message`; a message may say "ERROR" at any level.
    error_line = re.compile(r"\] (ERROR|FATAL) |^Caused by: ")
    start_timeout = 90.0

    data_dir: Path
    # 0: a free port, chosen by `start`. The controller's: None reuses the one the data dir's
    # config names (KRaft's log remembers its voters), else a free one, as 0 does.
    port: int = 0
    controller_port: int | None = None
    # The proxy's address (127.0.0.1:proxy_port) is advertised on the PROXIED listener, which listens on
    # `proxied_port` (0: a free port, chosen by `start`). None: no PROXIED listener.
    proxy_port: int | None = None
    proxied_port: int = 0
    # A SASL_SSL listener, SECURE, on this port (0: a free one): TLS with the state folder's own CA
    # (lakehouse_dev.tls) and SCRAM-SHA-512 or SCRAM-SHA-256 for the user SCRAM_USER, whose password is
    # `scram_password_file`. None: no such listener.
    secure_port: int | None = None
    # A SASL_PLAINTEXT listener, SASL, on this port (0: a free one): PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 for
    # SCRAM_USER, with the same password, no TLS. None: no such listener.
    sasl_port: int | None = None
    # An SSL listener, MTLS, on this port (0: a free one) that takes only clients presenting a certificate the
    # state folder's CA signed (`tls.client_cert`, `tls.client_key`). None: no such listener.
    mtls_port: int | None = None

    def __post_init__(self) -> None:
        # Absolute, because the paths are written into configs and matched against the java command line.
        self.data_dir = Path(self.data_dir).resolve()

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def proxied_bootstrap(self) -> str:
        """Where clients bootstrap to go through the proxy (the proxy's listen address)."""
        if self.proxy_port is None:
            raise RuntimeError("this broker has no PROXIED listener (proxy_port unset)")
        return f"{HOST}:{self.proxy_port}"

    @property
    def proxied_upstream(self) -> str:
        """What the proxy forwards to: the PROXIED listener itself."""
        if self.proxy_port is None or not self.proxied_port:
            raise RuntimeError("this broker has no PROXIED listener yet (proxy_port unset, or not started)")
        return f"{HOST}:{self.proxied_port}"

    @property
    def config_path(self) -> Path:
        return self.data_dir / "server.properties"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "server.log"

    @property
    def pid_path(self) -> Path:
        return self.data_dir / "broker.pid"

    @property
    def marker(self) -> str:
        return f"kafka.Kafka {self.config_path}"

    def command(self) -> list[str]:
        return self._java_command("kafka.Kafka", str(self.config_path))

    def popen_options(self) -> dict[str, Path]:
        return {"cwd": self.data_dir}

    def start(self, timeout: float | None = None) -> KafkaBroker:
        """Start the broker, or adopt the one already running from `data_dir`, and wait until it serves metadata.

        A port given as 0 is chosen here, and chosen again if another process takes it between the
        choice and the broker's bind (`free_port` can only say a port is free now).
        """
        if self.pid() is not None:
            return super().start(timeout)
        deadline = time.monotonic() + (self.start_timeout if timeout is None else timeout)
        if self.controller_port is None:
            self.controller_port = self._stored_controller_port() or 0
        chosen_here = [name for name in _CHOSEN_PORTS if getattr(self, name) == 0]
        if self.proxy_port is None and "proxied_port" in chosen_here:
            chosen_here.remove("proxied_port")  # no PROXIED listener: its port stays unset
        for attempt in range(1, PORT_ATTEMPTS + 1):
            for name in chosen_here:
                setattr(self, name, free_port())
            log_start = self.log_size()
            try:
                self.launch(deadline)
                if self.secure_port is not None or self.sasl_port is not None:
                    self._add_scram_user()
                return self
            except RuntimeError:
                chosen = {getattr(self, name) for name in chosen_here}
                if attempt == PORT_ATTEMPTS or self._taken_port(log_start) not in chosen:
                    raise
        raise AssertionError("unreachable")

    def adopt(self, pid: int) -> None:
        running_port = self.configured_port()
        if self.port and running_port != self.port:
            raise RuntimeError(
                f"a broker from {self.data_dir} already runs on port {running_port} (pid {pid}); stop it first"
            )
        self.port = running_port
        advertised = _listeners(_read_properties(self.config_path)["advertised.listeners"])
        if self.proxy_port is not None and advertised.get("PROXIED") != self.proxy_port:
            raise RuntimeError(f"the broker from {self.data_dir} (pid {pid}) does not advertise the proxy port "
                               f"{self.proxy_port}; stop it first")
        if "PROXIED" in advertised:
            self.proxy_port = advertised["PROXIED"]
            self.proxied_port = _listeners(_read_properties(self.config_path)["listeners"])["PROXIED"]
        self.secure_port = advertised.get("SECURE", self.secure_port)
        self.sasl_port = advertised.get("SASL", self.sasl_port)
        self.mtls_port = advertised.get("MTLS", self.mtls_port)

    def prepare(self, log_start: int) -> None:
        self._write_configs()
        self._format_storage(log_start)

    def _taken_port(self, log_start: int) -> int | None:
        """The port the start that logged from `log_start` on could not bind (another process had it), if any."""
        found = BIND_FAILURE.search(self.log_since(log_start).encode())
        return int(found[1]) if found else None

    def is_running(self) -> bool:
        """Alive *and* accepting connections: a live pid alone may be a broker still starting or stopping."""
        return self.pid() is not None and port_open(self.configured_port())

    def configured_port(self) -> int:
        """Client port from server.properties: that of the running broker, whatever `self.port` says."""
        return _listeners(_read_properties(self.config_path)["advertised.listeners"])["PLAINTEXT"]

    def _stored_controller_port(self) -> int | None:
        """The quorum address of an earlier run: KRaft metadata in the log dirs remembers its voters."""
        if not self.config_path.exists():
            return None
        voters = _read_properties(self.config_path)["controller.quorum.voters"]
        return int(voters.rsplit(":", 1)[1])

    @property
    def tls(self) -> LocalTls:
        """The CA and server certificate of the SECURE listener (clients trust `tls.ca_file`)."""
        return LocalTls(self.data_dir / "tls")

    @property
    def scram_password_file(self) -> Path:
        """SCRAM_USER's password, on every SASL listener and mechanism alike."""
        return self.data_dir / "tls" / "scram-password"

    @property
    def plain_users_file(self) -> Path:
        """The PLAIN mechanism's user and password (0600), which the broker reads through its FileConfigProvider:
        the JAAS line in server.properties holds a reference only."""
        return self.data_dir / "tls" / "plain-users.properties"

    @property
    def secure_bootstrap(self) -> str:
        if self.secure_port is None:
            raise RuntimeError("this broker has no SECURE listener (secure_port unset)")
        return f"{HOST}:{self.secure_port}"

    @property
    def sasl_bootstrap(self) -> str:
        if self.sasl_port is None:
            raise RuntimeError("this broker has no SASL listener (sasl_port unset)")
        return f"{HOST}:{self.sasl_port}"

    @property
    def mtls_bootstrap(self) -> str:
        if self.mtls_port is None:
            raise RuntimeError("this broker has no MTLS listener (mtls_port unset)")
        return f"{HOST}:{self.mtls_port}"

    def _write_configs(self) -> None:
        listeners = {"PLAINTEXT": (self.port, self.port, "PLAINTEXT"),
                     "CONTROLLER": (self.controller_port, None, "PLAINTEXT")}
        if self.proxy_port is not None:
            listeners["PROXIED"] = (self.proxied_port, self.proxy_port, "PLAINTEXT")
        for name, port, protocol in (("SECURE", self.secure_port, "SASL_SSL"), ("SASL", self.sasl_port,
                                                                                 "SASL_PLAINTEXT"),
                                     ("MTLS", self.mtls_port, "SSL")):
            if port is not None:
                listeners[name] = (port, port, protocol)
        settings = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{HOST}:{self.controller_port}",
            "listeners": ",".join(f"{name}://{HOST}:{port}" for name, (port, _, _) in listeners.items()),
            "advertised.listeners": ",".join(f"{name}://{HOST}:{advertised}"
                                             for name, (_, advertised, _) in listeners.items() if advertised),
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": ",".join(f"{name}:{protocol}"
                                                       for name, (_, _, protocol) in listeners.items()),
            "log.dirs": str(self.data_dir / "kraft-logs"),
            "num.partitions": "3",
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "true",
            # Test and demo data must outlive the default 7 days.
            "log.retention.hours": "-1",
            **self._secured_settings(),
        }
        self.config_path.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))
        (self.data_dir / "log4j.properties").write_text(LOG4J_PROPERTIES)

    def _secured_settings(self) -> dict[str, str]:
        """The settings of the SECURE, SASL and MTLS listeners that are on, each its own (`listener.name.<name>.`)."""
        settings: dict[str, str] = {}
        if self.secure_port is not None:
            settings |= self._tls_settings("secure") | _sasl_settings("secure", SCRAM_MECHANISMS)
        if self.sasl_port is not None:
            settings |= _sasl_settings("sasl", ("PLAIN", *SCRAM_MECHANISMS))
            settings |= {"listener.name.sasl.plain.sasl.jaas.config": self._plain_login(),
                         "config.providers": "file",
                         "config.providers.file.class": "org.apache.kafka.common.config.provider.FileConfigProvider"}
        if self.mtls_port is not None:
            settings |= self._tls_settings("mtls") | {
                "listener.name.mtls.ssl.client.auth": "required",
                "listener.name.mtls.ssl.truststore.type": "PEM",
                "listener.name.mtls.ssl.truststore.location": str(self.tls.ca_file)}
        return settings

    def _tls_settings(self, listener: str) -> dict[str, str]:
        """A TLS listener's key store: PEM, the server's key and chain in one file."""
        tls = self.tls.ensure()
        return {f"listener.name.{listener}.ssl.keystore.type": "PEM",
                f"listener.name.{listener}.ssl.keystore.location": str(tls.server_pem)}

    def _plain_login(self) -> str:
        """PLAIN's JAAS line on the broker: SCRAM_USER's password by reference to `plain_users_file` (0600)."""
        password = secret_file(self.scram_password_file)
        private_file(self.plain_users_file, f"{SCRAM_USER}={password}\n")
        return (f"org.apache.kafka.common.security.plain.PlainLoginModule required "
                f'user_{SCRAM_USER}="${{file:{self.plain_users_file}:{SCRAM_USER}}}";')

    def _cluster_id(self) -> str:
        """Generated once per data_dir: formatted log dirs only accept the id they were formatted with."""
        path = self.data_dir / "cluster.id"
        if path.exists():
            return path.read_text().strip()
        cluster_id = "-"
        # Kafka's own generator skips ids starting with "-": the storage tool would parse them as an option.
        while cluster_id.startswith("-"):
            cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        path.write_text(f"{cluster_id}\n")
        return cluster_id

    def _format_storage(self, log_start: int) -> None:
        if (self.data_dir / "kraft-logs" / "meta.properties").exists():
            return  # formatted by an earlier start; skip a JVM launch
        command = self._java_command(
            "kafka.tools.StorageTool", "format", "-t", self._cluster_id(),
            "-c", str(self.config_path), "--ignore-formatted",
        )  # fmt: skip
        result = subprocess.run(command, check=False, capture_output=True, cwd=self.data_dir, timeout=120)
        with self.log_path.open("ab") as log:
            log.write(result.stdout + result.stderr)
        if result.returncode != 0:
            raise RuntimeError(
                self.failure(f"formatting KRaft storage failed (exit code {result.returncode})", log_start)
            )

    def _add_scram_user(self) -> None:
        """Give SCRAM_USER its SCRAM-SHA-256 and SCRAM-SHA-512 credentials (KRaft keeps them in its metadata),
        through the PLAINTEXT listener, which takes no authentication: a request, so that the password is on no
        command line, as the storage tool's `--add-scram` would put it. Run after every start: an upsert, and the
        file is the truth."""
        from kafka.admin import KafkaAdminClient, ScramMechanism, UserScramCredentialUpsertion

        password = secret_file(self.scram_password_file)
        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, client_id="lakehouse-dev-broker")
        try:  # one request per mechanism: a request alters a user's credentials once
            failed = [admin.alter_user_scram_credentials([UserScramCredentialUpsertion(SCRAM_USER, scram, password)])
                      for scram in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512)]
        finally:
            admin.close()
        if any(any(answer.values()) for answer in failed):
            raise RuntimeError(self.failure(f"creating the SCRAM user {SCRAM_USER} failed: {failed}", 0))

    def _java_command(self, main_class: str, *args: str) -> list[str]:
        jars = jvm_dir() / "kafka"
        if not any(jars.glob("kafka_2.13-*.jar")):
            raise RuntimeError(f"no Kafka broker jars in {jars}; run `make setup` first")
        log4j = f"-Dlog4j.configuration=file:{self.data_dir / 'log4j.properties'}"
        return java_command(main_class, *args, classpath=f"{jars}/*", options=[*JVM_HEAP, *java_options(), log4j])

    def unready(self, pid: int, deadline: float) -> str | None:
        remaining = deadline - time.monotonic()
        if port_open(self.port) and self._serves_metadata(min(remaining, PROBE_TIMEOUT)):
            return None
        return f"no cluster metadata from {self.bootstrap}"

    def _serves_metadata(self, timeout: float) -> bool:
        """Whether a kafka-python client bootstraps (gets metadata listing a broker), not just a TCP accept.

        Probed from a child process: kafka-python 3.0 leaks its I/O thread when bootstrap fails inside a
        client's constructor, and a hung probe is simply killed.
        """
        command = [sys.executable, "-c", METADATA_PROBE, self.bootstrap, str(int(timeout * 1000))]
        try:
            probe = subprocess.run(command, check=False, capture_output=True, timeout=timeout + 10)
        except subprocess.TimeoutExpired:
            return False
        return probe.returncode == 0


def _sasl_settings(listener: str, mechanisms: tuple[str, ...]) -> dict[str, str]:
    """A SASL listener's mechanisms, and the SCRAM ones' login (credentials in KRaft's metadata: `_add_scram_user`)."""
    return {f"listener.name.{listener}.sasl.enabled.mechanisms": ",".join(mechanisms),
            **{f"listener.name.{listener}.{m.lower()}.sasl.jaas.config": SCRAM_LOGIN
               for m in mechanisms if m.startswith("SCRAM-")}}


DATA_DIR_OPTION = click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=PROJECT_ROOT / ".kafka",
    show_default=True,
    help="Folder holding the broker's configs, KRaft logs, server.log and pid file.",
)


@click.group("kafka")
def kafka() -> None:
    """A local single-node Kafka broker (KRaft) on 127.0.0.1, run from the jars of `make setup`."""


JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout instead of lines.")


@kafka.command()
@click.option("--port", default=9092, show_default=True,
              help="Client port (PLAINTEXT on 127.0.0.1); 0: any free port, printed.")
@DATA_DIR_OPTION
@click.option("--timeout", default=90.0, show_default=True, help="Seconds to wait for the broker.")
def start(port: int, data_dir: Path, timeout: float) -> None:
    """Start the broker in the background (no-op if it already runs) and wait until it serves clients."""
    broker = KafkaBroker(data_dir, port=port)
    try:
        broker.start(timeout=timeout)
    except RuntimeError as error:
        raise click.ClickException(str(error)) from error
    click.echo(f"Kafka broker ready at {broker.bootstrap} (pid {broker.pid()})")
    click.echo(f"log: {broker.log_path}")


@kafka.command()
@DATA_DIR_OPTION
def stop(data_dir: Path) -> None:
    """Stop the broker started from --data-dir; its data stays for the next `start`."""
    broker = KafkaBroker(data_dir)
    was_running = broker.pid() is not None
    broker.stop()
    click.echo("Kafka broker stopped" if was_running else "Kafka broker was not running")


@kafka.command()
@DATA_DIR_OPTION
@JSON_OPTION
def status(data_dir: Path, as_json: bool) -> None:
    """Report whether the broker runs and where; exit code 1 if it does not."""
    broker = KafkaBroker(data_dir)
    running = broker.is_running()
    if as_json:
        bootstrap = f"{HOST}:{broker.configured_port()}" if running else None
        echo_json({"running": running, "bootstrap": bootstrap, "pid": broker.pid(),
                   "data_dir": str(broker.data_dir), "log": str(broker.log_path)})
    elif running:
        click.echo(f"Kafka broker running at {HOST}:{broker.configured_port()} (pid {broker.pid()})")
        click.echo(f"log: {broker.log_path}")
    else:
        click.echo(f"Kafka broker not running (data dir {broker.data_dir})")
    if not running:
        raise SystemExit(1)
