"""Debezium envelopes of declared tables (contract section 7) made in Python, with their Connect schema
(`schemas.enable=true`), and the plain-Python model of what the source holds after them.

`declared.py` plays changes as SQL on a real PostgreSQL; this makes the connector's records itself,
so that a test or a benchmark can put any number of declared tables of any shape on Kafka without a
database: the declared-tables tests (tests/declared_tables.py) and `lakehouse dev bench tables`.

Each column is (name, Connect field schema, encode): `encode` turns the model's Python value into the
JSON value Debezium 2.7 puts on the wire. The pipeline's connect_types does the reverse; the two are
written apart so that a mistake in one is not copied into the other.
"""

from __future__ import annotations

import base64
import json
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from functools import cached_property
from typing import Any

from lakehouse_dev.generator.values import Message

EPOCH = datetime(1970, 1, 1)
PREFIX = "dbz"


def _days(d: date) -> int:
    return (d - EPOCH.date()).days


def _micros(ts: datetime) -> int:
    return (ts - EPOCH) // timedelta(microseconds=1)


def _zoned(ts: datetime) -> str:  # an aware datetime -> Debezium's ZonedTimestamp text
    return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


Column = tuple[str, dict[str, Any], Callable[[Any], Any]]


def unchanged(v: Any) -> Any:
    return v


# Section 7's types: the Connect field schema Debezium 2.7 gives each (checked against the connector's own
# output in tests/fixtures/declared when captured), and how a value goes on the wire.
TYPES: dict[str, Column] = {
    "small": ("small", {"type": "int16"}, unchanged),
    "num": ("num", {"type": "int32"}, unchanged),
    "big": ("big", {"type": "int64"}, unchanged),
    "ratio": ("ratio", {"type": "float"}, unchanged),
    "score": ("score", {"type": "double"}, unchanged),
    "flag": ("flag", {"type": "boolean"}, unchanged),
    "price": ("price", {"type": "string", "parameters": {"__debezium.source.column.type": "NUMERIC",
                                                          "__debezium.source.column.length": "12",
                                                          "__debezium.source.column.scale": "2"}}, str),
    "label": ("label", {"type": "string"}, unchanged),
    "mood": ("mood", {"type": "string", "name": "io.debezium.data.Enum", "version": 1,
                      "parameters": {"allowed": "happy,sad"}}, unchanged),
    "born": ("born", {"type": "int32", "name": "io.debezium.time.Date", "version": 1}, _days),
    "seen": ("seen", {"type": "int64", "name": "io.debezium.time.MicroTimestamp", "version": 1}, _micros),
    "paid_at": ("paid_at", {"type": "string", "name": "io.debezium.time.ZonedTimestamp", "version": 1}, _zoned),
    "ref": ("ref", {"type": "string", "name": "io.debezium.data.Uuid", "version": 1}, unchanged),
    "doc": ("doc", {"type": "string", "name": "io.debezium.data.Json", "version": 1}, unchanged),
    "blob": ("blob", {"type": "bytes"}, lambda b: base64.b64encode(b).decode()),
    "tags": ("tags", {"type": "array", "items": {"type": "string", "optional": True}}, unchanged),
    "counts": ("counts", {"type": "array", "items": {"type": "int32", "optional": True}}, unchanged),
}

# --------------------------------------------------------------------------- values across each type's range

EDGE_DATES = [date(1900, 1, 1), date(1969, 12, 31), date(1970, 1, 1), date(2026, 3, 1), date(9999, 12, 31)]
EDGE_TIMES = [datetime(1901, 12, 13, 20, 45, 52, 1), datetime(1969, 12, 31, 23, 59, 59, 999999),
              datetime(2026, 3, 29, 1, 30), datetime(2262, 4, 11, 23, 47, 16, 854775)]
TEXTS = ["plain", "ünïcødé ✓ 日本語", "", "quote \" and \\ backslash", "emoji 🚀", "tab\tnew\nline"]

# A random value of each of TYPES' columns, in the model's Python form (what `encode` takes).
VALUES: dict[str, Callable[[random.Random], Any]] = {
    "small": lambda rng: rng.randint(-32768, 32767),
    "num": lambda rng: rng.randint(-2**31, 2**31 - 1),
    "big": lambda rng: rng.randint(-2**63, 2**63 - 1),
    "ratio": lambda rng: rng.choice([0.5, -1.25, 3.0, 0.375]),  # exact in float32
    "score": lambda rng: rng.choice([0.1, -2.5e300, 1 / 3, 0.0]),
    "flag": lambda rng: rng.random() < 0.5,
    "price": lambda rng: Decimal(rng.randint(-10**11, 10**11)) / 100,
    "label": lambda rng: rng.choice(TEXTS),
    "mood": lambda rng: rng.choice(["happy", "sad"]),
    "born": lambda rng: rng.choice(EDGE_DATES),
    "seen": lambda rng: rng.choice(EDGE_TIMES),
    "paid_at": lambda rng: rng.choice(EDGE_TIMES).replace(tzinfo=UTC),
    "ref": lambda rng: f"{rng.getrandbits(128):032x}",
    "doc": lambda rng: json.dumps({"k": rng.choice(TEXTS), "n": [1, 2.5, None], "deep": {"x": True}}),
    "blob": lambda rng: bytes(rng.choice([0, 1, 255]) for _ in range(rng.randint(0, 12))),
    "tags": lambda rng: [rng.choice([*TEXTS, None]) for _ in range(rng.randint(0, 3))],  # a NULL element too
    "counts": lambda rng: [rng.choice([rng.randint(-5, 5), None]) for _ in range(rng.randint(0, 4))],
}


def maybe(rng: random.Random, value: Any, p: float = 0.15) -> Any:
    """`value`, or NULL with probability `p`: every non-key column is nullable in these tables."""
    return None if rng.random() < p else value


def random_values(rng: random.Random, columns: Iterable[str]) -> dict[str, Any]:
    """A row's values of `columns` (names of TYPES), each NULL now and then."""
    return {c: maybe(rng, VALUES[c](rng)) for c in columns}


# --------------------------------------------------------------------------- tables and the source


@dataclass
class DeclaredTable:
    name: str  # the source table (and the lake's name)
    key: tuple[str, ...]
    columns: list[Column]
    value: Callable[[random.Random, dict[str, Any]], dict[str, Any]]  # a row's non-key values

    @property
    def topic(self) -> str:
        return f"{PREFIX}.public.{self.name}"

    def schema(self) -> dict[str, Any]:
        return json.loads(self.schema_json)

    @cached_property
    def schema_json(self) -> str:
        """The envelope's Connect schema as JSON text: every record carries it (schemas.enable=true), and
        encoding it once, not per record, makes a record about three times faster (a benchmark makes millions)."""
        fields = [{**spec, "optional": c not in self.key, "field": c} for c, spec, _ in self.columns]
        row = {"type": "struct", "fields": fields, "optional": True, "name": f"{PREFIX}.public.{self.name}.Value"}
        schema = {"type": "struct", "name": f"{PREFIX}.public.{self.name}.Envelope", "optional": False, "fields": [
            {**row, "field": "before"}, {**row, "field": "after"},
            {"type": "struct", "field": "source", "optional": False, "fields": [
                {"type": "string", "field": "version"}, {"type": "string", "field": "connector"},
                {"type": "int64", "field": "ts_ms"}, {"type": "string", "field": "table"},
                {"type": "int64", "field": "lsn", "optional": True}]},
            {"type": "string", "field": "op"}, {"type": "int64", "field": "ts_ms", "optional": True}]}
        return json.dumps(schema)

    def wire(self, row: dict[str, Any] | None) -> dict[str, Any] | None:
        if row is None:
            return None
        return {c: None if row.get(c) is None else encode(row[c]) for c, _, encode in self.columns}


@dataclass
class DeclaredSource:
    """The source's tables as the model holds them, and the messages each change puts on the topics."""

    tables: list[DeclaredTable]
    seed: int = 7
    lsn: int = 10_000
    state: dict[str, dict[tuple, dict[str, Any]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.state = {t.name: {} for t in self.tables}

    def _message(self, t: DeclaredTable, op: str, before: dict | None, after: dict | None,
                 lsn: int) -> Message:
        image = after if after is not None else before
        assert image is not None
        key = json.dumps({k: t.wire(image)[k] for k in t.key}, separators=(",", ":")).encode()
        envelope = {"before": t.wire(before), "after": t.wire(after), "op": op, "ts_ms": 1_700_000_000_000,
                    "source": {"version": "2.7.3.Final", "connector": "postgresql", "ts_ms": 1_700_000_000_000,
                               "table": t.name, "lsn": lsn}}
        # json.dumps({"schema": ..., "payload": ...}) to the byte, with the schema's text encoded once
        return Message(t.topic, key, f'{{"schema": {t.schema_json}, "payload": {json.dumps(envelope)}}}'.encode())

    def _tombstone(self, t: DeclaredTable, row: dict[str, Any]) -> Message:
        key = json.dumps({k: t.wire(row)[k] for k in t.key}, separators=(",", ":")).encode()
        return Message(t.topic, key, None)

    def insert(self, t: DeclaredTable, key: tuple, *, op: str = "c") -> list[Message]:
        self.lsn += 10
        row = {**dict(zip(t.key, key, strict=True)), **t.value(self.rng, dict(zip(t.key, key, strict=True)))}
        self.state[t.name][key] = row
        return [self._message(t, op, None, row, self.lsn)]

    def update(self, t: DeclaredTable, key: tuple) -> list[Message]:
        self.lsn += 10
        row = {**self.state[t.name][key], **t.value(self.rng, self.state[t.name][key])}
        self.state[t.name][key] = row
        return [self._message(t, "u", None, row, self.lsn)]

    def delete(self, t: DeclaredTable, key: tuple) -> list[Message]:
        self.lsn += 10
        row = self.state[t.name].pop(key)
        before = {c: row[c] if c in t.key else None for c, _, _ in t.columns}  # REPLICA IDENTITY DEFAULT
        return [self._message(t, "d", before, None, self.lsn), self._tombstone(t, row)]

    def rekey(self, t: DeclaredTable, key: tuple, new: tuple) -> list[Message]:
        """An update of a key column, as Debezium emits it: a delete of the old key, its tombstone, a create."""
        self.lsn += 10
        row = self.state[t.name].pop(key)
        before = {c: row[c] if c in t.key else None for c, _, _ in t.columns}
        moved = {**row, **dict(zip(t.key, new, strict=True))}
        self.state[t.name][new] = moved
        return [self._message(t, "d", before, None, self.lsn), self._tombstone(t, row),
                self._message(t, "c", None, moved, self.lsn)]
