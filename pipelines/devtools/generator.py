"""The simulated upstream `shop` database and its Debezium connector.

Tests, benchmarks and demos need change streams whose correct outcome is known exactly, including
the awkward cases of the contract (replays after a connector restart, re-inserted ids, orphans,
dirty and malformed data). :class:`ShopSource` plays the database *and* the connector, so its
``state`` is the ground truth that the lake must converge to, whatever the stream looked like.

Everything is driven by one ``random.Random``: the same seed and workload give byte-identical
messages, and a saved simulation continues exactly as an uninterrupted one would.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import os
import random
import re
import sys
import time
import unicodedata
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import click
from kafka import KafkaAdminClient, KafkaProducer
from kafka.errors import KafkaError, TopicAlreadyExistsError

from pipelines import settings
from pipelines.contract import (
    BIGINT_COLUMNS,
    COLUMNS,
    COUNTRY_PATTERN,
    CURRENCIES,
    EMAIL_PATTERN,
    ORDER_STATUSES,
    PRIMARY_KEY,
    SCHEMA,
    TABLES,
    TOPIC_PREFIX,
    topic,
)

DEBEZIUM_VERSION = "2.7.3.Final"
DATABASE = "shop"
# Customer ids are a plain sequence starting at 1, so ids from here on were never customers.
ORPHAN_CUSTOMER_BASE = 10_000_000

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_CLOCK_START_US = (datetime(2026, 3, 1, tzinfo=UTC) - _EPOCH) // timedelta(microseconds=1)
_DAY_US = 86_400_000_000
_TIMESTAMP_COLUMNS = ("created_at", "updated_at")
# Share of row images that carry values silver can clean (spaces, case) but must not reject.
_DIRTY_FRACTION = 0.10
_INSERT_SHARE = 0.4  # of the non-delete changes; the rest are updates
_CUSTOMER_SHARE = 0.35  # of the changes; orders change more often than customers
# Replays may reach back into earlier runs, as a connector restart re-delivers whatever its last
# committed offset left; this much of each topic's tail is kept (and saved) for that.
_HISTORY_TAIL = 500
_PROGRESS_EVERY = 1000
_ACK_EVERY = 20_000
_MESSAGE_KEY = b'{"prefix":"audit"}'  # Debezium keys logical messages by their prefix

_FIRST_NAMES = (
    "Anna", "Ben", "Chloé", "David", "Emma", "Felix", "Greta", "Hugo", "Ines", "Jonas", "Karin", "Lukas",
    "Maria", "Noah", "Olga", "Paul", "Zoë", "Rafael", "Sofia", "Tomás", "Ulla", "Viktor", "Wen", "Łukasz",
)
_LAST_NAMES = (
    "Schmidt", "Müller", "Dubois", "Rossi", "García", "Smith", "Nowak", "Jensen", "Silva", "Kowalski",
    "Bernard", "Weber", "Novak", "Larsen", "O'Brien", "Tanaka", "Fischer", "Moreau", "Lindqvist", "Costa",
)
_DOMAINS = ("example.com", "mail.example.org", "shop.test", "posteo.example", "web.example.net")
COUNTRIES = ("DE", "FR", "GB", "US", "ES", "IT", "NL", "SE", "CH", "JP", "PL", "AT", "BE", "DK", "IE", "PT")
_CURRENCY_WEIGHTS = {"EUR": 50, "USD": 20, "GBP": 10, "JPY": 5, "CHF": 8, "SEK": 7}
_SNAPSHOT_STATUS_WEIGHTS = {"placed": 30, "paid": 30, "shipped": 25, "cancelled": 10, "refunded": 5}
# An order's life: placed -> paid -> shipped, or off to cancelled/refunded; those two are final.
_NEXT_STATUS = {
    "placed": ("paid", "paid", "cancelled"),
    "paid": ("shipped", "shipped", "refunded"),
    "shipped": ("refunded",),
    "cancelled": (),
    "refunded": (),
}
_BAD_STATUSES = ("lost", "on_hold", "unknown")
_BAD_CURRENCIES = ("XXX", "ZZZ", "BTC")
_MALFORMED_KINDS = (
    "truncated_json", "non_utf8", "json_array", "json_object", "json_string",
    "unknown_op", "missing_lsn", "create_without_after", "non_integer_id",
)
# Values of `source.snapshot` in Debezium 2.7 (the Enum's allowed list, in Debezium's order).
_SNAPSHOT_MARKERS = (
    "true", "first", "first_in_data_collection", "last_in_data_collection", "last", "false", "incremental",
)
_EMAIL_RE = re.compile(EMAIL_PATTERN)
_COUNTRY_RE = re.compile(COUNTRY_PATTERN)

STAT_KEYS = (
    "r", "c", "u", "d", "t", "m", "tombstone", "replayed", "malformed",
    "invalid_values", "dirty_values", "orphan_orders", "schema_format",
)


@dataclass(frozen=True)
class Message:
    """One Kafka record, as the connector would hand it to the producer."""

    topic: str
    key: bytes | None
    value: bytes | None  # None = tombstone


@dataclass
class WorkloadConfig:
    """How much and what kind of trouble a run produces; fractions are per row or per change."""

    seed: int = 7
    customers: int = 200
    orders: int = 600
    changes: int = 2000
    delete_fraction: float = 0.05
    reinsert_fraction: float = 0.3
    invalid_fraction: float = 0.05
    orphan_fraction: float = 0.05
    malformed_fraction: float = 0.01
    replay_runs: int = 2
    schema_fraction: float = 0.5
    other_ops: bool = True
    # Order updates that give the order to another live customer (a shop fixing who placed
    # it). Off by default: drawing it would change every seeded workload the tests rely on.
    move_fraction: float = 0.0


@dataclass(frozen=True)
class _Sent:
    """A delivered record plus what a replay needs to know about it without decoding it again."""

    message: Message
    kind: str  # r c u d m tombstone
    row_id: int | None


class _IdPool:
    """Live primary keys of a table in a list, so a random pick stays O(1) on large tables."""

    def __init__(self, ids: Iterable[int] = ()) -> None:
        self.ids = list(ids)
        self._pos = {row_id: i for i, row_id in enumerate(self.ids)}

    def __len__(self) -> int:
        return len(self.ids)

    def add(self, row_id: int) -> None:
        self._pos[row_id] = len(self.ids)
        self.ids.append(row_id)

    def remove(self, row_id: int) -> None:
        i = self._pos.pop(row_id)
        last = self.ids.pop()
        if last != row_id:
            self.ids[i] = last
            self._pos[last] = i

    def choice(self, rng: random.Random) -> int:
        return self.ids[rng.randrange(len(self.ids))]


def _dumps(doc: Any) -> bytes:
    # Kafka Connect's JsonConverter writes compact UTF-8 without escaping non-ASCII characters.
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


def _key(row_id: int | str) -> bytes:
    return _dumps({PRIMARY_KEY: row_id})


def _iso(us: int) -> str:
    return (_EPOCH + timedelta(microseconds=us)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _slug(text: str) -> str:
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return "".join(ch for ch in ascii_text.lower() if ch.isalnum())


def _sequence(previous: int | None, lsn: int) -> str:
    # Debezium's `sequence`: the last committed LSN and this event's LSN, as a JSON array of strings.
    return json.dumps([None if previous is None else str(previous), str(lsn)], separators=(",", ":"))


def _weighted(rng: random.Random, weights: dict[str, int]) -> str:
    return rng.choices(list(weights), weights=list(weights.values()))[0]


def _money(cents: int) -> str:
    sign = "-" if cents < 0 else ""
    return f"{sign}{abs(cents) // 100}.{abs(cents) % 100:02d}"


def _rejected(table: str, row: dict[str, Any]) -> bool:
    """Silver's validation rules, so the stats say how many rows the lake must quarantine."""
    if table == "customers":
        email = row["email"].strip().lower()
        country = row["country"].strip().upper()
        return not (_EMAIL_RE.match(email) and _COUNTRY_RE.match(country))
    return (
        row["status"] not in ORDER_STATUSES or row["currency"] not in CURRENCIES
        or row.get("amount") is None or Decimal(row["amount"]) < 0
    )


def _dirty(table: str, row: dict[str, Any]) -> bool:
    return table == "customers" and (
        row["email"] != row["email"].strip().lower() or row["country"] != row["country"].strip().upper()
    )


# --- Kafka Connect schemas (schemas.enable=true), built once per table ------------------------------

def _column_schema(table: str, column: str) -> dict[str, Any]:
    kind = "int64" if column in BIGINT_COLUMNS[table] else "string"
    field: dict[str, Any] = {"type": kind, "optional": False}
    if column in _TIMESTAMP_COLUMNS:
        field |= {"name": "io.debezium.time.ZonedTimestamp", "version": 1}
    return field | {"field": column}


def _string(field: str, optional: bool = False) -> dict[str, Any]:
    return {"type": "string", "optional": optional, "field": field}


def _int64(field: str, optional: bool = False) -> dict[str, Any]:
    return {"type": "int64", "optional": optional, "field": field}


_SOURCE_SCHEMA = {
    "type": "struct",
    "fields": [
        _string("version"), _string("connector"), _string("name"), _int64("ts_ms"),
        {
            "type": "string", "optional": True, "name": "io.debezium.data.Enum", "version": 1,
            "parameters": {"allowed": ",".join(_SNAPSHOT_MARKERS)},
            "default": "false", "field": "snapshot",
        },
        _string("db"), _string("sequence", optional=True), _string("schema"), _string("table"),
        _int64("txId", optional=True), _int64("lsn", optional=True), _int64("xmin", optional=True),
    ],
    "optional": False,
    "name": "io.debezium.connector.postgresql.Source",
    "field": "source",
}
_TRANSACTION_SCHEMA = {
    "type": "struct",
    "fields": [_string("id"), _int64("total_order"), _int64("data_collection_order")],
    "optional": True,
    "name": "event.block",
    "version": 1,
    "field": "transaction",
}


def _envelope_schema(table: str, extra: tuple[tuple[str, str], ...] | None = None) -> dict[str, Any]:
    """The Connect schema of the table's envelope; `extra`: its columns and types once the table's shape
    changed (`ShopSource.alter`), contract columns included."""
    fields = [_column_schema(table, column) for column in COLUMNS[table]] if extra is None else [
        _column_schema(table, c) if c in COLUMNS[table] and kind == _column_schema(table, c)["type"]
        else {"type": kind, "optional": True, "field": c} for c, kind in extra]
    value = {
        "type": "struct",
        "fields": fields,
        "optional": True,
        "name": f"{topic(table)}.Value",
    }
    return {
        "type": "struct",
        "fields": [
            value | {"field": "before"}, value | {"field": "after"}, _SOURCE_SCHEMA,
            _string("op"), _int64("ts_ms", optional=True), _TRANSACTION_SCHEMA,
        ],
        "optional": False,
        "name": f"{topic(table)}.Envelope",
        "version": 1,
    }


_MESSAGE_SCHEMA = {
    "type": "struct",
    "fields": [
        _SOURCE_SCHEMA, _string("op"), _int64("ts_ms", optional=True),
        {
            "type": "struct",
            "fields": [_string("prefix"), {"type": "bytes", "optional": True, "field": "content"}],
            "optional": False,
            "name": "io.debezium.connector.postgresql.Message",
            "field": "message",
        },
    ],
    "optional": False,
    "name": "io.debezium.connector.postgresql.MessageValue",
}
# Serialized once: the schema is most of a wrapped record's bytes and never changes.
_SCHEMA_BYTES = {table: _dumps(_envelope_schema(table)) for table in TABLES} | {"m": _dumps(_MESSAGE_SCHEMA)}
# PostgreSQL's type for a Connect type, in the DDL `ShopSource.alter` returns.
_PG_TYPES = {"int16": "smallint", "int32": "integer", "int64": "bigint", "float64": "double precision",
             "boolean": "boolean", "string": "text"}


@functools.cache
def _shape_schema(table: str, columns: tuple[tuple[str, str], ...]) -> bytes:
    """The envelope's schema for a changed shape, serialized once per shape."""
    return _dumps(_envelope_schema(table, columns))


class ShopSource:
    """The `shop` database plus its connector: emits exactly what Debezium would, and knows the truth.

    ``state`` holds every live row exactly as its last ``after`` image carried it, so a pipeline that
    applies the stream correctly (newest LSN per key wins) ends up with exactly ``state``.
    """

    def __init__(self, seed: int = 7) -> None:
        self._rng = random.Random(seed)
        self.state: dict[str, dict[int, dict[str, Any]]] = {table: {} for table in TABLES}
        # The WAL position before anything was captured; real LSNs are byte offsets, hence large.
        self.lsn: int = self._rng.randrange(20_000_000, 30_000_000)
        self.stats: Counter[str] = Counter()
        self._tx_id = self._rng.randrange(500, 1000)
        self._clock_us = _CLOCK_START_US
        self._next_id = dict.fromkeys(TABLES, 1)
        self._live = {table: _IdPool() for table in TABLES}
        self._reinsert: dict[str, list[int]] = {table: [] for table in TABLES}
        self._history: dict[str, list[_Sent]] = {topic(table): [] for table in TABLES}
        # Each table's columns and Connect types while they differ from the contract's (`alter`).
        self.columns: dict[str, dict[str, str] | None] = dict.fromkeys(TABLES)

    # --- public operations --------------------------------------------------------------------------

    def snapshot(self, cfg: WorkloadConfig) -> list[Message]:
        """The initial snapshot: existing rows as op=r events that all carry the snapshot's one LSN."""
        if self.stats or any(self.state.values()):
            raise RuntimeError("snapshot() needs an empty source: Debezium snapshots on first start only")
        for table, count in (("customers", cfg.customers), ("orders", cfg.orders)):
            for _ in range(count):
                self._put(table, self._new_row(table, self._take_new_id(table), cfg, snapshot=True))
        self.lsn += self._rng.randint(56, 4000)
        self._tx_id += 1
        records = [(table, row) for table in TABLES for row in self.state[table].values()]
        out: list[Message] = []
        for i, (table, row) in enumerate(records):
            self._clock_us += self._rng.randint(20, 400)
            first_in_table = i == 0 or records[i - 1][0] != table
            last_in_table = i == len(records) - 1 or records[i + 1][0] != table
            if i == len(records) - 1:
                marker = "last"
            elif i == 0:
                marker = "first"
            elif last_in_table:
                marker = "last_in_data_collection"
            elif first_in_table:
                marker = "first_in_data_collection"
            else:
                marker = "true"
            source = self._source(table, _sequence(None, self.lsn), marker)
            self._emit(out, cfg, table, "r", None, row, source)
        self._trim_history()
        return out

    def changes(self, cfg: WorkloadConfig) -> list[Message]:
        """``cfg.changes`` inserts/updates/deletes, plus the noise a real topic carries around them."""
        out: list[Message] = []
        n = cfg.changes
        first_replay = n // 4  # a restart needs some history behind it to re-deliver
        replay_at = set(self._rng.sample(range(first_replay, n), min(cfg.replay_runs, n - first_replay)))
        message_at = set(self._rng.sample(range(n), min(n, max(1, n // 400)))) if cfg.other_ops else set()
        call_start = {name: len(history) for name, history in self._history.items()}
        for i in range(n):
            self._change(out, cfg)
            if i in message_at:
                self._logical_message(out, cfg)
            if self._rng.random() < cfg.malformed_fraction:
                out.append(self._malformed(cfg))
            if i in replay_at:
                out.extend(self._replay(call_start))
        self._trim_history()
        return out

    def truncate(self, table: str, cfg: WorkloadConfig | None = None) -> list[Message]:
        """A TRUNCATE of ``table``: Debezium sends one op=t event without a key (no row is named)."""
        cfg = cfg or WorkloadConfig()
        source = self._commit(table)
        envelope = self._envelope("t", None, None, source)
        self.stats["t"] += 1
        self.state[table].clear()
        self._live[table] = _IdPool()
        # Replays never reach back across a truncate: the contract orders events per key, and a
        # replayed pre-truncate insert has no key-level LSN left in the table to lose against.
        self._history[topic(table)].clear()
        return [Message(topic(table), None, self._encode(table, envelope, cfg))]

    def alter(self, table: str, *, add: dict[str, str] | None = None, retype: dict[str, str] | None = None,
              drop: Iterable[str] = ()) -> str:
        """A change of the table's shape (contract section 6), returned as PostgreSQL DDL for the SQL sink.

        `add` and `retype` map columns to Kafka Connect types (`int32`, `int64`, `string`, ...);
        Debezium sends no event for DDL: the next change of the table carries the new shape.
        """
        columns = dict(self._columns(table))
        ddl = []
        for name, kind in (add or {}).items():
            columns[name] = kind
            ddl.append(f"ADD COLUMN {name} {_PG_TYPES[kind]}")
        for name, kind in (retype or {}).items():
            columns[name] = kind
            ddl.append(f"ALTER COLUMN {name} TYPE {_PG_TYPES[kind]}")
        for name in drop:
            del columns[name]
            ddl.append(f"DROP COLUMN {name}")
        self.columns[table] = columns
        self.state[table] = {k: self._shaped(table, row) for k, row in self.state[table].items()}
        return f"ALTER TABLE {table} " + ", ".join(ddl)

    def update(self, table: str, row_id: int, values: dict[str, Any], cfg: WorkloadConfig | None = None,
               *, unchanged: Iterable[str] = ()) -> list[Message]:
        """A scripted UPDATE of one live row (tests and benchmarks that need the same change on two databases).

        `unchanged` names TOASTed columns the update leaves as they are: Debezium sends its placeholder
        (`settings.unavailable_placeholder()`) in their place, under REPLICA IDENTITY DEFAULT.
        """
        if row_id not in self.state[table]:
            raise KeyError(f"{table} has no live row {row_id}")
        unknown = set(values) - set(self._columns(table)) | ({PRIMARY_KEY} & set(values))
        if unknown:
            raise ValueError(f"cannot set {sorted(unknown)} of {table}")
        source = self._commit(table)
        row = self._shaped(table, self.state[table][row_id] | values | {"updated_at": _iso(self._clock_us)})
        self.state[table][row_id] = row
        out: list[Message] = []
        placeholder = settings.unavailable_placeholder()
        self._emit(out, cfg or WorkloadConfig(), table, "u", None, row, source,
                   image=row | dict.fromkeys(unchanged, placeholder))
        return out

    def delete(self, table: str, row_id: int, cfg: WorkloadConfig | None = None) -> list[Message]:
        """A scripted DELETE of one live row: the delete event and its tombstone."""
        if row_id not in self.state[table]:
            raise KeyError(f"{table} has no live row {row_id}")
        out: list[Message] = []
        self._delete(out, cfg or WorkloadConfig(reinsert_fraction=0.0), table, row_id)
        return out

    def to_json(self) -> str:
        """Everything a later run needs to continue exactly where this one stopped."""
        version, internal, gauss = self._rng.getstate()
        doc = {
            "format": 1,
            "rng": [version, list(internal), gauss],
            "lsn": self.lsn,
            "tx_id": self._tx_id,
            "clock_us": self._clock_us,
            "next_id": self._next_id,
            "state": {table: list(rows.values()) for table, rows in self.state.items()},
            "columns": self.columns,
            "live": {table: pool.ids for table, pool in self._live.items()},
            "reinsert": self._reinsert,
            "stats": dict(self.stats),
            "history": {
                name: [
                    [sent.kind, sent.row_id, _text(sent.message.key), _text(sent.message.value)]
                    for sent in history
                ]
                for name, history in self._history.items()
            },
        }
        return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> ShopSource:
        """Restore a simulation saved by :meth:`to_json`."""
        doc = json.loads(text)
        if doc.get("format") != 1:
            raise ValueError(f"unsupported ShopSource state format {doc.get('format')!r}")
        source = cls()
        version, internal, gauss = doc["rng"]
        source._rng.setstate((version, tuple(internal), gauss))
        source.lsn = doc["lsn"]
        source._tx_id = doc["tx_id"]
        source._clock_us = doc["clock_us"]
        source._next_id = doc["next_id"]
        source.columns = doc.get("columns") or dict.fromkeys(TABLES)
        source.state = {
            table: {row[PRIMARY_KEY]: row for row in rows} for table, rows in doc["state"].items()
        }
        source._live = {table: _IdPool(ids) for table, ids in doc["live"].items()}
        source._reinsert = doc["reinsert"]
        source.stats = Counter(doc["stats"])
        source._history = {
            name: [
                _Sent(Message(name, _bytes(key), _bytes(value)), kind, row_id)
                for kind, row_id, key, value in history
            ]
            for name, history in doc["history"].items()
        }
        return source

    # --- row changes -------------------------------------------------------------------------------

    def _change(self, out: list[Message], cfg: WorkloadConfig) -> None:
        rng = self._rng
        table = "customers" if rng.random() < _CUSTOMER_SHARE else "orders"
        live = self._live[table]
        draw = rng.random()
        inserts_below = cfg.delete_fraction + (1 - cfg.delete_fraction) * _INSERT_SHARE
        if not live or cfg.delete_fraction <= draw < inserts_below:
            self._insert(out, cfg, table)
        elif draw < cfg.delete_fraction:
            self._delete(out, cfg, table, live.choice(rng))
        else:
            self._update(out, cfg, table, live.choice(rng))

    def _insert(self, out: list[Message], cfg: WorkloadConfig, table: str) -> None:
        pending = self._reinsert[table]
        if pending and self._rng.random() < 0.5:
            row_id = pending.pop(self._rng.randrange(len(pending)))
        else:
            row_id = self._take_new_id(table)
        source = self._commit(table)
        row = self._shaped(table, self._new_row(table, row_id, cfg))
        self._put(table, row)
        self._emit(out, cfg, table, "c", None, row, source)

    def _update(self, out: list[Message], cfg: WorkloadConfig, table: str, row_id: int) -> None:
        rng = self._rng
        source = self._commit(table)
        row = dict(self.state[table][row_id])
        if table == "customers":
            for column in rng.sample(("email", "full_name", "country"), rng.randint(1, 2)):
                if column == "full_name":
                    row["full_name"] = self._full_name()
                elif column == "email":
                    row["email"] = self._email(row["full_name"], row_id, self._quality(cfg))
                else:
                    row["country"] = self._country(self._quality(cfg))
        elif cfg.move_fraction and rng.random() < cfg.move_fraction and len(self._live["customers"]) > 1:
            owner = row["customer_id"]
            while (other := self._live["customers"].choice(rng)) == owner:
                pass
            row["customer_id"] = other
        else:
            for column in rng.sample(("status", "amount"), rng.randint(1, 2)):
                quality = self._quality(cfg)
                following = _NEXT_STATUS.get(row["status"], ("placed",))
                if column == "status" and quality == "invalid":
                    row["status"] = rng.choice(_BAD_STATUSES)
                elif column == "status" and following:
                    row["status"] = rng.choice(following)
                else:  # an amount change, also when the status is final
                    row["amount"] = self._amount(quality)
        row["updated_at"] = _iso(self._clock_us)
        row = self._shaped(table, row)
        self.state[table][row_id] = row
        self._emit(out, cfg, table, "u", None, row, source)

    def _delete(self, out: list[Message], cfg: WorkloadConfig, table: str, row_id: int) -> None:
        source = self._commit(table)
        del self.state[table][row_id]
        self._live[table].remove(row_id)
        if self._rng.random() < cfg.reinsert_fraction:
            self._reinsert[table].append(row_id)
        # REPLICA IDENTITY DEFAULT: the old row image carries the primary key only.
        before: dict[str, Any] = dict.fromkeys(self._columns(table))
        before[PRIMARY_KEY] = row_id
        self._emit(out, cfg, table, "d", before, None, source)
        self.stats["tombstone"] += 1
        self._remember(out, Message(topic(table), _key(row_id), None), "tombstone", row_id)

    def _logical_message(self, out: list[Message], cfg: WorkloadConfig) -> None:
        """A pg_logical_emit_message() from the application: it takes a WAL position but no row."""
        table = self._rng.choice(TABLES)
        source = self._commit(table) | {"schema": "", "table": ""}
        action = self._rng.choice(("export", "login", "refund-review", "price-change"))
        content = _dumps({"actor": "backoffice", "action": action, "at": _iso(self._clock_us)})
        envelope = {
            "before": None,
            "after": None,
            "source": source,
            "op": "m",
            "ts_ms": self._processing_ms(source),
            "message": {"prefix": "audit", "content": base64.b64encode(content).decode()},
        }
        self.stats["m"] += 1
        self._remember(out, Message(topic(table), _MESSAGE_KEY, self._encode("m", envelope, cfg)), "m", None)

    # --- noise: replays and malformed records -----------------------------------------------------

    def _replay(self, call_start: dict[str, int]) -> list[Message]:
        """A connector restart: per topic, a contiguous run of older records is delivered again.

        The run is steered onto a delete whose id was re-inserted afterwards when there is one,
        because that is the replay a pipeline most easily gets wrong (it would delete a live row).
        """
        rng = self._rng
        replayed: list[Message] = []
        for name, history in self._history.items():
            sent_this_call = len(history) - call_start[name]
            if not sent_this_call:
                continue
            length = min(len(history), max(1, round(sent_this_call * rng.uniform(0.05, 0.15))))
            candidates = _deletes_reinserted_later(history)
            if candidates:
                anchor = rng.choice(candidates)
                start = min(max(0, anchor - rng.randrange(length)), len(history) - length)
            else:
                start = rng.randrange(len(history) - length + 1)
            end = start + length
            if history[end - 1].kind == "d" and end < len(history):
                end += 1  # a delete and its tombstone are re-delivered together
            replayed.extend(sent.message for sent in history[start:end])
        self.stats["replayed"] += len(replayed)
        return replayed

    def _malformed(self, cfg: WorkloadConfig) -> Message:
        """A record the pipeline must park with a reason; none of them is a change of the database.

        The envelope-shaped ones carry a fresh random row for a live id, so a pipeline that wrongly
        applies one makes the lake diverge from ``state`` visibly.
        """
        rng = self._rng
        table = rng.choice(TABLES)
        kind = rng.choice(_MALFORMED_KINDS)
        live = self._live[table]
        row_id = live.choice(rng) if live else self._next_id[table]
        key = None if rng.random() < 0.25 else _key(row_id)
        self.stats["malformed"] += 1
        raw = {
            "truncated_json": b'{"op": "c", "after": ',
            "non_utf8": b'{"op":"c","after":{"id":\xff\xfe\xc3\x28}}',
            "json_array": b"[1,2,3]",
            "json_object": b'{"hello":"world"}',
            "json_string": b'"text"',
        }
        if kind in raw:
            return Message(topic(table), key, raw[kind])
        source = self._source(table, _sequence(self.lsn, self.lsn), "false")
        row = self._new_row(table, row_id, cfg)
        if kind == "unknown_op":
            envelope = self._envelope("x", None, row, source)
        elif kind == "missing_lsn":
            envelope = self._envelope("u", None, row, {k: v for k, v in source.items() if k != "lsn"})
        elif kind == "create_without_after":
            envelope = self._envelope("c", None, None, source)
        else:
            envelope = self._envelope("c", None, row | {PRIMARY_KEY: "abc"}, source)
            key = None if key is None else _key("abc")
        return Message(topic(table), key, self._encode(table, envelope, cfg))

    # --- rows and values -----------------------------------------------------------------------------

    def _new_row(
        self, table: str, row_id: int, cfg: WorkloadConfig, *, snapshot: bool = False
    ) -> dict[str, Any]:
        """A fresh row; snapshot rows were created during the month before the snapshot started."""
        rng = self._rng
        if snapshot:
            created = self._clock_us - rng.randrange(1_000_000, 30 * _DAY_US)
            updated = created + rng.randrange(self._clock_us - created)
        else:
            created = updated = self._clock_us
        quality = self._quality(cfg)
        if table == "customers":
            spoiled = rng.choice(("email", "country"))
            name = self._full_name()
            values: dict[str, Any] = {
                "id": row_id,
                "email": self._email(name, row_id, quality if spoiled == "email" else "ok"),
                "full_name": name,
                "country": self._country(quality if spoiled == "country" else "ok"),
            }
        else:
            spoiled = rng.choice(("status", "amount", "currency")) if quality == "invalid" else ""
            status = _weighted(rng, _SNAPSHOT_STATUS_WEIGHTS) if snapshot else "placed"
            currency = _weighted(rng, _CURRENCY_WEIGHTS)
            values = {
                "id": row_id,
                "customer_id": self._customer_for_order(cfg),
                "status": rng.choice(_BAD_STATUSES) if spoiled == "status" else status,
                "amount": self._amount("invalid" if spoiled == "amount" else "ok"),
                "currency": rng.choice(_BAD_CURRENCIES) if spoiled == "currency" else currency,
            }
        row = values | {"created_at": _iso(created), "updated_at": _iso(updated)}
        return {column: row[column] for column in COLUMNS[table]}

    def _quality(self, cfg: WorkloadConfig) -> str:
        draw = self._rng.random()
        if draw < cfg.invalid_fraction:
            return "invalid"
        return "dirty" if draw < cfg.invalid_fraction + _DIRTY_FRACTION else "ok"

    def _full_name(self) -> str:
        return f"{self._rng.choice(_FIRST_NAMES)} {self._rng.choice(_LAST_NAMES)}"

    def _email(self, full_name: str, row_id: int, quality: str) -> str:
        rng = self._rng
        first, _, last = full_name.partition(" ")
        local = f"{_slug(first)}.{_slug(last)}{row_id}"
        domain = rng.choice(_DOMAINS)
        if quality == "invalid":
            return rng.choice((
                f"{local}.{domain}",  # no @
                f"{local}@{domain.split('.')[0]}",  # no dot in the domain
                f"{local.replace('.', ' ', 1)}@{domain}",  # a space inside
            ))
        if quality == "dirty":
            return rng.choice((
                f"  {local}@{domain} ",
                f"{local}@{domain}".upper(),
                f" {local.title()}@{domain.title()}",
            ))
        return f"{local}@{domain}"

    def _country(self, quality: str) -> str:
        rng = self._rng
        code = rng.choice(COUNTRIES)
        if quality == "invalid":
            return rng.choice((
                f"{rng.randint(0, 9)}{code[0]}",  # "1A"
                f"{code[0]}{rng.randint(0, 9)}",  # "D3"
                f"{code[0]} ",  # a one-letter value, blank-padded by char(2)
            ))
        if quality == "dirty":
            return rng.choice((code.lower(), code.lower(), code.title(), f" {code.title()}"))
        return code

    def _amount(self, quality: str) -> str:
        if quality == "invalid":
            return _money(-self._rng.randint(1, 5_000))
        return _money(self._rng.randint(199, 99_999))

    def _customer_for_order(self, cfg: WorkloadConfig) -> int:
        customers = self._live["customers"]
        if not customers or self._rng.random() < cfg.orphan_fraction:
            return ORPHAN_CUSTOMER_BASE + self._rng.randrange(1_000_000)
        return customers.choice(self._rng)

    def _take_new_id(self, table: str) -> int:
        row_id = self._next_id[table]
        self._next_id[table] += 1
        return row_id

    def _columns(self, table: str) -> dict[str, str]:
        """The table's columns and their Connect types now."""
        return self.columns[table] or {c: _column_schema(table, c)["type"] for c in COLUMNS[table]}

    def _shaped(self, table: str, row: dict[str, Any]) -> dict[str, Any]:
        """`row` with the table's columns now: added ones null until set, dropped ones gone."""
        if self.columns[table] is None:
            return row
        return {c: row.get(c) for c in self.columns[table]}

    def _put(self, table: str, row: dict[str, Any]) -> None:
        row = self._shaped(table, row)
        self.state[table][row[PRIMARY_KEY]] = row
        self._live[table].add(row[PRIMARY_KEY])

    # --- envelopes and encoding ----------------------------------------------------------------------

    def _commit(self, table: str) -> dict[str, Any]:
        """A new transaction: later clock, later LSN; `sequence` names the previous commit's LSN."""
        rng = self._rng
        self._clock_us += rng.randint(500_000, 5_000_000)
        previous = self.lsn
        self.lsn += rng.randint(56, 4000)
        self._tx_id += rng.randint(1, 3)
        return self._source(table, _sequence(previous, self.lsn), "false")

    def _source(self, table: str, sequence: str, snapshot: str) -> dict[str, Any]:
        return {
            "version": DEBEZIUM_VERSION,
            "connector": "postgresql",
            "name": TOPIC_PREFIX,
            "ts_ms": self._clock_us // 1000,
            "snapshot": snapshot,
            "db": DATABASE,
            "sequence": sequence,
            "schema": SCHEMA,
            "table": table,
            "txId": self._tx_id,
            "lsn": self.lsn,
            "xmin": None,
        }

    def _processing_ms(self, source: dict[str, Any]) -> int:
        return source["ts_ms"] + self._rng.randint(2, 400)

    def _envelope(self, op: str, before: Any, after: Any, source: dict[str, Any]) -> dict[str, Any]:
        return {
            "before": before,
            "after": after,
            "source": source,
            "op": op,
            "ts_ms": self._processing_ms(source),
            "transaction": None,
        }

    def _encode(self, schema_name: str, envelope: dict[str, Any], cfg: WorkloadConfig) -> bytes:
        """The value bytes under one of the two converter settings, drawn per record."""
        payload = _dumps(envelope)
        if self._rng.random() >= cfg.schema_fraction:
            return payload
        self.stats["schema_format"] += 1
        columns = self.columns.get(schema_name)
        schema = _SCHEMA_BYTES[schema_name] if columns is None else _shape_schema(schema_name, tuple(columns.items()))
        return b'{"schema":' + schema + b',"payload":' + payload + b"}"

    def _emit(
        self,
        out: list[Message],
        cfg: WorkloadConfig,
        table: str,
        op: str,
        before: dict[str, Any] | None,
        after: dict[str, Any] | None,
        source: dict[str, Any],
        image: dict[str, Any] | None = None,
    ) -> None:
        """Emit a row change; `image` is the `after` sent when it differs from the row (placeholders)."""
        row_id = (after or before or {})[PRIMARY_KEY]
        self.stats[op] += 1
        if after is not None:
            if _rejected(table, after):
                self.stats["invalid_values"] += 1
            elif _dirty(table, after):
                self.stats["dirty_values"] += 1
            if table == "orders" and op != "u" and after["customer_id"] >= ORPHAN_CUSTOMER_BASE:
                self.stats["orphan_orders"] += 1
        sent = image if image is not None else after
        value = self._encode(table, self._envelope(op, before, sent, source), cfg)
        self._remember(out, Message(topic(table), _key(row_id), value), op, row_id)

    def _remember(self, out: list[Message], message: Message, kind: str, row_id: int | None) -> None:
        out.append(message)
        self._history[message.topic].append(_Sent(message, kind, row_id))

    def _trim_history(self) -> None:
        for history in self._history.values():
            del history[: max(0, len(history) - _HISTORY_TAIL)]


def _deletes_reinserted_later(history: Sequence[_Sent]) -> list[int]:
    """Positions of deletes whose id comes back with an insert later in ``history``."""
    inserted_later: set[int | None] = set()
    found = []
    for i in range(len(history) - 1, -1, -1):
        sent = history[i]
        if sent.kind == "c":
            inserted_later.add(sent.row_id)
        elif sent.kind == "d" and sent.row_id in inserted_later:
            found.append(i)
    found.reverse()
    return found


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode()


def _bytes(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


# --- Kafka ---------------------------------------------------------------------------------------------

class KafkaUnavailableError(RuntimeError):
    """The brokers could not be reached or did not take the records."""


def _optional_config(client: type, **config: Any) -> dict[str, Any]:
    # Settings newer kafka-python releases know; older ones reject unknown keys outright.
    known = getattr(client, "DEFAULT_CONFIG", {})
    return {name: value for name, value in config.items() if name in known}


def produce(
    messages: Iterable[Message],
    bootstrap: str,
    *,
    rate: float | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Send ``messages`` in order and wait until the brokers acknowledged all of them.

    Order matters: replays and delete/tombstone pairs only mean something in the order they were
    generated, and the default partitioner keeps each key's records in one partition, in order.
    """
    batch = messages if isinstance(messages, Sequence) else list(messages)
    total = len(batch)
    try:
        producer = KafkaProducer(
            bootstrap_servers=bootstrap,
            acks="all",
            linger_ms=20,
            **_optional_config(KafkaProducer, enable_idempotence=True, bootstrap_timeout_ms=15_000),
        )
    except KafkaError as exc:
        raise KafkaUnavailableError(f"cannot reach Kafka at {bootstrap}: {exc}") from exc
    failures: list[BaseException] = []
    try:
        started = time.monotonic()
        for sent, message in enumerate(batch, 1):
            producer.send(message.topic, key=message.key, value=message.value).add_errback(failures.append)
            if rate:
                delay = started + sent / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            if sent % _ACK_EVERY == 0:
                # Wait for the acknowledgements of what is buffered: a backlog of a million records
                # queued at once outlives the producer's delivery timeout (records expire unsent).
                producer.flush()
            if progress and (sent % _PROGRESS_EVERY == 0 or sent == total):
                progress(sent, total)
        producer.flush()
    except KafkaError as exc:
        raise KafkaUnavailableError(f"producing to Kafka at {bootstrap} failed: {exc}") from exc
    finally:
        producer.close(timeout=10)  # after a failure, do not hang on records that will never go out
    if failures:
        raise KafkaUnavailableError(
            f"Kafka at {bootstrap} did not acknowledge {len(failures)} of {total} records: {failures[0]}"
        )
    return total


def ensure_topics(bootstrap: str, partitions: int = 3) -> None:
    """Create the source topics if missing, so the keyed records spread over several partitions.

    Existing topics are left as they are (whatever their partition count), which keeps this safe to
    call before every run.
    """
    try:
        admin = KafkaAdminClient(
            bootstrap_servers=bootstrap,
            client_id="shop-generator",
            **_optional_config(KafkaAdminClient, bootstrap_timeout_ms=15_000),
        )
    except KafkaError as exc:
        raise KafkaUnavailableError(f"cannot reach Kafka at {bootstrap}: {exc}") from exc
    try:
        existing = set(admin.list_topics())
        for name in (topic(table) for table in TABLES):
            if name in existing:
                continue
            with contextlib.suppress(TopicAlreadyExistsError):  # another run created it meanwhile: fine
                admin.create_topics({name: {"num_partitions": partitions}}, wait_for_metadata=True)
    except KafkaError as exc:
        raise KafkaUnavailableError(f"creating topics on Kafka at {bootstrap} failed: {exc}") from exc
    finally:
        admin.close()


# --- CLI -----------------------------------------------------------------------------------------------

def _summary(stats: Counter[str]) -> str:
    return " ".join(f"{key}={stats[key]}" for key in STAT_KEYS if stats[key])


_DEFAULTS = WorkloadConfig()


@click.command("generate")
@click.option("--seed", type=int, default=_DEFAULTS.seed, show_default=True,
              help="Seed of a new simulation (ignored when the state file exists: that one continues).")
@click.option("--customers", type=click.IntRange(min=0), default=_DEFAULTS.customers, show_default=True,
              help="Customers in the initial snapshot.")
@click.option("--orders", type=click.IntRange(min=0), default=_DEFAULTS.orders, show_default=True,
              help="Orders in the initial snapshot.")
@click.option("--changes", type=click.IntRange(min=0), default=_DEFAULTS.changes, show_default=True,
              help="Inserts, updates and deletes after the snapshot.")
@click.option("--malformed-fraction", type=click.FloatRange(0, 1), default=_DEFAULTS.malformed_fraction,
              show_default=True, help="Share of changes followed by a malformed record.")
@click.option("--replays", type=click.IntRange(min=0), default=_DEFAULTS.replay_runs, show_default=True,
              help="Simulated connector restarts, each re-delivering a run of older records.")
@click.option("--schema-fraction", type=click.FloatRange(0, 1), default=_DEFAULTS.schema_fraction,
              show_default=True, help="Share of records in the schemas.enable=true format.")
@click.option("--move-fraction", type=click.FloatRange(0, 1), default=_DEFAULTS.move_fraction,
              show_default=True, help="Share of order updates that give the order to another customer.")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Maximum records per second, for steady-load runs  [default: unlimited]")
@click.option("--partitions", type=click.IntRange(min=1), default=3, show_default=True,
              help="Partitions of the topics when they have to be created.")
@click.option("--state-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Saved simulation  [default: $LAKEHOUSE_SOURCE_STATE or .source/shop_state.json]")
@click.option("--bootstrap", default=None,
              help="Kafka brokers  [default: $KAFKA_BOOTSTRAP_SERVERS or 127.0.0.1:9092]")
@click.option("--sink", type=click.Choice(["kafka", "sql"]), default="kafka", show_default=True,
              help="kafka: produce the simulated connector's records; sql: play the changes as SQL transactions "
                   "on the real source's database (`make source-up`) and wait until Debezium delivered them.")
@click.option("--dsn", default=None,
              help="Database of --sink sql  [default: $LAKEHOUSE_SOURCE_DSN or that of `lakehouse source status`]")
@click.option("--dry-run", is_flag=True, help="Generate and print the stats; produce and save nothing.")
def generate(
    seed: int,
    customers: int,
    orders: int,
    changes: int,
    malformed_fraction: float,
    replays: int,
    schema_fraction: float,
    move_fraction: float,
    rate: float | None,
    partitions: int,
    state_file: Path | None,
    bootstrap: str | None,
    sink: str,
    dsn: str | None,
    dry_run: bool,
) -> None:
    """Play the upstream `shop` database: produce Debezium change events to Kafka.

    The first run produces the initial snapshot and then CHANGES change events; later runs load the
    saved simulation and produce only further changes, continuing its LSNs, ids and clock. The state
    is saved only after Kafka acknowledged every record, so a failed run is simply repeated.

    With --sink sql the same changes are real INSERT, UPDATE, DELETE and TRUNCATE transactions on
    PostgreSQL, and Debezium makes the records (tombstones and replays included); the state file
    still follows the simulation, so that later runs continue it.
    """
    path = state_file or settings.source_state_file()
    brokers = bootstrap or settings.kafka_bootstrap()
    cfg = WorkloadConfig(
        seed=seed,
        customers=customers,
        orders=orders,
        changes=changes,
        malformed_fraction=malformed_fraction,
        replay_runs=replays,
        schema_fraction=schema_fraction,
        move_fraction=move_fraction,
    )
    resumed = path.exists()
    try:
        source = ShopSource.from_json(path.read_text(encoding="utf-8")) if resumed else ShopSource(cfg.seed)
    except (ValueError, KeyError) as exc:
        raise click.ClickException(f"cannot continue from state file {path}: {exc!r}") from exc
    before = source.stats.copy()
    messages = [] if resumed else source.snapshot(cfg)
    messages += source.changes(cfg)
    run_stats = source.stats - before
    if dry_run:
        click.echo(f"dry run: would produce {len(messages)} records ({_summary(run_stats)})")
        return
    if sink == "sql":
        summary = _play_sql(messages, dsn, brokers)
        _save(source, path)
        click.echo(f"{summary}, delivered by Debezium to {brokers}; state {path}")
        return
    try:
        ensure_topics(brokers, partitions)
        with click.progressbar(length=len(messages), label="producing", file=sys.stderr) as bar:
            sent = produce(
                messages, brokers, rate=rate, progress=lambda done, _total: bar.update(done - bar.pos)
            )
    except KafkaUnavailableError as exc:
        raise click.ClickException(str(exc)) from exc
    _save(source, path)
    verb = "continued" if resumed else "snapshot +"
    click.echo(f"{verb} {sent} records to {brokers} ({_summary(run_stats)}); lsn={source.lsn}; state {path}")


def _save(source: ShopSource, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(source.to_json(), encoding="utf-8")
    os.replace(partial, path)


def _play_sql(messages: list[Message], dsn: str | None, brokers: str) -> str:
    """The changes as SQL on the real source, then wait until Debezium put the last one on Kafka."""
    from pipelines.devtools import pg_source, sql_sink

    dsn = dsn or os.environ.get("LAKEHOUSE_SOURCE_DSN") or pg_source.default_dsn()
    if dsn is None:
        raise click.ClickException("--sink sql needs the real source: `make source-up`, "
                                   "or --dsn / LAKEHOUSE_SOURCE_DSN")
    try:
        since = sql_sink.end_offsets(brokers, [topic(table) for table in TABLES])
        run = sql_sink.apply(messages, dsn)
        if run.last_table is not None and run.last_lsn is not None:
            sql_sink.wait_published(brokers, run.last_table, run.last_lsn, since)
    except (RuntimeError, TimeoutError, KafkaError) as exc:
        raise click.ClickException(str(exc)) from exc
    counts = " ".join(f"{op}={run.stats[op]}" for op in ("c", "u", "d", "t") if run.stats[op]) or "no changes"
    return f"played {counts} on {dsn}"
