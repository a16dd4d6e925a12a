"""A declared workload beyond the shop, built here independently of the pipeline's parser: Debezium envelopes
with their Connect schema (`schemas.enable=true`) for tables of every type of contract section 7, and the
plain-Python model of what the source holds after them.

Each column is (name, Connect field schema, encode): `encode` turns the model's Python value into the
JSON value Debezium 2.7 puts on the wire (pipelines' connect_types does the reverse; the two are written
apart so that a mistake in one is not copied into the other).
"""

from __future__ import annotations

import base64
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from pipelines.devtools.generator import Message

EPOCH = datetime(1970, 1, 1)
PREFIX = "dbz"


def _days(d: date) -> int:
    return (d - EPOCH.date()).days


def _micros(ts: datetime) -> int:
    return (ts - EPOCH) // timedelta(microseconds=1)


def _zoned(ts: datetime) -> str:  # an aware datetime -> Debezium's ZonedTimestamp text
    return ts.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


Column = tuple[str, dict[str, Any], Callable[[Any], Any]]


def _same(v: Any) -> Any:
    return v


# Section 7's types: the Connect field schema Debezium 2.7 gives each (checked against the connector's own
# output in tests/fixtures/declared when captured), and how a value goes on the wire.
TYPES: dict[str, Column] = {
    "small": ("small", {"type": "int16"}, _same),
    "num": ("num", {"type": "int32"}, _same),
    "big": ("big", {"type": "int64"}, _same),
    "ratio": ("ratio", {"type": "float"}, _same),
    "score": ("score", {"type": "double"}, _same),
    "flag": ("flag", {"type": "boolean"}, _same),
    "price": ("price", {"type": "string", "parameters": {"__debezium.source.column.type": "NUMERIC",
                                                          "__debezium.source.column.length": "12",
                                                          "__debezium.source.column.scale": "2"}}, str),
    "label": ("label", {"type": "string"}, _same),
    "mood": ("mood", {"type": "string", "name": "io.debezium.data.Enum", "version": 1,
                      "parameters": {"allowed": "happy,sad"}}, _same),
    "born": ("born", {"type": "int32", "name": "io.debezium.time.Date", "version": 1}, _days),
    "seen": ("seen", {"type": "int64", "name": "io.debezium.time.MicroTimestamp", "version": 1}, _micros),
    "paid_at": ("paid_at", {"type": "string", "name": "io.debezium.time.ZonedTimestamp", "version": 1}, _zoned),
    "ref": ("ref", {"type": "string", "name": "io.debezium.data.Uuid", "version": 1}, _same),
    "doc": ("doc", {"type": "string", "name": "io.debezium.data.Json", "version": 1}, _same),
    "blob": ("blob", {"type": "bytes"}, lambda b: base64.b64encode(b).decode()),
    "tags": ("tags", {"type": "array", "items": {"type": "string", "optional": True}}, _same),
    "counts": ("counts", {"type": "array", "items": {"type": "int32", "optional": True}}, _same),
}


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
        fields = [{**spec, "optional": c not in self.key, "field": c} for c, spec, _ in self.columns]
        row = {"type": "struct", "fields": fields, "optional": True, "name": f"{PREFIX}.public.{self.name}.Value"}
        return {"type": "struct", "name": f"{PREFIX}.public.{self.name}.Envelope", "optional": False, "fields": [
            {**row, "field": "before"}, {**row, "field": "after"},
            {"type": "struct", "field": "source", "optional": False, "fields": [
                {"type": "string", "field": "version"}, {"type": "string", "field": "connector"},
                {"type": "int64", "field": "ts_ms"}, {"type": "string", "field": "table"},
                {"type": "int64", "field": "lsn", "optional": True}]},
            {"type": "string", "field": "op"}, {"type": "int64", "field": "ts_ms", "optional": True}]}

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
        return Message(t.topic, key, json.dumps({"schema": t.schema(), "payload": envelope}).encode())

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


# --------------------------------------------------------------------------- two tables of every type

_EDGE_DATES = [date(1900, 1, 1), date(1969, 12, 31), date(1970, 1, 1), date(2026, 3, 1), date(9999, 12, 31)]
_EDGE_TIMES = [datetime(1901, 12, 13, 20, 45, 52, 1), datetime(1969, 12, 31, 23, 59, 59, 999999),
               datetime(2026, 3, 29, 1, 30), datetime(2262, 4, 11, 23, 47, 16, 854775)]
_TEXTS = ["plain", "ünïcødé ✓ 日本語", "", "quote \" and \\ backslash", "emoji 🚀", "tab\tnew\nline"]


def _maybe(rng: random.Random, value: Any, p: float = 0.15) -> Any:
    return None if rng.random() < p else value


def _every_type(rng: random.Random, _: dict[str, Any]) -> dict[str, Any]:
    return {
        "small": _maybe(rng, rng.randint(-32768, 32767)),
        "num": _maybe(rng, rng.randint(-2**31, 2**31 - 1)),
        "big": _maybe(rng, rng.randint(-2**63, 2**63 - 1)),
        "ratio": _maybe(rng, rng.choice([0.5, -1.25, 3.0, 0.375])),  # exact in float32
        "score": _maybe(rng, rng.choice([0.1, -2.5e300, 1 / 3, 0.0])),
        "flag": _maybe(rng, rng.random() < 0.5),
        "price": _maybe(rng, Decimal(rng.randint(-10**11, 10**11)) / 100),
        "label": _maybe(rng, rng.choice(_TEXTS)),
        "mood": _maybe(rng, rng.choice(["happy", "sad"])),
        "born": _maybe(rng, rng.choice(_EDGE_DATES)),
        "seen": _maybe(rng, rng.choice(_EDGE_TIMES)),
        "paid_at": _maybe(rng, rng.choice(_EDGE_TIMES).replace(tzinfo=UTC)),
        "ref": _maybe(rng, f"{rng.getrandbits(128):032x}"),
        "doc": _maybe(rng, json.dumps({"k": rng.choice(_TEXTS), "n": [1, 2.5, None], "deep": {"x": True}})),
        "blob": _maybe(rng, bytes(rng.choice([0, 1, 255]) for _ in range(rng.randint(0, 12)))),
        "tags": _maybe(rng, [rng.choice([*_TEXTS, None]) for _ in range(rng.randint(0, 3))]),  # a NULL element too
        "counts": _maybe(rng, [rng.choice([rng.randint(-5, 5), None]) for _ in range(rng.randint(0, 4))]),
    }


def _line(rng: random.Random, _: dict[str, Any]) -> dict[str, Any]:
    return {"label": rng.choice(_TEXTS), "num": rng.randint(0, 50)}


EVERY_TYPE = DeclaredTable("every_type", ("id",), [("id", {"type": "int64"}, _same), *TYPES.values()], _every_type)
LINES = DeclaredTable("order_lines", ("region", "order_no"),
                      [("region", {"type": "string"}, _same), ("order_no", {"type": "int64"}, _same),
                       TYPES["label"], TYPES["num"]], _line)

DECLARATION = f"""
[source]
topic_prefix = "{PREFIX}"

[tables.every_type]
source = "public.every_type"
key = ["id"]

[[tables.every_type.clean]]
column = "label"
trim = true
upper = true
[[tables.every_type.rules]]
column = "mood"
one_of = ["happy"]
[[tables.every_type.rules]]
column = "price"
min = 0
name = "price_not_negative"
[[tables.every_type.rules]]
column = "label"
pattern = "^[A-Z ]+$"
[[tables.every_type.rules]]
column = "flag"
not_null = true

[tables.order_lines]
source = "public.order_lines"
key = ["region", "order_no"]

[[tables.order_lines.rules]]
column = "num"
max = 40
"""


def silver_model(table: str, row: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """(the row after DECLARATION's cleaning, the first of its rules the row fails), in plain Python: a NULL passes
    every rule but not_null; `pattern` is found anywhere; trim strips whitespace, then upper."""
    if table == "order_lines":
        return row, ("num_max" if row["num"] is not None and row["num"] > 40 else None)
    label = row["label"].strip().upper() if row["label"] is not None else None
    clean = {**row, "label": label}
    checks = [("mood_one_of", row["mood"] is None or row["mood"] == "happy"),
              ("price_not_negative", row["price"] is None or row["price"] >= 0),
              ("label_pattern", label is None or re.search(r"^[A-Z ]+$", label) is not None),
              ("flag_not_null", row["flag"] is not None)]
    return clean, next((name for name, ok in checks if not ok), None)
