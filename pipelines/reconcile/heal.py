"""`lakehouse reconcile --heal`: what drifted re-delivered through the pipeline's own paths, never by editing files.

- A key the lake lacks or holds with other values: the source delivers its row again, through Debezium's
  incremental snapshot of just those keys: `execute-snapshot` signals with `additional-conditions` filters, as
  many as the keys need (the signal table's `data` column holds 2,048 characters in Debezium's layout, a few
  hundred keys), which the connector queues and reads one after another; of the whole table only when the keys
  would need more than MAX_SIGNALS signals. A snapshot read is ordered at the stream position its chunk was read at
  (pipelines.ingest.parse), past every change of the row it reflects, so the stream applies it by its usual rules;
  the erasure registry drops an erased customer's rows as it drops any of their events.
- A key the lake holds and the source does not: a delete event in Debezium's own form (the topic's value schema,
  `before` holding the key, the source's current WAL position as its LSN) and its tombstone, produced to the
  table's topic, which the stream applies like any delete (the change log records it, silver and gold follow).
  Its LSN is taken before the source is asked once more that it does not hold the key, after a pause longer than
  a commit takes to become visible: a row inserted meanwhile has a later LSN, so it wins over the delete.

Both are applied by the running stream; `wait_healed` then reconciles the healed tables again until none drifts.
A key the lake holds at a position later than the source's (a write behind the pipeline's back that claimed a
future LSN) cannot be healed this way, and stays reported.
"""

from __future__ import annotations

import base64
import json
import struct
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from psycopg import sql

from pipelines.errors import ReconcileError
from pipelines.lake.declaration import TableDecl
from pipelines.reconcile.canonical import SourceColumn, pg_text
from pipelines.reconcile.compare import Options, TableReport, reconcile_table, source_columns
from pipelines.reconcile.digest import filter_frame, key_filter, key_term
from pipelines.runtime.config import KafkaSettings, SourceSettings
from pipelines.runtime.kafka_clients import connect_json, python_options
from pipelines.runtime.lake import Lake
from pipelines.source.catalog import pattern_of, split_name

SIGNAL_DATA_WIDTH = 2048  # Debezium's signal table layout: data varchar(2048); a wider column is read from the table
# Past this many signals of keys, one snapshot of the whole table: each signal costs a chunk query on the key's
# index and a window in the stream, so 100 of them (some 15,000 bigint keys) still read far less than a table of
# millions of rows does, and the connector's offsets, which carry the queue of filters, stay small.
MAX_SIGNALS = 100
# Seconds between the delete's LSN and the last look at the source: a commit whose WAL record precedes that LSN
# is visible long before.
VISIBLE_AFTER = 1.0


@dataclass
class HealAction:
    """What a heal asked for, for one table."""

    table: str
    snapshot: str | None = None  # "keys": of the drifted keys; "table": the whole table; None: nothing to re-read
    snapshot_keys: int = 0
    signal_ids: list[str] = field(default_factory=list)  # the execute-snapshot signals, in the order queued
    deletes: int = 0  # delete events produced for keys only the lake holds
    inserted_meanwhile: int = 0  # lake-only keys the source inserted before the delete was produced
    healed: bool = False
    remaining: dict[str, int] = field(default_factory=dict)

    def document(self) -> dict[str, Any]:
        return asdict(self)


def heal_table(lake: Lake, conn: Any, report: TableReport) -> HealAction:
    """Ask for what `report`'s drift needs: a snapshot of its missing and differing keys, deletes of its extra
    ones."""
    decl = lake.declaration.tables[report.table]
    action = HealAction(report.table)
    key_columns = [c for c in source_columns(conn, decl.source) if c.name in decl.key]
    key_columns.sort(key=lambda c: decl.key.index(c.name))
    redeliver = [*report.keys.get("missing", []), *report.keys.get("differ", [])]
    if redeliver:
        action.snapshot, action.signal_ids = request_snapshot(conn, lake.config.source, decl, key_columns, redeliver)
        action.snapshot_keys = len(redeliver)
    if extra := report.keys.get("extra", []):
        action.deletes, action.inserted_meanwhile = deliver_deletes(lake, conn, decl, key_columns, extra)
    return action


def request_snapshot(conn: Any, settings: SourceSettings, decl: TableDecl, columns: list[SourceColumn],
                     keys: list[dict[str, Any]]) -> tuple[str, list[str]]:
    """`execute-snapshot` signals for `keys` of `decl`'s table, each filter as wide as the signal table's data
    column holds, or one for the whole table past MAX_SIGNALS: the mode ("keys" or "table") and the signals' ids."""
    collection = pattern_of(decl.source)
    texts = key_signals(conn, collection, columns, keys, _signal_width(conn, settings.signal_table))
    mode = "keys"
    if texts is None:
        texts, mode = [json.dumps({"data-collections": [collection], "type": "incremental"})], "table"
    ids = []
    for text in texts:
        ids.append(f"heal-{uuid.uuid4().hex}")  # id is varchar(42)
        conn.execute(sql.SQL("INSERT INTO {} (id, type, data) VALUES (%s, %s, %s)").format(
            sql.Identifier(*split_name(settings.signal_table))), (ids[-1], "execute-snapshot", text))
    return mode, ids


def key_signals(conn: Any, collection: str, columns: list[SourceColumn], keys: list[dict[str, Any]],
                width: int) -> list[str] | None:
    """The data of the signals that together re-read `keys`, each at most `width` characters; None when that
    takes more than MAX_SIGNALS. Each key's term is rendered once and measured as JSON escapes it, so packing
    thousands of keys costs no more than rendering them."""
    def data(filter_text: str) -> str:
        return json.dumps({"data-collections": [collection], "type": "incremental",
                           "additional-conditions": [{"data-collection": collection, "filter": filter_text}]})

    frame_head, sep, tail = filter_frame(columns)
    head = frame_head.as_string(conn)
    terms = [key_term(columns, k).as_string(conn) for k in keys]
    size = [len(json.dumps(t)) - 2 for t in terms]  # a term's length inside the JSON string
    frame, gap = len(data(head + tail)), len(json.dumps(sep)) - 2
    texts: list[str] = []
    start = 0
    while start < len(terms):
        if len(texts) == MAX_SIGNALS:
            return None
        end, used = start, frame - gap
        while end < len(terms) and used + gap + size[end] <= width:
            used += gap + size[end]
            end += 1
        if end == start:
            raise ReconcileError(f"the key {keys[start]} of {collection} alone does not fit the signal table's data "
                                 f"column ({width} characters): widen it (ALTER TABLE ... ALTER COLUMN data TYPE text)")
        texts.append(data(head + sep.join(terms[start:end]) + tail))
        start = end
    return texts


def _signal_width(conn: Any, signal_table: str) -> int:
    schema, table = split_name(signal_table)
    row = conn.execute("SELECT character_maximum_length FROM information_schema.columns WHERE table_schema = %s "
                       "AND table_name = %s AND column_name = 'data'", (schema, table)).fetchone()
    if row is None:
        raise ReconcileError(f"the signal table {signal_table} has no data column: run `lakehouse source sync`")
    return int(row[0]) if row[0] is not None else 1 << 30


def deliver_deletes(lake: Lake, conn: Any, decl: TableDecl, columns: list[SourceColumn],
                    keys: list[dict[str, Any]]) -> tuple[int, int]:
    """Delete events for `keys` (in the lake, not in the source) on `decl`'s topic: how many were produced, and how
    many keys were left alone because the source holds them by now."""
    lsn = int(conn.execute("SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::bigint").fetchone()[0])
    time.sleep(VISIBLE_AFTER)
    held = _held_now(conn, decl, columns, keys)
    gone = [k for k in keys if tuple(k[c.name] for c in columns) not in held]
    if not gone:
        return 0, len(keys)
    topic = lake.declaration.topic(decl.name)
    template = newest_record(lake.config.kafka, topic)
    records = [delete_record(template, decl, columns, k, lsn) for k in gone]
    _produce(lake.config.kafka, topic, records)
    return len(gone), len(keys) - len(gone)


def _held_now(conn: Any, decl: TableDecl, columns: list[SourceColumn],
              keys: list[dict[str, Any]]) -> set[tuple[Any, ...]]:
    """The keys among `keys` the source holds now, as tuples of canonical texts."""
    query = sql.SQL("SELECT {} FROM {} WHERE {}").format(
        sql.SQL(", ").join(pg_text(c) for c in columns), sql.Identifier(*split_name(decl.source)),
        key_filter(columns, keys))
    return {tuple(row) for row in conn.execute(query).fetchall()}


def newest_record(kafka: KafkaSettings, topic: str) -> dict[str, Any]:
    """The newest record of `topic` that has a value, parsed: the form (and, wrapped, the schema) a delete copies."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(**python_options(kafka), enable_auto_commit=False, consumer_timeout_ms=5000)
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        if not partitions:
            raise ReconcileError(f"topic {topic} does not exist: no delete can be written to it")
        consumer.assign(partitions)
        ends, starts = consumer.end_offsets(partitions), consumer.beginning_offsets(partitions)
        for tp in partitions:
            consumer.seek(tp, max(starts[tp], ends[tp] - 50))
        newest: tuple[int, dict[str, Any]] | None = None
        for message in consumer:
            if message.value is not None and (newest is None or message.timestamp >= newest[0]):
                newest = (message.timestamp, json.loads(message.value))
            if all(consumer.position(tp) >= ends[tp] for tp in partitions):
                break
    finally:
        consumer.close()
    if newest is None:
        raise ReconcileError(f"topic {topic} holds no record with a value among its newest: its form is unknown, "
                             "so no delete can be written to it")
    return newest[1]


def delete_record(template: dict[str, Any], decl: TableDecl, columns: list[SourceColumn], key: dict[str, Any],
                  lsn: int) -> tuple[bytes, bytes]:
    """A Debezium delete event for `key` at `lsn`, in `template`'s form: (key bytes, value bytes), the key as
    Connect's JsonConverter writes it (compact, schemaless)."""
    wrapped = "schema" in template and "payload" in template
    payload = template["payload"] if wrapped else template
    fields = _before_fields(template) if wrapped else {}
    values = {c.name: wire_value(key[c.name], fields.get(c.name), decl.wire_type(c.name) if not decl.typed else None)
              for c in columns}
    now = int(time.time() * 1000)
    source = dict(payload.get("source") or {}) | {
        "ts_ms": now, "snapshot": "false", "lsn": lsn, "txId": None, "xmin": None,
        "sequence": json.dumps([str(lsn), str(lsn)])}
    before = {name: None for name in fields} | values
    event = {"before": before, "after": None, "source": source, "transaction": None, "op": "d", "ts_ms": now}
    value = {"schema": template["schema"], "payload": event} if wrapped else event
    return connect_json(values), connect_json(value)


def _before_fields(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The wrapped template's row fields by name (the `before` struct of its value schema)."""
    for part in template["schema"].get("fields", []):
        if part.get("field") == "before":
            return {f["field"]: f for f in part.get("fields", [])}
    raise ReconcileError("the topic's value schema has no `before` struct: not a Debezium change event")


def wire_value(text: str | None, schema: dict[str, Any] | None, wire_type: str | None) -> Any:
    """A key column's canonical text (pipelines.reconcile.canonical) in Debezium's JSON form: by the field's Connect
    schema when the topic carries one, else by the declared wire type (`bigint` a number, else text)."""
    if text is None:
        return None
    if schema is None:
        return int(text) if wire_type == "bigint" else text
    kind, name = schema.get("type"), schema.get("name")
    if name in ("io.debezium.time.Date", "io.debezium.time.MicroTimestamp"):
        return int(text)
    if name == "io.debezium.time.Timestamp":
        return int(text) // 1000
    if name == "io.debezium.time.NanoTimestamp":
        return int(text) * 1000
    if name == "io.debezium.time.ZonedTimestamp":
        return datetime.fromtimestamp(int(text) / 1e6, UTC).isoformat().replace("+00:00", "Z")
    if kind in ("int8", "int16", "int32", "int64"):
        return int(text)
    if kind in ("float", "double", "float32", "float64"):
        return struct.unpack(">d", int(text).to_bytes(8, "big", signed=True))[0]
    if kind == "boolean":
        return text == "true"
    if kind == "bytes" and name is None:
        return base64.b64encode(bytes.fromhex(text)).decode()
    if kind == "string":
        return text
    raise ReconcileError(f"a key column of Connect type {kind} ({name}) has no known JSON form: its delete cannot "
                         "be written")


def _produce(kafka: KafkaSettings, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    """Each delete, then its tombstone (as Debezium follows a delete), acknowledged by every in-sync replica."""
    from kafka import KafkaProducer

    producer = KafkaProducer(**python_options(kafka), acks="all")
    try:
        for key, value in records:
            producer.send(topic, key=key, value=value, headers=[("lakehouse.heal", b"reconcile")])
            producer.send(topic, key=key, value=None)
        producer.flush(60)
    finally:
        producer.close()


def wait_healed(lake: Lake, conn: Any, actions: list[HealAction], options: Options, timeout: float,
                poll: float = 5.0) -> list[TableReport]:
    """Reconcile the healed tables again until none drifts or `timeout` passes: their last reports."""
    deadline = time.monotonic() + timeout
    pending = {a.table: a for a in actions}
    reports: dict[str, TableReport] = {}
    while pending:
        for name in list(pending):
            reports[name] = reconcile_table(lake, conn, name, options)
            if not reports[name].drift:
                pending.pop(name).healed = True
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(poll)
    for name, action in pending.items():
        action.remaining = {k: reports[name].counts.get(k, 0) for k in ("missing", "extra", "differ")}
    return list(reports.values())
