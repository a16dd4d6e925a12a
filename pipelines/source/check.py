"""`lakehouse source check`: every reason a declared table's changes would not reach its topic, each as a finding
that says how to fix it.

A finding is an `error` (changes are lost or never captured: the check exits 1, the sync refuses or does not
report success) or a `warning` (the stream works now, a risk remains: said, exit 0). `fixable` marks what
`lakehouse source sync` repairs itself (the publication's tables, the connector's include list and signal
table, replica identities); the rest needs the operator (a server setting, another connector, a privilege).

What is checked (docs/tables.md, "Your own database", says what each finding means):
- the server: `wal_level` is `logical`; `max_slot_wal_keep_size` neither unlimited (a stopped connector's slot
  can fill the disk) nor small (a slot that falls behind by more is invalidated, its changes lost);
- the publication exists and publishes every declared table and the signal table; a partitioned table
  declared by its parent needs `publish_via_partition_root` (else its changes are published as each
  partition's, under names the connector does not capture);
- the replication slot exists, has a consumer, and still has its WAL (`wal_status` not `lost`);
- each declared table exists, its primary key is the declared key (same columns, same order), its replica
  identity lets deletes carry the key (DEFAULT with that key; NOTHING makes PostgreSQL refuse UPDATE and DELETE
  on a published table), and every column the declaration names exists;
- no declared table left the publication and came back since the lake last matched the source (its changes in
  between were never decoded; pipelines.source.membership says how that is seen);
- the connector is Debezium's PostgreSQL connector, its config names the section's database, publication,
  slot and signal table and captures each declared table, and it and its tasks are RUNNING.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal, get_args

from pipelines.lake.declaration import Declaration, TableDecl, missing_columns
from pipelines.runtime.config import Config, ConnectSettings, SourceSettings
from pipelines.source.catalog import (
    DEBEZIUM_POSTGRES,
    ConnectorFacts,
    Publication,
    SourceFacts,
    SourceTable,
    captured_by,
    read_connector,
    read_source,
)
from pipelines.source.connect_rest import ConnectClient

Severity = Literal["error", "warning"]
SYNC = "`lakehouse source sync`"
# Below this, max_slot_wal_keep_size invalidates the slot of a connector stopped for a routine restart or
# a deploy on a busy database.
SMALL_WAL_KEEP_MB = 1024
# Every check a finding can come from: the source-check metric pushes each (0 when it passed), so that a finding
# that is fixed stops its alert.
CHECKS = ("wal_level", "max_slot_wal_keep_size", "slot", "connect", "connector", "connector_state",
          "table.include.list", "publication", "publish_via_partition_root", "partition", "signal_table", "exists",
          "primary_key", "columns", "typed", "replica_identity", "publication_gap")
# What the connector's config must say, and from which setting of [source].
CONNECTOR_KEYS = {"database.dbname": "database", "publication.name": "publication", "slot.name": "slot",
                  "signal.data.collection": "signal_table"}


@dataclass(frozen=True)
class Finding:
    """One reason changes would not reach the lake, with how to fix it; `table` is the declared table's lake name
    (None: the whole source)."""

    table: str | None
    check: str
    problem: str
    fix: str
    severity: Severity = "error"
    fixable: bool = False  # `lakehouse source sync` fixes it
    declaration: bool = False  # the declaration disagrees with the database: the sync refuses to start

    def __post_init__(self) -> None:
        if self.check not in CHECKS:
            raise ValueError(f"unknown check {self.check!r}: add it to CHECKS (its metric series)")

    def line(self) -> str:
        return f"{self.severity}: {self.problem}; fix: {self.fix}"

    def document(self) -> dict[str, object]:
        doc = asdict(self)
        return {k: doc[k] for k in ("table", "check", "problem", "fix", "severity", "fixable")}


@dataclass(frozen=True)
class Target:
    """The source as the configuration names it: the database (`[source]`) and the Connect cluster and connector
    (`[connect]`). `schemas_enable`: whether the connector's values carry their Connect schema (None: read from
    the connector's config when it says, else not checked)."""

    source: SourceSettings
    connect: ConnectSettings
    schemas_enable: bool | None = None

    @classmethod
    def of(cls, config: Config) -> Target:
        """The configuration's endpoints, an Airflow Connection's read now."""
        return cls(config.source.endpoint(), config.connect.endpoint())

    def client(self) -> ConnectClient:
        return ConnectClient.from_settings(self.connect)


def errors(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == "error"]


def counts(findings: list[Finding]) -> dict[tuple[str, Severity], int]:
    """How many findings each check has, per severity, every check and severity present (0 when none)."""
    out: dict[tuple[str, Severity], int] = {(c, s): 0 for c in CHECKS for s in get_args(Severity)}
    for f in findings:
        out[(f.check, f.severity)] += 1
    return out


# --------------------------------------------------------------------------- the declaration against the catalog

def table_findings(name: str, t: TableDecl, found: SourceTable | None, where: str,
                   schemas_enable: bool | None = None) -> list[Finding]:
    """How one declared table disagrees with the catalog: existence, key, columns, typed values."""
    at = f"{where}: tables.{name}"
    if found is None:
        return [Finding(name, "exists", f"{at}.source: table {t.source} does not exist in the source database",
                        f"create it, or correct tables.{name}.source (schema.table, as PostgreSQL spells it)",
                        declaration=True)]
    out = []
    if t.key != found.primary_key:
        actual = f"({', '.join(found.primary_key)})" if found.primary_key else "none"
        out.append(Finding(name, "primary_key", f"{at}.key: {list(t.key)} is not the primary key of {t.source} "
                           f"(its primary key: {actual}; same columns in the same order)",
                           f"set tables.{name}.key = {list(found.primary_key)}" if found.primary_key else
                           f"give {t.source} a primary key (ALTER TABLE ... ADD PRIMARY KEY ({', '.join(t.key)}))",
                           declaration=True))
    have = set(found.columns)
    named = [f"columns: {c}" for c in t.columns if c not in have] + \
        [m for m in missing_columns(t, have) if not m.startswith("key: ")]
    for m in named:
        field, column = m.split(": ", 1)
        out.append(Finding(name, "columns", f"{at}.{field}: column {column!r} does not exist in {t.source} "
                           f"(its columns: {', '.join(found.columns)})",
                           f"correct tables.{name}.{field}, or add the column to {t.source}", declaration=True))
    if schemas_enable is False and t.typed:
        out.append(Finding(name, "typed", f"{at}.typed: a typed table needs values with their Connect schema, and "
                           "the connector runs with schemas.enable=false",
                           "value.converter.schemas.enable=true on the connector, or `typed = false`",
                           declaration=True))
    return out


def identity_findings(name: str, t: TableDecl, found: SourceTable) -> list[Finding]:
    """The replica identity of the table (and of each partition of a partitioned one)."""
    out = []
    for source, identity in [(t.source, found.replica_identity), *sorted(found.leaves.items())]:
        if identity == "d":
            continue
        fix = f'{SYNC} sets it, or ALTER TABLE {_quoted(source)} REPLICA IDENTITY DEFAULT'
        if identity == "n":
            out.append(Finding(name, "replica_identity", f"{source} has REPLICA IDENTITY NOTHING: PostgreSQL "
                               "refuses its UPDATEs and DELETEs once it is published, and a delete would carry no "
                               "key", fix, fixable=True))
        else:
            kind = "FULL" if identity == "f" else "USING INDEX"
            out.append(Finding(name, "replica_identity", f"{source} has REPLICA IDENTITY {kind}, not the contract's "
                               "DEFAULT (a delete's `before` holds the key alone)", fix, "warning", fixable=True))
    return out


def _quoted(source: str) -> str:
    schema, table = source.split(".", 1)
    return '"{}"."{}"'.format(schema.replace('"', '""'), table.replace('"', '""'))


def declaration_findings(facts: SourceFacts, declaration: Declaration, settings: SourceSettings,
                         schemas_enable: bool | None = None) -> list[Finding]:
    """Every way the declaration disagrees with the database, and each table's replica identity."""
    out = []
    for name, t in declaration.tables.items():
        if t.source == settings.signal_table:
            out.append(Finding(name, "signal_table", f"{declaration.path}: tables.{name}.source: {t.source} is the "
                               "connector's signal table, not a table to capture", f"remove tables.{name}",
                               declaration=True))
            continue
        found = facts.tables.get(t.source)
        out += table_findings(name, t, found, declaration.path, schemas_enable)
        if found is not None:
            out += identity_findings(name, t, found)
    return out


# --------------------------------------------------------------------------- the server, publication and slot

def server_findings(facts: SourceFacts) -> list[Finding]:
    out = []
    if facts.wal_level != "logical":
        out.append(Finding(None, "wal_level", f"wal_level is {facts.wal_level}, not logical: no change is decoded",
                           "set wal_level = logical (on RDS: rds.logical_replication = 1 in the parameter group) "
                           "and restart the server"))
    if facts.max_slot_wal_keep_mb == -1:
        out.append(Finding(None, "max_slot_wal_keep_size", "max_slot_wal_keep_size is -1 (no limit): a slot whose "
                           "connector stops keeps all WAL since, and can fill the server's disk",
                           "set max_slot_wal_keep_size to what the disk can spare, and alert on the slot's lag "
                           "(`lakehouse connector status`)", "warning"))
    elif facts.max_slot_wal_keep_mb < SMALL_WAL_KEEP_MB:
        out.append(Finding(None, "max_slot_wal_keep_size", f"max_slot_wal_keep_size is {facts.max_slot_wal_keep_mb} "
                           "MB: a connector that falls that far behind (a restart, a deploy, a busy hour) has its "
                           "slot invalidated and its changes since lost",
                           f"raise it (at least {SMALL_WAL_KEEP_MB} MB, or what a day of WAL needs)", "warning"))
    return out


def publication_findings(facts: SourceFacts, declaration: Declaration, settings: SourceSettings) -> list[Finding]:
    """The publication exists and publishes each declared table (partitioned ones by their root) and the signal
    table."""
    pub, name = facts.publication, settings.publication
    if pub is None:
        return [Finding(None, "publication", f"publication {name} does not exist",
                        f"{SYNC} creates it with the declared tables", fixable=True)]
    out = []
    wanted = [(n, t.source, facts.tables.get(t.source)) for n, t in declaration.tables.items()]
    for lake_name, source, found in [*wanted, (None, settings.signal_table, None)]:
        if found is not None and found.partitioned and not pub.via_root:
            out.append(Finding(lake_name, "publish_via_partition_root", f"{source} is partitioned and publication "
                               f"{name} publishes its changes as each partition's, which the connector does not "
                               "capture under its name", f"ALTER PUBLICATION {name} SET (publish_via_partition_root "
                               "= true)"))
            continue
        if found is not None and found.partition_of and pub.via_root:
            out.append(Finding(lake_name, "partition", f"{source} is a partition of {found.partition_of}, and "
                               f"publication {name} publishes its changes as {found.partition_of}'s",
                               f"declare {found.partition_of} instead"))
            continue
        if source not in pub.published and (found is not None or lake_name is None):
            out.append(Finding(lake_name, "publication", f"{source} is not in publication {name}: its changes are "
                               "not decoded", f"{SYNC} adds it (ALTER PUBLICATION {name} ADD TABLE ...)",
                               fixable=True))
    if not facts.signal_table:
        out.append(Finding(None, "signal_table", f"the signal table {settings.signal_table} does not exist: no "
                           "incremental snapshot can run", f"{SYNC} creates it", fixable=True))
    return out


def gap_findings(publication: Publication | None, declaration: Declaration, settings: SourceSettings,
                 remembered: dict[str, str]) -> list[Finding]:
    """Each declared table whose publication membership is not the one the lake remembers from a time it matched
    the source: it was dropped from the publication and added back (or the publication made anew)."""
    out = []
    for name, t in declaration.tables.items():
        now = publication.memberships.get(t.source) if publication is not None else None
        then = remembered.get(name)
        if now is None or then is None or now == then:
            continue
        out.append(Finding(name, "publication_gap", f"{t.source} left publication {settings.publication} and was "
                           f"added back since the lake last matched it (membership {then}, now {now}): the changes "
                           "made while it was out were never decoded",
                           f"`lakehouse reconcile --table {name} --heal` re-delivers them, deletes too; the finding "
                           "clears once reconcile finds the table exact"))
    return out


def slot_findings(facts: SourceFacts, settings: SourceSettings) -> list[Finding]:
    slot, name = facts.slot, settings.slot
    if slot is None:
        return [Finding(None, "slot", f"replication slot {name} does not exist: nothing streams",
                        "start the connector (its first start creates the slot), or correct [source] slot")]
    if slot.wal_status == "lost":
        return [Finding(None, "slot", f"replication slot {name} is invalidated (wal_status lost): the WAL it needed "
                        "was removed, the changes since are gone",
                        f"drop the slot (SELECT pg_drop_replication_slot('{name}')) and its connector's offsets, "
                        "restart the connector with a new snapshot, and raise max_slot_wal_keep_size")]
    out = []
    if not slot.active:
        held = f", holding {slot.retained_bytes:,} bytes of WAL" if slot.retained_bytes is not None else ""
        out.append(Finding(None, "slot", f"replication slot {name} has had no consumer for "
                           f"{slot.inactive_seconds or 0:.0f} s or more{held}: the connector is not streaming",
                           "`lakehouse connector ensure` restarts a failed task; check the connector's log"))
    if slot.wal_status == "unreserved":
        out.append(Finding(None, "slot", f"replication slot {name} is about to be invalidated (wal_status "
                           "unreserved: it holds more WAL than max_slot_wal_keep_size allows)",
                           "get the connector streaming now, or raise max_slot_wal_keep_size", "warning"))
    return out


def shared_publication_findings(facts: SourceFacts, connector: ConnectorFacts, settings: SourceSettings
                                ) -> list[Finding]:
    """A publication that names tables the connector does not capture is shared with another tool; Debezium's
    `publication.autocreate.mode=filtered` sets it to the connector's own tables at each start of its task."""
    pub, config = facts.publication, connector.config
    if pub is None or config is None or connector.setting("publication.autocreate.mode") != "filtered":
        return []
    patterns = config.get("table.include.list")
    others = sorted(s for s in pub.members if s != settings.signal_table and not captured_by(patterns, s))
    if not others:
        return []
    return [Finding(None, "publication", f"publication {settings.publication} also publishes {', '.join(others)}, "
                    f"which connector {connector.name} does not capture, and its publication.autocreate.mode=filtered "
                    "sets the publication to its own tables whenever its task starts: those would be removed",
                    "publication.autocreate.mode=disabled on the connector (the sync keeps the publication), or a "
                    "publication of its own", "warning")]


# --------------------------------------------------------------------------- the connector

def connector_findings(found: ConnectorFacts, declaration: Declaration, settings: SourceSettings) -> list[Finding]:
    """The connector's class, its settings against `[source]`, the declared tables it captures, its state."""
    if found.error is not None:
        return [Finding(None, "connect", found.error, "check [connect] url, username/password and ssl_ca_file")]
    if found.config is None:
        return [Finding(None, "connector", f"connector {found.name} does not exist in Kafka Connect at {found.url}",
                        "create Debezium's PostgreSQL connector there (docs/tables.md), or correct [connect] "
                        "connector")]
    config, out = found.config, []
    if config.get("connector.class") != DEBEZIUM_POSTGRES:
        out.append(Finding(None, "connector", f"connector {found.name} is {config.get('connector.class')}, not "
                           f"{DEBEZIUM_POSTGRES}", "point [connect] connector at the Debezium PostgreSQL connector"))
        return out
    for key, setting in CONNECTOR_KEYS.items():
        wanted = getattr(settings, setting)
        if found.setting(key) != wanted:
            out.append(Finding(None, "connector", f"connector {found.name}'s {key} is {found.setting(key)!r}, "
                               f"[source] {setting} is {wanted!r}",
                               f"{SYNC} sets it" if key == "signal.data.collection" else
                               f"make the connector's {key} and [source] {setting} agree",
                               fixable=key == "signal.data.collection"))
    for name, t in declaration.tables.items():
        if not captured_by(config.get("table.include.list"), t.source) or (
                "table.exclude.list" in config and captured_by(config["table.exclude.list"], t.source)):
            out.append(Finding(name, "table.include.list", f"connector {found.name} does not capture {t.source} "
                               "(its table.include.list)", f"{SYNC} adds it", fixable=True))
    return out + state_findings(found)


def state_findings(found: ConnectorFacts) -> list[Finding]:
    status = found.status or {}
    state = status.get("connector", {}).get("state", "UNKNOWN")
    tasks = status.get("tasks", [])
    if state == "RUNNING" and tasks and all(t.get("state") == "RUNNING" for t in tasks):
        return []
    listed = ", ".join(f"task {t.get('id')} {t.get('state')}" for t in tasks) or "no task"
    traces = [t.get("trace") for t in [status.get("connector", {}), *tasks] if t.get("trace")]
    why = f" ({traces[0].strip().splitlines()[0][:300]})" if traces else ""
    return [Finding(None, "connector_state", f"connector {found.name} is {state}, {listed}{why}",
                    "`lakehouse connector ensure` restarts what failed; fix what its trace names first")]


# --------------------------------------------------------------------------- the whole

def findings(facts: SourceFacts, connector: ConnectorFacts, declaration: Declaration, target: Target
             ) -> list[Finding]:
    """Every finding of the facts, source-wide first, then the tables' in the declaration's order."""
    settings = target.source
    schemas = target.schemas_enable
    if schemas is None and connector.config and "value.converter.schemas.enable" in connector.config:
        schemas = connector.config["value.converter.schemas.enable"].lower() == "true"
    found = [*server_findings(facts), *slot_findings(facts, settings),
             *connector_findings(connector, declaration, settings),
             *publication_findings(facts, declaration, settings),
             *shared_publication_findings(facts, connector, settings),
             *declaration_findings(facts, declaration, settings, schemas)]
    order = {name: i for i, name in enumerate(declaration.tables)}
    return sorted(found, key=lambda f: -1 if f.table is None else order.get(f.table, len(order)))


def run_check(target: Target, declaration: Declaration, tables: tuple[str, ...] = (), *, slot_grace: float = 5.0,
              root: str | None = None) -> list[Finding]:
    """Read the database and Connect, and judge them; `tables` (lake names) keeps only those tables' findings
    besides the source-wide ones. With the lake's `root`, also each table that left the publication and came
    back (`gap_findings`), and the membership of each published table the lake knew nothing of is remembered.
    SourceUnavailable when the database cannot be reached."""
    from pipelines.source import membership, postgres

    with postgres.connect(target.source) as conn:
        facts = read_source(conn, target.source, declaration, slot_grace)
    connector = read_connector(target.client(), target.connect.connector)
    found = findings(facts, connector, declaration, target)
    if root is not None:
        known = membership.remembered(root)
        found += gap_findings(facts.publication, declaration, target.source, known)
        now = facts.publication.memberships if facts.publication is not None else {}
        membership.remember(root, {n: now[t.source] for n, t in declaration.tables.items()
                                   if n not in known and t.source in now})
    return [f for f in found if not tables or f.table is None or f.table in tables]
