"""The generator's workload as real SQL on the `shop` database, for Debezium to capture.

`ShopSource` plays database and connector at once and emits what it believes Debezium would.
Against the real source (dev/lakehouse_dev/pg_source.py) the database and the connector are real, so of
the generator's records only the *changes* are played, each as its own transaction, in order:
an insert as INSERT, an update as UPDATE of the whole row image, a delete as DELETE, a truncate
as TRUNCATE. What the connector makes by itself is not played: tombstones (Debezium follows each
delete with one), replays (a restart of Connect re-delivers for real) and malformed records (no
database change produces one). Logical messages are left out too: they go to Debezium's own
`shop.message` topic, never to a table's topic.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError

from lakehouse_dev.generator.kafka import Brokers, client_options, where
from lakehouse_dev.generator.values import Message
from pipelines.lake.contract import PRIMARY_KEY, TABLES, table_of_topic, topic
from pipelines.runtime.settings import unavailable_placeholder

if TYPE_CHECKING:
    from psycopg import Connection

# Types of the contract whose values a column may not hold as the generator spells them.
_CHAR_WIDTH = {("customers", "country"): 2, ("orders", "currency"): 3}


@dataclass(frozen=True)
class Statement:
    """One change as SQL: the table, what the generator did (c u d t) and the statement with its parameters."""

    table: str
    op: str
    sql: str
    params: tuple[Any, ...] = ()
    key: int | None = None  # the row it changes; None for a truncate
    # The same change safe to run again after a commit whose outcome is unknown (PlayAtRate): an
    # insert becomes an upsert of the same image; an update or delete already is (whole row image).
    again: str = ""

    @property
    def records(self) -> int:
        """The Kafka records Debezium makes of it: a delete's event and its tombstone (tombstones.on.delete)."""
        return 2 if self.op == "d" else 1


@dataclass
class SqlRun:
    """What a run played and skipped, and where its last change is in the WAL (to wait for Debezium)."""

    stats: Counter[str] = field(default_factory=Counter)
    last_table: str | None = None
    last_lsn: int | None = None  # the WAL insert position just before the last change: its event's LSN is at least this


def _fit(table: str, column: str, value: Any) -> Any:
    """A value for char(n) columns: the generator's padded spellings (" De") may be longer than
    the column; PostgreSQL would reject them, so surrounding blanks go, as far as needed to fit."""
    width = _CHAR_WIDTH.get((table, column))
    if width is None or not isinstance(value, str) or len(value) <= width:
        return value
    return value.strip()


def statements(messages: Iterable[Message]) -> Iterator[Statement]:
    """The database changes among the generator's records, as SQL, in order.

    Replays are told apart by their LSN: the generator's LSNs grow with every commit, so a record
    at or below the newest one played is a re-delivery (snapshot records share one LSN). The
    generator replays only after a change of the same run, so a run's first record is never one.
    """
    newest = -1
    for message in messages:
        if message.value is None:
            continue  # a tombstone: Debezium sends its own after each delete
        try:
            doc = json.loads(message.value)
        except ValueError:
            continue  # malformed on purpose: no database change makes one
        envelope = _envelope_of(doc)
        if not isinstance(envelope, dict) or not isinstance(envelope.get("source"), dict):
            continue
        op, lsn = envelope.get("op"), envelope["source"].get("lsn")
        if op not in ("r", "c", "u", "d", "t") or not isinstance(lsn, int):
            continue
        if lsn < newest or (lsn == newest and op != "r"):
            continue  # a replay
        image = envelope.get("before") if op == "d" else envelope.get("after")
        if op != "t" and not (isinstance(image, dict) and isinstance(image.get(PRIMARY_KEY), int)):
            continue  # an envelope-shaped malformed record
        newest = lsn
        table = table_of_topic(message.topic)
        yield _statement(table, op, image)


def _statement(table: str, op: str, image: dict[str, Any] | None) -> Statement:
    """The change as SQL, over the columns its image carries (the table's shape when it was made:
    `ShopSource.alter`); an update leaves alone the columns that carry Debezium's placeholder for an
    unchanged TOASTed value."""
    if op == "t":
        return Statement(table, op, f"TRUNCATE {table}")
    assert image is not None
    if op == "d":
        return Statement(table, op, f"DELETE FROM {table} WHERE {PRIMARY_KEY} = %s", (image[PRIMARY_KEY],),
                         image[PRIMARY_KEY])
    placeholder = unavailable_placeholder()
    columns = [c for c in image if op in ("r", "c") or image[c] != placeholder]
    values = tuple(_fit(table, c, image[c]) for c in columns)
    if op in ("r", "c"):
        placeholders = ", ".join(["%s"] * len(columns))
        insert = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({placeholders})"
        update = ", ".join(f"{c} = EXCLUDED.{c}" for c in columns if c != PRIMARY_KEY)
        return Statement(table, "c", insert, values, image[PRIMARY_KEY],
                         again=f"{insert} ON CONFLICT ({PRIMARY_KEY}) DO UPDATE SET {update}")
    assignments = ", ".join(f"{c} = %s" for c in columns if c != PRIMARY_KEY)
    return Statement(table, op, f"UPDATE {table} SET {assignments} WHERE {PRIMARY_KEY} = %s",
                     (*(v for c, v in zip(columns, values, strict=True) if c != PRIMARY_KEY), image[PRIMARY_KEY]),
                     image[PRIMARY_KEY])


def ddl(statement: str, dsn: str) -> None:
    """Run a shape change of the source (`ShopSource.alter`'s DDL) on the database, with Debezium capturing."""
    import psycopg

    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(statement)
    except psycopg.Error as exc:
        raise RuntimeError(f"the SQL sink failed on {dsn}: {statement}: {exc}") from exc


def apply(messages: Iterable[Message], dsn: str) -> SqlRun:
    """Play the changes among `messages` on the database at `dsn`, one transaction per change.

    Each statement must touch exactly the rows the generator's change names (one; a truncate any):
    a database that drifted from the simulation stops the run with the statement that did not fit.
    """
    import psycopg

    run = SqlRun()
    batch = list(statements(messages))
    try:
        with psycopg.connect(dsn, autocommit=False) as conn:
            conn.execute("SET TIME ZONE 'UTC'")
            conn.commit()
            for i, statement in enumerate(batch):
                if i == len(batch) - 1:
                    run.last_table = statement.table
                    run.last_lsn = _wal_insert_lsn(conn)
                cursor = conn.execute(statement.sql, statement.params)
                if statement.op != "t" and cursor.rowcount != 1:
                    raise RuntimeError(f"{statement.op} of {statement.table} id {statement.key} changed "
                                       f"{cursor.rowcount} rows, not 1: the database is not the generator's "
                                       "(a state file of another database?)")
                conn.commit()
                run.stats[statement.op] += 1
    except psycopg.Error as exc:
        raise RuntimeError(f"the SQL sink failed on {dsn}: {exc}") from exc
    return run


def play(messages: Iterable[Message], dsn: str, bootstrap: Brokers) -> SqlRun:
    """Play the changes on the database at `dsn` (:func:`apply`), then wait until Debezium delivered the
    last of them to Kafka at `bootstrap`: whoever reads the topics next finds every change there."""
    since = end_offsets(bootstrap, [topic(table) for table in TABLES])
    run = apply(messages, dsn)
    if run.last_table is not None and run.last_lsn is not None:
        wait_published(bootstrap, run.last_table, run.last_lsn, since)
    return run


def mark(dsn: str, bootstrap: Brokers, table: str = "customers") -> None:
    """Touch one row of `table` (its `updated_at` set to itself) and wait until Debezium delivered that change:
    it delivers in commit order, so then every change committed before the call is on Kafka too. Touches no
    row the generator's simulation would know changed (values stay), unlike playing more of its changes."""
    import psycopg

    since = end_offsets(bootstrap, [topic(table)])
    with psycopg.connect(dsn, autocommit=True) as conn:
        lsn = _wal_insert_lsn(conn)
        done = conn.execute(f"UPDATE {table} SET updated_at = updated_at WHERE {PRIMARY_KEY} = "
                            f"(SELECT min({PRIMARY_KEY}) FROM {table})")
        if done.rowcount != 1:
            raise RuntimeError(f"no row in {table} to mark the end of the changes with")
    wait_published(bootstrap, table, lsn, since)


def _wal_insert_lsn(conn: Any) -> int:
    row = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint").fetchone()
    return int(row[0])


def end_offsets(bootstrap: Brokers, topics: Iterable[str]) -> dict[TopicPartition, int]:
    """Where each partition of `topics` ends now (missing topics: nothing), to wait from there."""
    try:
        consumer = KafkaConsumer(**client_options(bootstrap), enable_auto_commit=False)
    except KafkaError as exc:
        raise RuntimeError(f"cannot reach Kafka at {where(bootstrap)}: {exc}") from exc
    try:
        parts = [TopicPartition(t, p) for t in topics for p in consumer.partitions_for_topic(t) or ()]
        return consumer.end_offsets(parts) if parts else {}
    finally:
        consumer.close()


def wait_published(bootstrap: Brokers, table: str, lsn: int, since: dict[TopicPartition, int],
                   timeout: float = 300.0) -> None:
    """Wait until Debezium delivered an event of `table` at or after WAL position `lsn` to Kafka.

    `since` (from :func:`end_offsets` before the changes) spares reading the topic from its start.
    """
    name = topic(table)
    consumer = KafkaConsumer(**client_options(bootstrap), enable_auto_commit=False, consumer_timeout_ms=1000)
    deadline = time.monotonic() + timeout
    try:
        while True:
            parts = [TopicPartition(name, p) for p in consumer.partitions_for_topic(name) or ()]
            if parts:
                break
            if time.monotonic() >= deadline:
                raise TimeoutError(f"topic {name} never appeared on {where(bootstrap)}: is the connector running?")
            time.sleep(0.5)
        consumer.assign(parts)
        for part in parts:
            consumer.seek(part, since.get(part, 0))
        while time.monotonic() < deadline:
            for record in consumer:
                if record.value is not None and _lsn_of(record.value) >= lsn:
                    return
        raise TimeoutError(f"Debezium did not deliver the change at WAL position {lsn} to {name} in "
                           f"{timeout:.0f} s: is the connector running (`lakehouse dev source status`)?")
    finally:
        consumer.close()


def _lsn_of(value: bytes) -> int:
    return int(_envelope_of(json.loads(value)).get("source", {}).get("lsn") or -1)


def _envelope_of(doc: Any) -> Any:
    """The Debezium envelope of a record's value, under either converter setting (`schemas.enable`)."""
    return doc.get("payload", doc) if isinstance(doc, dict) and "schema" in doc else doc


class PlayAtRate:
    """The generator's changes played as SQL at a steady rate, through outages of the database.

    What an application in front of the source does during `lakehouse dev bench soak`: it writes on
    while Kafka or the stream fail, and when PostgreSQL itself restarts it reconnects and goes on.
    The rate is of Debezium's records (`Statement.records`: a delete makes two), as `bench freshness`
    counts Kafka records. Changes are committed a few at a time (those due by the rate, at most
    `per_transaction`), each statement checked as `apply` checks it. A transaction whose commit was
    cut by the database going away may or may not have committed: it is run again in its idempotent
    form (`Statement.again`, no row counts checked), so the database ends as the generator's state
    either way. After an outage the rate starts afresh: writes that could not be made are not made
    up for in a burst.

    `changes()` gives the next chunk of the generator's records (called when the last is used up);
    `run` plays until `stop` is set (on a thread of its own).
    """

    def __init__(self, dsn: str, rate: float, changes: Callable[[], list[Message]], per_transaction: int = 100,
                 retry_seconds: float = 0.5) -> None:
        self.dsn, self.rate, self.changes = dsn, rate, changes
        self.per_transaction, self.retry_seconds = per_transaction, retry_seconds
        self.stop = threading.Event()
        self.played = 0  # changes
        self.records = 0  # Debezium's records of them
        self.transactions = 0
        self.outages: list[tuple[float, float]] = []  # (from, to) epoch seconds without the database
        self.last: tuple[str, int] | None = None  # (table, WAL position before it) of the last transaction

    def run(self) -> None:
        from psycopg import InterfaceError, OperationalError

        pending: deque[Statement] = deque()
        conn = None
        started, base = time.monotonic(), 0
        try:
            while not self.stop.is_set():
                if not pending:
                    pending.extend(statements(self.changes()))
                    continue
                due = int((time.monotonic() - started) * self.rate) - (self.records - base)
                if due <= 0:
                    time.sleep(0.01)
                    continue
                batch: list[Statement] = []
                while pending and due > 0 and len(batch) < self.per_transaction:
                    batch.append(pending.popleft())
                    due -= batch[-1].records
                records = sum(s.records for s in batch)
                try:
                    conn = conn or self._connect()
                    self._commit(conn, batch, again=False)
                except (OperationalError, InterfaceError):
                    conn = self._reconnect_and_commit(conn, batch)
                    started, base = time.monotonic(), self.records + records
                self.played += len(batch)
                self.records += records
                self.transactions += 1
        finally:
            if conn is not None:
                conn.close()

    def _connect(self) -> Connection:
        import psycopg

        conn = psycopg.connect(self.dsn, autocommit=False, connect_timeout=5)
        conn.execute("SET TIME ZONE 'UTC'")
        conn.commit()
        return conn

    def _commit(self, conn: Connection, batch: list[Statement], again: bool) -> None:
        lsn = _wal_insert_lsn(conn)
        for statement in batch:
            cursor = conn.execute(statement.again if again and statement.again else statement.sql, statement.params)
            if not again and statement.op != "t" and cursor.rowcount != 1:
                raise RuntimeError(f"{statement.op} of {statement.table} id {statement.key} changed {cursor.rowcount} "
                                   "rows, not 1: the database is not the generator's")
        conn.commit()
        self.last = (batch[-1].table, lsn)

    def _reconnect_and_commit(self, conn: Connection | None, batch: list[Statement]) -> Connection:
        """The database went away: reconnect until it answers, then commit `batch` again, idempotently."""
        from psycopg import InterfaceError, OperationalError

        began = time.time()
        if conn is not None:
            with suppress(Exception):
                conn.close()
        while True:
            if self.stop.is_set() and time.time() - began > 300:
                raise RuntimeError(f"the database at {self.dsn} did not come back in 300 s")
            try:
                conn = self._connect()
                self._commit(conn, batch, again=True)
                self.outages.append((began, time.time()))
                return conn
            except (OperationalError, InterfaceError):
                with suppress(Exception):
                    conn.close()  # type: ignore[union-attr]
                time.sleep(self.retry_seconds)
