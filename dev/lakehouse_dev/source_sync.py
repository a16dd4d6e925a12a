"""The real source follows the declaration (contract section 7): `lakehouse dev source start` and `lakehouse
dev source sync` make PostgreSQL's publication and the Debezium connector capture exactly the declared tables.

What a sync does, in this order:
1. Checks the declaration against PostgreSQL's catalog, before changing anything: every declared
   table exists, its `key` is the table's primary key (same columns, same order), and every column
   the declaration names (`columns`, key, subject, pii, clean, rules, derive) exists. A typed table
   (section 7's types) needs the source's `schemas.enable=true`. Any mismatch: `DeclarationMismatch`,
   one line per problem naming the declaration file, the table and the field; nothing changed.
2. The signal table exists, and every declared table has `REPLICA IDENTITY DEFAULT` (the contract's:
   a delete's `before` holds the key; a table with a primary key needs nothing more).
3. The connector's config (Connect REST `PUT /connectors/<name>/config`) names the declared tables in
   `table.include.list`; a changed config restarts its task, which resumes from its committed
   offset (Connect commits it when it stops the old task): changes of tables already captured go
   on, none lost. The sync waits until the new task streams (the replication slot active again,
   under a new walsender). Connect standalone keeps a PUT in memory only: the next launch reads
   `connector.json`, which `source start` writes from the declaration.
4. The publication holds exactly the declared tables plus the signal table (`ALTER PUBLICATION ...
   SET TABLE`). Debezium's `publication.autocreate.mode=filtered` sets the same list itself when its
   task starts; the sync does not rely on it.
5. Tables that were not captured before (not in the publication) get their existing rows through
   Debezium's incremental snapshot: one `execute-snapshot` row in the signal table, read by the
   connector from the change stream. The snapshot runs in chunks while the stream goes on, and
   re-snapshots no other table; it may still be running when the sync returns.

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
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lakehouse_dev.connect_config import CONNECTOR, PUBLICATION, SIGNAL_DDL, SIGNAL_TABLE, SLOT
from pipelines.lake.declaration import Declaration, missing_columns


class SyncError(RuntimeError):
    """The source could not be made to follow the declaration; the message says which step and why."""


class DeclarationMismatch(SyncError):
    """The declaration does not match the source database; one line per problem, nothing was changed."""


@dataclass(frozen=True)
class SourceTable:
    """What PostgreSQL's catalog says of one table."""

    columns: tuple[str, ...]
    primary_key: tuple[str, ...]
    replica_identity: str  # pg_class.relreplident: d(efault), n(othing), f(ull), i(ndex)


@dataclass
class SyncReport:
    """What a sync changed (empty lists and False: nothing)."""

    added: list[str] = field(default_factory=list)  # schema.table newly captured
    removed: list[str] = field(default_factory=list)  # schema.table no longer captured
    snapshot: list[str] = field(default_factory=list)  # tables whose rows an incremental snapshot delivers
    signal_id: str | None = None
    connector_updated: bool = False
    publication_updated: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.connector_updated or self.publication_updated or self.snapshot or self.notes)

    def lines(self) -> list[str]:
        out = list(self.notes)
        if self.added:
            out.append(f"captured from now on: {', '.join(self.added)}")
        if self.removed:
            out.append(f"no longer captured: {', '.join(self.removed)}")
        if self.connector_updated:
            out.append(f"connector {CONNECTOR}: config updated, its task restarted and streaming")
        if self.publication_updated:
            out.append(f"publication {PUBLICATION}: set to the declared tables and {SIGNAL_TABLE}")
        if self.snapshot:
            out.append(f"incremental snapshot requested for {', '.join(self.snapshot)} "
                       f"(signal {self.signal_id} in {SIGNAL_TABLE}); it runs while the stream goes on")
        return out or ["nothing to change: the source captures exactly the declared tables"]


# --------------------------------------------------------------------------- PostgreSQL's side

def _quoted(source: str) -> str:
    schema, table = source.split(".", 1)
    return f'"{schema}"."{table}"'


def read_table(conn: Any, schema: str, table: str) -> SourceTable | None:
    """The table's columns (in order), primary key (in the key's order) and replica identity; None if absent."""
    row = conn.execute(
        "SELECT c.oid, c.relreplident FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = %s AND c.relkind IN ('r', 'p')", (schema, table)).fetchone()
    if row is None:
        return None
    oid, identity = row
    columns = [r[0] for r in conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        (oid,)).fetchall()]
    key = [r[0] for r in conn.execute(
        "SELECT a.attname FROM pg_index i CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n) "
        "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
        "WHERE i.indrelid = %s AND i.indisprimary ORDER BY k.n", (oid,)).fetchall()]
    return SourceTable(tuple(columns), tuple(key), identity if isinstance(identity, str) else identity.decode())


def mismatches(conn: Any, declaration: Declaration, *, schemas_enable: bool | None = None) -> list[str]:
    """Every way the declaration disagrees with the source database, one message each."""
    problems = []
    for name, t in declaration.tables.items():
        at = f"{declaration.path}: tables.{name}"
        if t.source == SIGNAL_TABLE:
            problems.append(f"{at}.source: {t.source} is the connector's signal table, not a table to capture")
            continue
        found = read_table(conn, t.schema, t.table)
        if found is None:
            problems.append(f"{at}.source: table {t.source} does not exist in the source database")
            continue
        if t.key != found.primary_key:
            actual = f"({', '.join(found.primary_key)})" if found.primary_key else "none"
            problems.append(f"{at}.key: {list(t.key)} is not the primary key of {t.source} (its primary key: "
                            f"{actual}; same columns in the same order)")
        have = set(found.columns)
        named = [f"columns: {c}" for c in t.columns if c not in have] + \
            [m for m in missing_columns(t, have) if not m.startswith("key: ")]
        for m in named:
            where, column = m.split(": ", 1)
            problems.append(f"{at}.{where}: column {column!r} does not exist in {t.source} "
                            f"(its columns: {', '.join(found.columns)})")
        if schemas_enable is False and t.typed:
            problems.append(f"{at}.typed: a typed table needs values with their Connect schema, and the source runs "
                            "with schemas.enable=false (`lakehouse dev source start --schemas`, or `typed = false`)")
    return problems


def check(conn: Any, declaration: Declaration, *, schemas_enable: bool | None = None) -> None:
    """DeclarationMismatch naming every problem, before anything is changed."""
    problems = mismatches(conn, declaration, schemas_enable=schemas_enable)
    if problems:
        raise DeclarationMismatch("the declaration does not match the source database; nothing was changed:\n"
                                  + "\n".join(problems))


def prepare(conn: Any, declaration: Declaration) -> list[str]:
    """The signal table, and REPLICA IDENTITY DEFAULT on the declared tables; what was changed, as notes."""
    notes = []
    conn.execute(SIGNAL_DDL)
    for t in declaration.tables.values():
        found = read_table(conn, t.schema, t.table)
        if found is not None and found.replica_identity != "d":
            conn.execute(f"ALTER TABLE {_quoted(t.source)} REPLICA IDENTITY DEFAULT")
            notes.append(f"{t.source}: replica identity set to DEFAULT (was {found.replica_identity!r}; "
                         "contract section 1)")
    return notes


def published(conn: Any) -> set[str] | None:
    """The publication's tables as `schema.table` (the signal table left out); None if there is no publication."""
    if conn.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", (PUBLICATION,)).fetchone() is None:
        return None
    rows = conn.execute("SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s",
                        (PUBLICATION,)).fetchall()
    return {f"{s}.{t}" for s, t in rows} - {SIGNAL_TABLE}


def set_publication(conn: Any, tables: Iterable[str]) -> bool:
    """The publication holds exactly `tables` and the signal table; whether it had to change."""
    wanted = sorted(set(tables))
    current = published(conn)
    with_signal = conn.execute("SELECT 1 FROM pg_publication_tables WHERE pubname = %s AND schemaname || '.' || "
                               "tablename = %s", (PUBLICATION, SIGNAL_TABLE)).fetchone() is not None
    listed = ", ".join(_quoted(s) for s in [*wanted, SIGNAL_TABLE])
    if current is None:
        conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {listed}")
        return True
    if current == set(wanted) and with_signal:
        return False
    conn.execute(f"ALTER PUBLICATION {PUBLICATION} SET TABLE {listed}")
    return True


def request_snapshot(conn: Any, tables: Iterable[str]) -> str:
    """Ask the connector for an incremental snapshot of `tables` (schema.table): the signal's id."""
    signal_id = f"sync-{uuid.uuid4().hex}"  # id is varchar(42)
    data = json.dumps({"data-collections": [_anchored(t) for t in tables], "type": "incremental"})
    schema, table = SIGNAL_TABLE.split(".")
    conn.execute(f'INSERT INTO "{schema}"."{table}" (id, type, data) VALUES (%s, %s, %s)',
                 (signal_id, "execute-snapshot", data))
    return signal_id


def _anchored(source: str) -> str:
    """A signal's `data-collections` entries are regular expressions: dots (and `$`) escaped."""
    return source.replace(".", r"\.").replace("$", r"\$")


def slot_pid(conn: Any) -> int | None:
    """The walsender serving the connector's replication slot (None while no task streams)."""
    row = conn.execute("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (SLOT,)).fetchone()
    return None if row is None else row[0]


# --------------------------------------------------------------------------- Connect's side

def _rest(url: str, method: str = "GET", body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.load(response)
    except urllib.error.HTTPError as exc:
        raise SyncError(f"Kafka Connect {method} {url}: HTTP {exc.code}: {exc.read().decode(errors='replace')[:500]}") \
            from exc
    except (urllib.error.URLError, OSError) as exc:
        raise SyncError(f"Kafka Connect does not answer at {url} ({exc}); is the source up (`lakehouse dev source "
                        "status`)?") from exc


def connector_settings(connect_url: str) -> dict[str, str]:
    """The running connector's config (`GET /connectors/<name>/config`)."""
    return _rest(f"{connect_url}/connectors/{CONNECTOR}/config")


def _streaming(connect_url: str) -> tuple[bool, str]:
    status = _rest(f"{connect_url}/connectors/{CONNECTOR}/status")
    tasks = status.get("tasks", [])
    failed = [t for t in tasks if t.get("state") == "FAILED"]
    if failed:
        raise SyncError(f"connector {CONNECTOR}'s task failed after its config changed: "
                        f"{failed[0].get('trace', '')[:2000]}")
    running = status.get("connector", {}).get("state") == "RUNNING" and bool(tasks) and all(
        t.get("state") == "RUNNING" for t in tasks)
    return running, json.dumps(status)


def update_connector(connect_url: str, config: dict[str, str], connect_conn: Any, *, timeout: float) -> None:
    """PUT the config, then wait until the restarted task streams: RUNNING, and the slot served by a new walsender."""
    before = slot_pid(connect_conn)
    _rest(f"{connect_url}/connectors/{CONNECTOR}/config", "PUT", {k: v for k, v in config.items() if k != "name"})
    deadline = time.monotonic() + timeout
    why = ""
    while time.monotonic() < deadline:
        running, status = _streaming(connect_url)
        pid = slot_pid(connect_conn)
        if running and pid is not None and pid != before and connector_settings(connect_url) == config:
            return
        why = f"status {status}, slot {SLOT} walsender {pid} (before the change: {before})"
        time.sleep(0.5)
    raise SyncError(f"connector {CONNECTOR} not streaming {timeout:.0f} s after its config changed: {why}")


# --------------------------------------------------------------------------- the whole

def apply(conn: Any, connect_url: str, config: dict[str, str], declaration: Declaration,
          before: set[str] | None, *, connector_file: Path | None = None, timeout: float = 120.0) -> SyncReport:
    """Make the running connector and the publication capture the declared tables (steps 3-5 above).

    `before`: the publication's tables before anything changed (None: there was none, the
    connector's initial snapshot reads every table). `config`: the connector's config for the
    declaration (connect_config.connector_config); `connector_file`, if given, is rewritten with it.
    """
    report = SyncReport()
    wanted = [t.source for t in declaration.tables.values()]
    if before is not None:
        report.added = [s for s in wanted if s not in before]
        report.removed = sorted(before - set(wanted))
    if connector_settings(connect_url) != config:
        update_connector(connect_url, config, conn, timeout=timeout)
        report.connector_updated = True
    if connector_file is not None:
        connector_file.write_text(json.dumps(config, indent=2))
    report.publication_updated = set_publication(conn, wanted)
    if report.added:
        report.snapshot = list(report.added)
        report.signal_id = request_snapshot(conn, report.added)
    return report
