"""What Kafka Connect runs as the real source: the Debezium connector as the contract describes it, the
standalone worker that runs it, and the names both share with PostgreSQL (database, slot, publication,
signal table).

The captured tables are the declaration's (`pipelines.runtime.declared.read_declaration()`, contract section 7):
`lakehouse dev source start` creates the connector with them, `lakehouse dev source sync` changes them while it
runs (the product's sync, pipelines/source/sync.py).

Plain data, apart from the processes (dev/lakehouse_dev/pg_source.py), so that docker/compose.yaml's
connector can be checked against the same settings (tests/test_compose.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from pipelines.deploy.connector import DEFAULT_CONNECTOR
from pipelines.lake.declaration import Declaration
from pipelines.runtime.config import SourceSettings
from pipelines.runtime.declared import read_declaration
from pipelines.runtime.local_process import HOST
from pipelines.runtime.settings import unavailable_placeholder

DATABASE = "shop"
PG_USER = "postgres"
CONNECTOR = DEFAULT_CONNECTOR  # the name the watchdog (`lakehouse connector`) looks for by default
SLOT = "shop_debezium"
PUBLICATION = "shop_publication"
# Debezium's source signalling channel (`signal.data.collection`): `lakehouse dev source sync` inserts an
# `execute-snapshot` row to snapshot a newly declared table incrementally, and the connector writes
# its snapshot windows' watermarks there. Debezium 2.7 captures it whatever `table.include.list`
# says (RelationalTableFilters adds it to the table filter), so it is in the filtered publication
# and its rows reach a topic of their own (`<prefix>.public.debezium_signal`), which nothing reads.
SIGNAL_TABLE = "public.debezium_signal"
SIGNAL_DDL = ("CREATE TABLE IF NOT EXISTS public.debezium_signal "
              "(id varchar(42) PRIMARY KEY, type varchar(32) NOT NULL, data varchar(2048) NULL)")
# Numeric columns' Connect schema names their source type, precision and scale
# (`__debezium.source.column.type/length/scale`): under decimal.handling.mode=string their value is
# a string, and this is how bronze knows the exact decimal it holds. Matched against
# `<schema>.<table>.<type name>`, anchored, so every numeric column of every captured table.
PROPAGATE_TYPES = r".+\.numeric"
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


def include_list(tables: Iterable[str]) -> str:
    """`table.include.list` of these `schema.table` names: anchored regular expressions, `.` and `$` escaped."""
    return ",".join(t.replace(".", r"\.").replace("$", r"\$") for t in tables)


def connector_config(pg_port: int, *, partitions: int = 3, declaration: Declaration | None = None,
                     password: str = "", sslrootcert: Path | None = None) -> dict[str, str]:
    """The Debezium connector as the contract describes it (section 1), capturing the declared tables
    (section 7; `declaration` or the one in force), plus what 2.7 needs said.

    - `plugin.name=pgoutput`: 2.7's default is decoderbufs, a server extension Debian does not ship.
    - `publication.autocreate.mode=filtered`: a publication of the captured tables only (the default,
      all tables, makes UPDATE and DELETE fail on any table without a replica identity). At every
      start of its task, Debezium sets the publication's tables to those its filter captures.
    - `skipped.operations=none`: Debezium skips truncates by default, the contract has them.
    - `signal.data.collection`: the signal table, for incremental snapshots of tables declared later.
    - `datatype.propagate.source.type`: numeric columns' precision and scale in their schema.
    - `topic.creation.*`: Connect creates the topics, keyed records spread over partitions.

    A secure source: `password` is a reference Connect resolves (`file_reference`), never the password, so the
    config Connect's REST API returns and its log hold none; `sslrootcert`, the CA of PostgreSQL's certificate,
    which Debezium then verifies with the host name (`verify-full`).
    """
    declaration = declaration or read_declaration()
    tls = {"database.sslmode": "verify-full", "database.sslrootcert": str(sslrootcert)} if sslrootcert else {}
    return {
        "name": CONNECTOR,
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "tasks.max": "1",
        "database.hostname": HOST,
        "database.port": str(pg_port),
        "database.user": PG_USER,
        "database.password": password,
        **tls,
        "database.dbname": DATABASE,
        "topic.prefix": declaration.topic_prefix,
        "plugin.name": "pgoutput",
        "slot.name": SLOT,
        "publication.name": PUBLICATION,
        "publication.autocreate.mode": "filtered",
        "table.include.list": include_list(t.source for t in declaration.tables.values()),
        "decimal.handling.mode": "string",
        "unavailable.value.placeholder": unavailable_placeholder(),
        "skipped.operations": "none",
        "tombstones.on.delete": "true",
        "snapshot.mode": "initial",
        "signal.data.collection": SIGNAL_TABLE,
        "datatype.propagate.source.type": PROPAGATE_TYPES,
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


BASIC_AUTH_EXTENSION = "org.apache.kafka.connect.rest.basic.auth.extension.BasicAuthSecurityRestExtension"
# The Java client's properties that hold a secret (their type is PASSWORD): always through the provider.
SECRET_PROPERTIES = frozenset({"sasl.jaas.config", "ssl.key.password", "ssl.keystore.key", "ssl.keystore.password",
                               "ssl.truststore.password"})
# The worker's own clients (its admin client at start-up, unprefixed), a source task's producer, a sink's
# consumer and the topic creation's admin client: each takes its security from its own prefix.
CLIENT_PREFIXES = ("", "producer.", "consumer.", "admin.")


def file_provider(folder: Path) -> dict[str, str]:
    """Kafka Connect's FileConfigProvider (KIP-297 for connector configs, KIP-421 for the worker's own): a
    `${file:<path>:<key>}` in a value is replaced, when Connect reads it, by `key` of the properties file
    `path`; the config keeps the reference, which is all that its REST API returns and its log shows.
    `allowed.paths` (KIP-993) keeps it to `folder`: a connector created through the REST API reads no other file.
    """
    return {"config.providers": "file",
            "config.providers.file.class": "org.apache.kafka.common.config.provider.FileConfigProvider",
            "config.providers.file.param.allowed.paths": str(folder)}


def file_reference(secrets: Path, key: str) -> str:
    """The FileConfigProvider's reference to `key` of the properties file `secrets`."""
    return f"${{file:{secrets}:{key}}}"


def kafka_client_config(properties: dict[str, str], secrets: Path) -> tuple[dict[str, str], dict[str, str]]:
    """The worker's settings for Kafka clients of these Java client `properties` (kafka_clients.java_properties),
    and what goes into the properties file `secrets`: every secret property by reference only."""
    kept = {f"kafka.{k}": v for k, v in properties.items() if k in SECRET_PROPERTIES}
    values = {k: file_reference(secrets, f"kafka.{k}") if k in SECRET_PROPERTIES else v for k, v in properties.items()}
    return {f"{prefix}{k}": v for prefix in CLIENT_PREFIXES for k, v in values.items()}, kept


def rest_jaas(users: Path) -> str:
    """The JAAS file of the REST API's basic authentication: the users and passwords are in `users`."""
    return ("KafkaConnect {\n  org.apache.kafka.connect.rest.basic.auth.extension.PropertyFileLoginModule required\n"
            f'  file="{users}";\n}};\n')


def properties_text(values: dict[str, str]) -> str:
    """A Java properties file of `values`, each escaped as `java.util.Properties.load` reads it back."""
    def escaped(text: str) -> str:
        text = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
        return "\\" + text if text.startswith(" ") else text

    return "".join(f"{k}={escaped(v)}\n" for k, v in values.items())


def psycopg_options(source: SourceSettings, dbname: str | None = None) -> dict[str, object]:
    """psycopg's connection options for `source`, the password revealed into them alone."""
    options: dict[str, object] = {"host": source.host, "port": source.port, "user": source.user,
                                  "dbname": dbname or source.database, "sslmode": source.sslmode}
    if source.sslrootcert is not None:
        options["sslrootcert"] = str(source.sslrootcert)
    if source.password is not None:
        options["password"] = source.password.reveal()
    return options
