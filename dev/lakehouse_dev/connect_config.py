"""What Kafka Connect runs as the real source: the Debezium connector as the contract describes it, the
standalone worker that runs it, and the names both share with PostgreSQL (database, slot, publication,
signal table).

The captured tables are the declaration's (`pipelines.runtime.lake.read_declaration()`, contract section 7):
`lakehouse dev source start` creates the connector with them, `lakehouse dev source sync` changes them while it
runs (dev/lakehouse_dev/source_sync.py).

Plain data, apart from the processes (dev/lakehouse_dev/pg_source.py), so that docker/compose.yaml's
connector can be checked against the same settings (tests/test_compose.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from pipelines.deploy.connector import DEFAULT_CONNECTOR
from pipelines.lake.declaration import Declaration
from pipelines.runtime.lake import read_declaration
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


def connector_config(pg_port: int, *, partitions: int = 3, declaration: Declaration | None = None) -> dict[str, str]:
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
    """
    declaration = declaration or read_declaration()
    return {
        "name": CONNECTOR,
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "tasks.max": "1",
        "database.hostname": HOST,
        "database.port": str(pg_port),
        "database.user": PG_USER,
        "database.password": "",
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
