"""`lakehouse source sync`: the source follows the declaration (contract section 7), on any PostgreSQL and any Kafka
Connect that `[source]` and `[connect]` name; PostgreSQL's publication and the Debezium connector capture exactly
the declared tables.

What a sync does, in this order:
1. Checks the source (pipelines.source.check) before changing anything: every declared table exists, its
   `key` is the table's primary key (same columns, same order), and every column the declaration names
   (`columns`, key, subject, pii, clean, rules, derive) exists; a typed table (section 7's types) needs the
   connector's `schemas.enable=true`. Any mismatch: `DeclarationMismatch`, one line per problem naming the
   declaration file, the table and the field; nothing changed. An error the sync cannot repair (wal_level,
   the connector's class, database, publication or slot name, its state, the slot) also stops it, named.
2. The signal table exists, and every declared table (each partition of a partitioned one) has `REPLICA
   IDENTITY DEFAULT` (the contract's: a delete's `before` holds the key; a table with a primary key needs
   nothing more).
3. The publication publishes the declared tables and the signal table. It may be shared with other tools
   (another connector, a logical replica), so the sync adds what is missing (`ALTER PUBLICATION ... ADD
   TABLE`) and drops only the tables the connector captured before and the declaration no longer declares
   (`DROP TABLE`), never `SET TABLE`, which would remove every other tool's tables. A missing publication is
   created, with `publish_via_partition_root` when a declared table is partitioned. Debezium's
   `publication.autocreate.mode=filtered` sets the list itself when its task starts (docs/tables.md: what that
   means for a shared publication); the sync does not rely on it. The publication comes before the
   connector: a refusal here (the publication's owner is another role) leaves the connector as it was, so the
   sync run again once that is fixed still finds the new tables uncaptured and snapshots them.
4. The connector's config (Connect REST `PUT /connectors/<name>/config`: the config it has, only the changed
   keys replaced) names the declared tables in `table.include.list` and the signal table in
   `signal.data.collection`; a changed config restarts its task, which resumes from its committed offset
   (Connect commits it when it stops the old task): changes of tables already captured go on, none lost. The
   sync waits until the new task streams (the replication slot active again, under a new walsender).
5. Tables that were not captured before (not in the connector's include list) get their existing rows
   through Debezium's incremental snapshot: one `execute-snapshot` row in the signal table, read by the
   connector from the change stream. The snapshot runs in chunks while the stream goes on, and re-snapshots
   no other table; it may still be running when the sync returns.
6. Checks again, and reports success only when no error remains.

Facts of Debezium 2.7 this relies on (debezium/debezium at v2.7.3.Final):
- `RelationalTableFilters` adds `signal.data.collection` to the table filter whatever
  `table.include.list` says, so the signal table is captured (and in a filtered publication, which
  `PostgresReplicationConnection.determineCapturedTables` builds from that filter) without being
  listed; its rows go to a topic of their own like any captured table's.
- The signal must come through the stream: the connector only acts on an insert into the signal
  table that it decodes from the WAL (`EventDispatcher`, source channel), and an incremental
  snapshot writes its window's open and close watermarks into the signal table and waits to read
  them back from the stream (`incremental.snapshot.watermarking.strategy=insert_insert`). A signal
  table outside the publication leaves the snapshot waiting for ever.
- A table named in an `execute-snapshot` signal must be captured by the task that reads it
  (in its filter): the sync signals only once the restarted task streams.
- Connect standalone keeps a PUT in memory only: its next launch reads its connector file again (the dev
  source rewrites it after a sync).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from pipelines.errors import DeclarationMismatch, SourceSyncError
from pipelines.lake.declaration import Declaration
from pipelines.runtime.config import SourceSettings
from pipelines.source.catalog import (
    ConnectorFacts,
    SourceFacts,
    captured_by,
    include_list,
    pattern_of,
    read_connector,
    read_publication,
    read_source,
    split_name,
)
from pipelines.source.check import Finding, Target, errors, findings
from pipelines.source.connect_rest import ConnectClient


@dataclass
class SyncOptions:
    """How a sync runs. `overrides`: connector keys it also sets (the dev source's whole config);
    `captured_before`: the tables captured before (default: those the connector's include list matches);
    `initial_snapshot`: the connector's own initial snapshot reads every table, no incremental one is needed."""

    timeout: float = 120.0
    overrides: dict[str, str] = field(default_factory=dict)
    captured_before: frozenset[str] | None = None
    initial_snapshot: bool = False
    slot_grace: float = 5.0


@dataclass
class SyncReport:
    """What a sync changed (empty lists and False: nothing), and the warnings that remain."""

    connector: str = ""
    publication: str = ""
    signal_table: str = ""
    added: list[str] = field(default_factory=list)  # schema.table newly captured
    removed: list[str] = field(default_factory=list)  # schema.table no longer captured
    snapshot: list[str] = field(default_factory=list)  # tables whose rows an incremental snapshot delivers
    signal_id: str | None = None
    connector_updated: list[str] = field(default_factory=list)  # the config keys changed
    publication_updated: bool = False
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.connector_updated or self.publication_updated or self.snapshot or self.notes)

    def document(self) -> dict[str, Any]:
        return asdict(self) | {"changed": self.changed}

    def lines(self) -> list[str]:
        out = list(self.notes)
        if self.added:
            out.append(f"captured from now on: {', '.join(self.added)}")
        if self.removed:
            out.append(f"no longer captured: {', '.join(self.removed)}")
        if self.connector_updated:
            out.append(f"connector {self.connector}: {', '.join(self.connector_updated)} updated, its task restarted "
                       "and streaming")
        if self.publication_updated:
            out.append(f"publication {self.publication}: publishes the declared tables and {self.signal_table}")
        if self.snapshot:
            out.append(f"incremental snapshot requested for {', '.join(self.snapshot)} "
                       f"(signal {self.signal_id} in {self.signal_table}); it runs while the stream goes on")
        out = out or ["nothing to change: the source captures exactly the declared tables"]
        return out + [f"warning: {w}" for w in self.warnings]


def _table(source: str) -> Any:
    from psycopg import sql

    return sql.Identifier(*split_name(source))


def refuse(found: list[Finding]) -> None:
    """DeclarationMismatch (or SourceSyncError) naming each error the sync cannot repair; nothing is changed."""
    blocking = [f for f in errors(found) if not f.fixable]
    if not blocking:
        return
    lines = "\n".join(f.line() for f in blocking)
    if any(f.declaration for f in blocking):
        raise DeclarationMismatch(f"the declaration does not match the source database; nothing was changed:\n{lines}")
    raise SourceSyncError(f"the source cannot follow the declaration until these are fixed; nothing was changed:\n"
                          f"{lines}")


def prepare(conn: Any, settings: SourceSettings, declaration: Declaration, facts: SourceFacts) -> list[str]:
    """The signal table, and REPLICA IDENTITY DEFAULT on the declared tables and their partitions; what was
    changed, as notes."""
    from psycopg import sql

    notes = []
    if not facts.signal_table:
        conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (id varchar(42) PRIMARY KEY, type varchar(32) NOT NULL, "
                             "data varchar(2048) NULL)").format(_table(settings.signal_table)))
        notes.append(f"{settings.signal_table}: the signal table created")
    for t in declaration.tables.values():
        found = facts.tables.get(t.source)
        if found is None:
            continue
        for source, identity in [(t.source, found.replica_identity), *found.leaves.items()]:
            if identity != "d":
                conn.execute(sql.SQL("ALTER TABLE {} REPLICA IDENTITY DEFAULT").format(_table(source)))
                notes.append(f"{source}: replica identity set to DEFAULT (was {identity!r}; contract section 1)")
    return notes


def captured_before(connector: ConnectorFacts, facts: SourceFacts, options: SyncOptions,
                    declared: list[str]) -> set[str] | None:
    """The tables the connector captured before the sync, among those it can know of (the declared and the
    published ones); None when its include list names none (it captured every table: nothing is dropped)."""
    if options.captured_before is not None:
        return set(options.captured_before)
    patterns = (connector.config or {}).get("table.include.list")
    if not patterns:
        return None
    known = set(declared) | (set(facts.publication.published | facts.publication.members) if facts.publication
                             else set())
    return {s for s in known if captured_by(patterns, s)}


def slot_pid(conn: Any, slot: str) -> int | None:
    """The walsender serving the replication slot (None while no task streams)."""
    row = conn.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()
    return None if row is None else row[0]


def _streaming(client: ConnectClient, name: str) -> tuple[bool, str]:
    status = client.status(name)
    tasks = status.get("tasks", [])
    if failed := [t for t in tasks if t.get("state") == "FAILED"]:
        raise SourceSyncError(f"connector {name}'s task failed after its config changed: "
                              f"{failed[0].get('trace', '')[:2000]}")
    running = status.get("connector", {}).get("state") == "RUNNING" and bool(tasks) and all(
        t.get("state") == "RUNNING" for t in tasks)
    return running, json.dumps(status)


def update_connector(conn: Any, target: Target, current: dict[str, str], changed: dict[str, str],
                     timeout: float) -> None:
    """PUT the connector's config with `changed` over it, then wait until the restarted task streams: RUNNING,
    and the slot served by a new walsender."""
    client, name, slot = target.client(), target.connect.connector, target.source.slot
    before = slot_pid(conn, slot)
    client.put_config(name, current | changed)
    deadline = time.monotonic() + timeout
    why = ""
    while time.monotonic() < deadline:
        running, status = _streaming(client, name)
        pid = slot_pid(conn, slot)
        config = client.config(name)
        if running and pid is not None and pid != before and all(config.get(k) == v for k, v in changed.items()):
            return
        why = f"status {status}, slot {slot} walsender {pid} (before the change: {before})"
        time.sleep(0.5)
    raise SourceSyncError(f"connector {name} not streaming {timeout:.0f} s after its config changed: {why}")


def update_publication(conn: Any, settings: SourceSettings, facts: SourceFacts, declared: list[str],
                       removed: list[str]) -> bool:
    """Add the declared tables and the signal table to the publication, drop `removed` from it (only tables it
    names itself); create it if there is none. Whether it changed."""
    from psycopg import sql

    name = sql.Identifier(settings.publication)
    wanted = [*declared, settings.signal_table]
    pub = read_publication(conn, settings.publication)  # as it is now: another tool may have changed it
    if pub is None:
        via_root = any(t is not None and t.partitioned for t in facts.tables.values())
        conn.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {}{}").format(
            name, sql.SQL(", ").join(map(_table, wanted)),
            sql.SQL(" WITH (publish_via_partition_root = true)" if via_root else "")))
        return True
    if pub.all_tables:
        return False
    add = [s for s in wanted if s not in pub.members and s not in pub.published]
    drop = [s for s in removed if s in pub.members]
    if add:
        conn.execute(sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(name, sql.SQL(", ").join(map(_table, add))))
    if drop:
        conn.execute(sql.SQL("ALTER PUBLICATION {} DROP TABLE {}").format(name, sql.SQL(", ").join(map(_table, drop))))
    return bool(add or drop)


def request_snapshot(conn: Any, signal_table: str, tables: list[str]) -> str:
    """Ask the connector for an incremental snapshot of `tables` (schema.table): the signal's id. A signal's
    `data-collections` entries are regular expressions: each name escaped."""
    from psycopg import sql

    signal_id = f"sync-{uuid.uuid4().hex}"  # id is varchar(42)
    data = json.dumps({"data-collections": [pattern_of(t) for t in tables], "type": "incremental"})
    conn.execute(sql.SQL("INSERT INTO {} (id, type, data) VALUES (%s, %s, %s)").format(_table(signal_table)),
                 (signal_id, "execute-snapshot", data))
    return signal_id


def _apply(conn: Any, target: Target, declaration: Declaration, options: SyncOptions,
           state: tuple[SourceFacts, ConnectorFacts]) -> SyncReport:
    """Steps 2-5 on a source the check let through, each PostgreSQL refusal naming its step."""
    from pipelines.source.postgres import answering

    facts, connector = state
    settings = target.source
    report = SyncReport(target.connect.connector, settings.publication, settings.signal_table)
    declared = [t.source for t in declaration.tables.values()]
    before = captured_before(connector, facts, options, declared)
    if before is not None:
        report.added = [s for s in declared if s not in before]
        report.removed = sorted(before - set(declared) - {settings.signal_table})
    with answering(settings, "the signal table or a replica identity"):
        report.notes = prepare(conn, settings, declaration, facts)
    with answering(settings, f"a change of publication {settings.publication} (the connector is unchanged)"):
        report.publication_updated = update_publication(conn, settings, facts, declared, report.removed)
    current = dict(connector.config or {})
    wanted = {k: v for k, v in options.overrides.items() if k != "name"} | {
        "table.include.list": include_list(declared), "signal.data.collection": settings.signal_table}
    if changed := {k: v for k, v in wanted.items() if current.get(k) != v}:
        update_connector(conn, target, current, changed, options.timeout)
        report.connector_updated = sorted(changed)
    if report.added and not options.initial_snapshot:
        report.snapshot = list(report.added)
        with answering(settings, f"the snapshot signal in {settings.signal_table}"):
            report.signal_id = request_snapshot(conn, settings.signal_table, report.added)
    return report


def sync(target: Target, declaration: Declaration, options: SyncOptions | None = None) -> SyncReport:
    """Make the connector and the publication capture exactly the declared tables (steps 1-6 above)."""
    from pipelines.source import postgres

    options = options or SyncOptions()
    with postgres.connect(target.source) as conn:
        facts = read_source(conn, target.source, declaration, options.slot_grace)
        connector = read_connector(target.client(), target.connect.connector)
        refuse(findings(facts, connector, declaration, target))
        report = _apply(conn, target, declaration, options, (facts, connector))
        after = findings(read_source(conn, target.source, declaration, options.slot_grace),
                         read_connector(target.client(), target.connect.connector), declaration, target)
    if remaining := errors(after):
        raise SourceSyncError("the sync made its changes (" + "; ".join(report.lines()) + "), yet the source still "
                              "does not capture the declared tables:\n" + "\n".join(f.line() for f in remaining))
    report.warnings = [f.problem for f in after if f.severity == "warning"]
    return report
