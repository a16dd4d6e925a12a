"""A workload for any declared table, played as SQL on the real source (contract section 7).

The shop's generator (`ShopSource`) knows the shop's two tables. This one knows none: it reads each
declared table's columns and types from PostgreSQL's catalog and makes random inserts, updates
(sometimes of a key column: Debezium then sends a delete of the old key and an insert of the new)
and deletes, each its own transaction, with values across each type's range: NULLs in nullable
columns, unicode, pre-1970 and far-future dates and times, zero bytes in `bytea`, NULL array
elements, exact decimals at the column's scale. PostgreSQL is the model: what the lake must hold
is read back from it with SQL (`source_rows`).

Types it cannot make a value for (geometry, ranges, ...) are left to their default (NULL), with a
warning: the table still plays.
"""

from __future__ import annotations

import logging
import random
import string
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

from pipelines.lake.declaration import Declaration, TableDecl

log = logging.getLogger(__name__)

_TEXTS = ["plain", "ünïcødé ✓ 日本語", "", "quote \" and \\ backslash", "emoji 🚀", "tab\tnew\nline", "  padded  "]
_DATES = [date(1900, 1, 1), date(1969, 12, 31), date(1970, 1, 1), date(2000, 2, 29), date(2026, 3, 1),
          date(9999, 12, 31)]
_TIMES = [datetime(1901, 12, 13, 20, 45, 52, 1), datetime(1969, 12, 31, 23, 59, 59, 999999),
          datetime(2026, 3, 29, 1, 30), datetime(2262, 4, 11, 23, 47, 16, 854775)]


@dataclass(frozen=True)
class SourceColumn:
    name: str
    type: str  # format_type(): "integer", "numeric(12,2)", "timestamp(3) without time zone", "text[]", ...
    nullable: bool
    labels: tuple[str, ...] = ()  # an enum's values


def columns_of(conn: Any, table: TableDecl) -> list[SourceColumn]:
    """The source table's columns, in order, with their types as PostgreSQL spells them."""
    rows = conn.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod), NOT a.attnotnull, "
        "       COALESCE((SELECT array_agg(e.enumlabel ORDER BY e.enumsortorder) FROM pg_enum e "
        "                 WHERE e.enumtypid = a.atttypid), '{}') "
        "FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        (table.schema, table.table)).fetchall()
    return [SourceColumn(name, kind, nullable, tuple(labels)) for name, kind, nullable, labels in rows]


class Values:
    """Random values of PostgreSQL types, as psycopg sends them."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def of(self, column: SourceColumn, *, key: bool = False) -> Any:
        if column.nullable and not key and self.rng.random() < 0.12:
            return None
        kind = column.type
        if kind.endswith("[]"):
            element = SourceColumn(column.name, kind[:-2], True, column.labels)
            return [self.of(element) for _ in range(self.rng.randint(0, 3))]
        return self._scalar(kind, column.labels, key)

    def _scalar(self, kind: str, labels: tuple[str, ...], key: bool) -> Any:
        rng = self.rng
        base = kind.split("(")[0]
        if labels:
            return rng.choice(labels)
        if base in ("smallint",):
            return rng.randint(1, 32767) if key else rng.randint(-32768, 32767)
        if base in ("integer",):
            return rng.randint(1, 2**31 - 1) if key else rng.randint(-2**31, 2**31 - 1)
        if base in ("bigint",):
            return rng.randint(1, 2**62) if key else rng.randint(-2**63, 2**63 - 1)
        if base in ("real",):
            return rng.choice([0.5, -1.25, 3.0, 0.375])  # exact in float32
        if base in ("double precision",):
            return rng.choice([0.1, -2.5e300, 1 / 3, 0.0, 123456.789])
        if base == "boolean":
            return rng.random() < 0.5
        if base == "numeric":
            precision, scale = _precision(kind)
            digits = rng.randint(0, max(0, precision - scale))
            whole = rng.randint(0, 10**digits - 1) if digits else 0
            fraction = rng.randint(0, 10**scale - 1) if scale else 0
            value = Decimal(whole) + (Decimal(fraction) / (10**scale) if scale else 0)
            return -value if rng.random() < 0.2 else value
        if base in ("text", "character varying", "character"):
            width = _precision(kind)[0] if "(" in kind else None
            text = "".join(rng.choice(string.ascii_lowercase) for _ in range(8)) if key else rng.choice(_TEXTS)
            return text[:width] if width else text
        if base == "date":
            return rng.choice(_DATES) if not key else date(2000, 1, 1) + timedelta(days=rng.randint(0, 9000))
        if base.startswith("timestamp"):
            value = rng.choice(_TIMES)
            if "(" in kind:  # timestamp(3): the column rounds; send what it keeps
                value = value.replace(microsecond=value.microsecond // 1000 * 1000)
            return value.replace(tzinfo=UTC) if "with time zone" in kind else value
        if base == "uuid":
            return uuid.UUID(int=rng.getrandbits(128))
        if base in ("json", "jsonb"):
            from psycopg.types.json import Json

            return Json({"k": rng.choice(_TEXTS), "n": [1, 2.5, None], "deep": {"x": rng.random() < 0.5}})
        if base == "bytea":
            return bytes(rng.choice([0, 1, 127, 255]) for _ in range(rng.randint(0, 12)))
        return None


def _precision(kind: str) -> tuple[int, int]:
    inside = kind[kind.index("(") + 1:kind.index(")")] if "(" in kind else "18,4"
    parts = [int(p) for p in inside.split(",")]
    return parts[0], parts[1] if len(parts) > 1 else 0


@dataclass
class DeclaredWorkload:
    """Random changes on the declared tables of a running source, each change its own transaction."""

    conn: Any  # a psycopg connection in autocommit mode
    declaration: Declaration
    seed: int = 7
    update_fraction: float = 0.45
    delete_fraction: float = 0.15
    rekey_fraction: float = 0.05

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.values = Values(self.rng)
        self.columns = {name: columns_of(self.conn, t) for name, t in self.declaration.tables.items()}
        for name, cols in self.columns.items():
            unknown = [c.name for c in cols if self.values.of(c, key=True) is None and not c.labels]
            if unknown:
                log.warning("%s: no values for %s (types %s): left to their defaults", name, unknown,
                            [c.type for c in cols if c.name in unknown])

    def play(self, changes: int, tables: list[str] | None = None) -> Counter[str]:
        """`changes` random changes spread over `tables` (default: every declared table)."""
        names = tables or list(self.declaration.tables)
        stats: Counter[str] = Counter()
        for _ in range(changes):
            name = self.rng.choice(names)
            stats[f"{name}.{self.change(name)}"] += 1
        return stats

    def change(self, name: str) -> str:
        """One random change of table `name`; returns what it was (insert, update, rekey, delete)."""
        t = self.declaration.tables[name]
        keys = self._keys(t)
        roll = self.rng.random()
        if keys and roll < self.delete_fraction:
            self._delete(t, self.rng.choice(keys))
            return "delete"
        if keys and roll < self.delete_fraction + self.rekey_fraction:
            old = self.rng.choice(keys)
            new = self._new_key(t)
            self._execute(f"UPDATE {_name(t)} SET {_set(t.key)} WHERE {_where(t.key)}", (*new, *old))
            return "rekey"
        if keys and roll < self.delete_fraction + self.rekey_fraction + self.update_fraction:
            key = self.rng.choice(keys)
            cols = [c for c in self.columns[name] if c.name not in t.key]
            if not cols:
                return "none"
            chosen = self.rng.sample(cols, k=self.rng.randint(1, len(cols)))
            self._execute(f"UPDATE {_name(t)} SET {_set([c.name for c in chosen])} WHERE {_where(t.key)}",
                          (*[self.values.of(c) for c in chosen], *key))
            return "update"
        self.insert(name)
        return "insert"

    def insert(self, name: str) -> None:
        t = self.declaration.tables[name]
        key = dict(zip(t.key, self._new_key(t), strict=True))
        cols = self.columns[name]
        row = {c.name: key[c.name] if c.name in key else self.values.of(c) for c in cols}
        self._execute(f"INSERT INTO {_name(t)} ({', '.join(_q(c) for c in row)}) "
                      f"VALUES ({', '.join(['%s'] * len(row))})", tuple(row.values()))

    def _delete(self, t: TableDecl, key: tuple) -> None:
        self._execute(f"DELETE FROM {_name(t)} WHERE {_where(t.key)}", key)

    def _new_key(self, t: TableDecl) -> tuple:
        by_name = {c.name: c for c in self.columns[t.name]}
        existing = set(self._keys(t))
        while True:
            key = tuple(self.values.of(by_name[k], key=True) for k in t.key)
            if key not in existing:
                return key

    def _keys(self, t: TableDecl) -> list[tuple]:
        return [tuple(r) for r in self.conn.execute(
            f"SELECT {', '.join(_q(k) for k in t.key)} FROM {_name(t)} ORDER BY 1 LIMIT 500").fetchall()]

    def _execute(self, sql: str, params: tuple) -> None:
        self.conn.execute(sql, params)


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _name(t: TableDecl) -> str:
    return f"{_q(t.schema)}.{_q(t.table)}"


def _set(columns: Any) -> str:
    return ", ".join(f"{_q(c)} = %s" for c in columns)


def _where(columns: Any) -> str:
    return " AND ".join(f"{_q(c)} = %s" for c in columns)


def source_rows(conn: Any, t: TableDecl) -> dict[tuple, dict[str, Any]]:
    """The table's rows as PostgreSQL holds them (the oracle), keyed by the declared key; json as its text."""
    columns = columns_of(conn, t)
    cols = [c.name for c in columns]
    select = ", ".join(f"{_q(c.name)}::text" if c.type.split("(")[0] in ("json", "jsonb") else _q(c.name)
                       for c in columns)
    rows = conn.execute(f"SELECT {select} FROM {_name(t)}").fetchall()
    return {tuple(r[cols.index(k)] for k in t.key): dict(zip(cols, r, strict=True)) for r in rows}
