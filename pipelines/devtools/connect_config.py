"""What Kafka Connect runs as the real source: the Debezium connector as the contract describes it, the
standalone worker that runs it, and the names both share with PostgreSQL (database, slot, publication).

Plain data, apart from the processes (pipelines/devtools/pg_source.py), so that docker/compose.yaml's
connector can be checked against the same settings (tests/test_compose.py).
"""

from __future__ import annotations

from pathlib import Path

from pipelines.contract import SCHEMA, TABLES, TOPIC_PREFIX
from pipelines.local_process import HOST
from pipelines.settings import unavailable_placeholder

DATABASE = "shop"
PG_USER = "postgres"
CONNECTOR = "shop-source"
SLOT = "shop_debezium"
PUBLICATION = "shop_publication"
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
