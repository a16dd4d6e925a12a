"""The dev source as one instance of the product's source (pipelines.source): the `[source]` and `[connect]`
settings that describe `lakehouse dev source start`'s PostgreSQL and Kafka Connect, so that `lakehouse dev source
sync` and `RealSource.up` run the product's check and sync against them, and a test can run `lakehouse source
check|sync` on them through the environment.
"""

from __future__ import annotations

from typing import Any

from lakehouse_dev.connect_config import CONNECTOR, DATABASE, PG_USER, PUBLICATION, SIGNAL_TABLE, SLOT
from pipelines.lake.declaration import Declaration
from pipelines.runtime.config import ConnectSettings, SourceSettings
from pipelines.runtime.local_process import HOST
from pipelines.source.catalog import read_publication, read_source
from pipelines.source.check import Target, declaration_findings
from pipelines.source.sync import prepare, refuse


def dev_target(pg_port: int, connect_url: str, schemas_enable: bool | None = None) -> Target:
    """The dev source's database on `pg_port` and its Connect at `connect_url`, with the names it runs under."""
    source = SourceSettings(host=HOST, port=pg_port, database=DATABASE, user=PG_USER, publication=PUBLICATION,
                            slot=SLOT, signal_table=SIGNAL_TABLE)
    return Target(source, ConnectSettings(url=connect_url, connector=CONNECTOR), schemas_enable)


def dev_environment(pg_port: int, connect_url: str) -> dict[str, str]:
    """The environment under which `lakehouse source check|sync` reach the dev source (`LAKEHOUSE_<SECTION>_<KEY>`)."""
    target = dev_target(pg_port, connect_url)
    keys = ("host", "port", "database", "user", "publication", "slot", "signal_table")
    return {f"LAKEHOUSE_SOURCE_{k.upper()}": str(getattr(target.source, k)) for k in keys} | {
        "LAKEHOUSE_CONNECT_URL": connect_url, "LAKEHOUSE_CONNECTOR": CONNECTOR}


def published(conn: Any) -> set[str] | None:
    """The dev publication's tables as `schema.table` (the signal table left out); None if there is none."""
    found = read_publication(conn, PUBLICATION)
    return None if found is None else set(found.published) - {SIGNAL_TABLE}


def check_and_prepare(conn: Any, target: Target, declaration: Declaration) -> list[str]:
    """Before Connect starts: the declaration against the database (DeclarationMismatch naming every problem,
    nothing changed), then the signal table and the replica identities (what was changed, as notes)."""
    facts = read_source(conn, target.source, declaration, slot_grace=0.0)
    refuse(declaration_findings(facts, declaration, target.source, target.schemas_enable))
    return prepare(conn, target.source, declaration, facts)
