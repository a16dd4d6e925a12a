"""What PostgreSQL's catalog and Kafka Connect say of the source, read once into plain facts.

`lakehouse source check` judges these facts (pipelines.source.check) and `lakehouse source sync` acts on them
(pipelines.source.sync); reading them apart from judging them lets the judgement be tested without a database.
Names are `schema.table` as PostgreSQL spells them (case kept, no quotes); every statement passes them as
parameters or `psycopg.sql.Identifier`, so mixed case, spaces and dots in a name are safe.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

from pipelines.errors import ConnectError
from pipelines.lake.declaration import Declaration
from pipelines.runtime.config import SourceSettings
from pipelines.source.connect_rest import ConnectClient

DEBEZIUM_POSTGRES = "io.debezium.connector.postgresql.PostgresConnector"
# Debezium's own defaults, for a config that leaves a key out.
DEBEZIUM_DEFAULTS = {"publication.name": "dbz_publication", "slot.name": "debezium", "plugin.name": "decoderbufs",
                     "publication.autocreate.mode": "all_tables"}
_REGEX_SPECIALS = re.compile(r"([\\.^$|?*+()\[\]{}])")


def split_name(source: str) -> tuple[str, str]:
    """`schema.table` into its two names (the first dot separates them, as the declaration's `source` does)."""
    schema, table = source.split(".", 1)
    return schema, table


def pattern_of(source: str) -> str:
    """A `schema.table` name as an anchored regular expression of Debezium's lists (`table.include.list`, a
    signal's `data-collections`): every character a regular expression gives a meaning escaped."""
    return _REGEX_SPECIALS.sub(r"\\\1", source)


def include_list(sources: list[str]) -> str:
    """`table.include.list` of these tables, in their order."""
    return ",".join(pattern_of(s) for s in sources)


def captured_by(patterns: str | None, source: str) -> bool:
    """Whether Debezium's comma-separated list of regular expressions matches `source` whole (case-insensitive,
    as Debezium's table filters are); an empty or absent list matches every table."""
    entries = [e.strip() for e in (patterns or "").split(",") if e.strip()]
    if not entries:
        return True
    for entry in entries:
        try:
            if re.fullmatch(entry, source, re.IGNORECASE):
                return True
        except re.error:
            if entry.lower() == source.lower():
                return True
    return False


@dataclass(frozen=True)
class SourceTable:
    """What PostgreSQL's catalog says of one table."""

    columns: tuple[str, ...]
    primary_key: tuple[str, ...]
    replica_identity: str  # pg_class.relreplident: d(efault), n(othing), f(ull), i(ndex)
    partitioned: bool = False  # relkind 'p': its rows live in its partitions
    partition_of: str | None = None  # the root a partition belongs to (schema.table), None if it is none
    leaves: dict[str, str] = field(default_factory=dict)  # a partitioned table's leaf partitions -> their identity


@dataclass(frozen=True)
class Publication:
    """The publication: every table it publishes (`pg_publication_tables`), those it names itself
    (`pg_publication_rel`), and how. `memberships`: for each table it names itself, which catalog row makes it
    a member (`<publication oid>:<pg_publication_rel oid>`): a table dropped from the publication and added
    back gets a new row (pipelines.source.membership)."""

    published: frozenset[str]
    members: frozenset[str]
    all_tables: bool = False
    via_root: bool = False
    memberships: dict[str, str] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Slot:
    """The replication slot."""

    active: bool
    wal_status: str | None  # reserved, extended, unreserved, lost
    retained_bytes: int | None  # WAL the slot holds back (from its restart_lsn)
    inactive_seconds: float | None = None  # how long it has had no consumer, when known


@dataclass
class SourceFacts:
    """The database's side: server settings, the publication, the slot, the declared tables, the signal table."""

    wal_level: str
    max_slot_wal_keep_mb: int  # -1: no limit
    publication: Publication | None
    slot: Slot | None
    tables: dict[str, SourceTable | None]  # declared schema.table -> what the catalog says (None: absent)
    signal_table: bool = True  # whether the signal table exists


@dataclass
class ConnectorFacts:
    """Kafka Connect's side: the connector's config and status; `error` when Connect could not say."""

    url: str
    name: str
    config: dict[str, str] | None = None  # None: no such connector (or unknown, with `error`)
    status: dict[str, Any] | None = None
    error: str | None = None

    def setting(self, key: str) -> str | None:
        """A config key's value, Debezium's default where the config leaves it out."""
        return (self.config or {}).get(key, DEBEZIUM_DEFAULTS.get(key))


def read_table(conn: Any, source: str) -> SourceTable | None:
    """The table's columns (in order), primary key (in the key's order), replica identity and partitioning; None
    if there is no such table."""
    schema, table = split_name(source)
    row = conn.execute(
        "SELECT c.oid, c.relreplident, c.relkind, "
        "(SELECT pn.nspname || '.' || pc.relname FROM pg_partition_root(c.oid) r(oid) JOIN pg_class pc ON pc.oid = "
        "r.oid JOIN pg_namespace pn ON pn.oid = pc.relnamespace WHERE c.relispartition) "
        "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')", (schema, table)).fetchone()
    if row is None:
        return None
    oid, identity, kind, root = row
    columns = [r[0] for r in conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        (oid,)).fetchall()]
    key = [r[0] for r in conn.execute(
        "SELECT a.attname FROM pg_index i CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n) "
        "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
        "WHERE i.indrelid = %s AND i.indisprimary ORDER BY k.n", (oid,)).fetchall()]
    leaves = {}
    if _text(kind) == "p":
        leaves = {f"{s}.{t}": _text(r) for s, t, r in conn.execute(
            "SELECT n.nspname, c.relname, c.relreplident FROM pg_partition_tree(%s) p JOIN pg_class c ON c.oid = "
            "p.relid JOIN pg_namespace n ON n.oid = c.relnamespace WHERE p.isleaf", (oid,)).fetchall()}
    return SourceTable(tuple(columns), tuple(key), _text(identity), _text(kind) == "p",
                       root if root != source else None, leaves)


def _text(value: Any) -> str:
    """A `"char"` column's value (psycopg gives bytes or str by version)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def read_publication(conn: Any, name: str) -> Publication | None:
    """The publication named `name`; None if there is none."""
    row = conn.execute("SELECT oid, puballtables, pubviaroot FROM pg_publication WHERE pubname = %s",
                       (name,)).fetchone()
    if row is None:
        return None
    oid, all_tables, via_root = row
    published = {f"{s}.{t}" for s, t in conn.execute(
        "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s", (name,)).fetchall()}
    rows = {f"{s}.{t}": f"{oid}:{row}" for s, t, row in conn.execute(
        "SELECT n.nspname, c.relname, r.oid FROM pg_publication_rel r JOIN pg_class c ON c.oid = r.prrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE r.prpubid = %s", (oid,)).fetchall()}
    return Publication(frozenset(published), frozenset(rows), bool(all_tables), bool(via_root), rows)


def read_slot(conn: Any, name: str, grace: float = 0.0) -> Slot | None:
    """The replication slot `name`, None if there is none. An inactive slot is read again for up to `grace`
    seconds: a connector's task that restarts leaves it inactive for a moment."""
    since = "inactive_since" if conn.info.server_version >= 170000 else "NULL::timestamptz"
    query = (f"SELECT active, wal_status, pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint, "
             f"extract(epoch FROM now() - {since})::float FROM pg_replication_slots WHERE slot_name = %s")
    deadline = time.monotonic() + grace
    while True:
        row = conn.execute(query, (name,)).fetchone()
        if row is None:
            return None
        active, wal_status, retained, inactive = row
        if active or time.monotonic() >= deadline:
            waited = grace if not active else None
            return Slot(bool(active), wal_status, retained, inactive if inactive is not None else waited)
        time.sleep(0.5)


def signal_table_exists(conn: Any, source: str) -> bool:
    schema, table = split_name(source)
    return conn.execute("SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                        "WHERE n.nspname = %s AND c.relname = %s", (schema, table)).fetchone() is not None


def read_source(conn: Any, settings: SourceSettings, declaration: Declaration, slot_grace: float = 5.0
                ) -> SourceFacts:
    """Everything the check and the sync need of the database, in one pass."""
    wal_level = conn.execute("SHOW wal_level").fetchone()[0]
    keep = conn.execute("SELECT setting FROM pg_settings WHERE name = 'max_slot_wal_keep_size'").fetchone()
    return SourceFacts(
        wal_level=wal_level, max_slot_wal_keep_mb=int(keep[0]) if keep else -1,
        publication=read_publication(conn, settings.publication),
        slot=read_slot(conn, settings.slot, slot_grace),
        tables={t.source: read_table(conn, t.source) for t in declaration.tables.values()},
        signal_table=signal_table_exists(conn, settings.signal_table))


def read_connector(client: ConnectClient, name: str) -> ConnectorFacts:
    """The connector's config and status; what Connect could not say is the facts' `error`."""
    facts = ConnectorFacts(client.url, name)
    try:
        if not client.exists(name):
            return facts
        facts.config = client.config(name)
        facts.status = client.status(name)
    except ConnectError as exc:
        facts.error = str(exc)
    return facts
