"""Many declared tables of mixed shapes with skewed traffic: what `lakehouse dev bench tables` puts on Kafka.

A real source has tens of tables, a few of them busy and most of them nearly idle. Here table `i`
(busiest first) gets a Zipf share of the records, `(1/i^s) / sum_j 1/j^s`: with s = 2 the first 5
of 50 tables take 90% of them, and the last few a record every few seconds at 2,000 records/s.
Shapes vary from table to table: the key (bigint, integer, text, uuid, or composite of text and
bigint or of integer and bigint) and the columns, from 1 to all 17 of section 7's types
(`declared_envelopes.TYPES`), so that wide and narrow tables, composite keys and every wire type
run through one stream. Every table is typed (its records carry their Connect schema, as the
contract wants for tables beyond the shop).

Pure Python (no Spark, no Kafka): the shares, the shapes, their declaration and their records.
"""

from __future__ import annotations

import random
import uuid
from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from lakehouse_dev.generator.declared_envelopes import (
    PREFIX,
    TYPES,
    Column,
    DeclaredSource,
    DeclaredTable,
    random_values,
    unchanged,
)
from lakehouse_dev.generator.values import Message
from pipelines.lake.declaration import DEFAULT_FRESHNESS_SECONDS

_REGIONS = ("eu", "us", "apac", "latam")
# Key columns by kind: named apart from TYPES' columns, which a table's values are drawn from.
KEYS: dict[str, tuple[Column, ...]] = {
    "bigint": (("id", {"type": "int64"}, unchanged),),
    "text+bigint": (("region", {"type": "string"}, unchanged), ("order_no", {"type": "int64"}, unchanged)),
    "uuid": (("uid", {"type": "string", "name": "io.debezium.data.Uuid", "version": 1}, unchanged),),
    "integer+bigint": (("shard", {"type": "int32"}, unchanged), ("seq", {"type": "int64"}, unchanged)),
    "text": (("code", {"type": "string"}, unchanged),),
    "integer": (("num_id", {"type": "int32"}, unchanged),),
}
# The change mix of the steady phase, per change of a table holding rows (an empty one gets an insert).
# A delete is two records (its tombstone), a key update three (delete, tombstone, create).
DELETE_SHARE = 0.10
REKEY_SHARE = 0.02
UPDATE_SHARE = 0.50
# Snapshot rows of the quietest tables: a table with a handful of rows still has a timeline to read.
MIN_SNAPSHOT_ROWS = 20


def zipf_shares(n: int, exponent: float) -> list[float]:
    """Each of `n` tables' share of the records, busiest first: Zipf with `exponent`, summing to 1."""
    if n < 1:
        raise ValueError("at least one table")
    weights = [1 / (rank ** exponent) for rank in range(1, n + 1)]
    total = sum(weights)
    return [w / total for w in weights]


def _key(kind: str, n: int) -> tuple:
    """The `n`th key of a table of key `kind`: distinct for distinct n, deterministic."""
    if kind == "bigint":
        return (n,)
    if kind == "integer":
        return (n,)
    if kind == "text":
        return (f"k{n:09d}",)
    if kind == "uuid":
        return (str(uuid.UUID(int=(n * 0x9E3779B97F4A7C15F39CC0605CEDC835) % 2**128)),)
    if kind == "text+bigint":
        return (_REGIONS[n % len(_REGIONS)], n)
    if kind == "integer+bigint":
        return (n % 16, n)
    raise ValueError(f"unknown key kind {kind!r}")


@dataclass(frozen=True)
class Shape:
    """One declared table: its lake name, key kind, value columns (names of TYPES), share and target."""

    name: str
    key_kind: str
    columns: tuple[str, ...]
    share: float
    freshness_seconds: float = DEFAULT_FRESHNESS_SECONDS

    @property
    def key(self) -> tuple[str, ...]:
        return tuple(c for c, _, _ in KEYS[self.key_kind])

    @cached_property
    def table(self) -> DeclaredTable:
        """Its envelopes' maker (declared_envelopes): every non-key column nullable, values across each type."""
        columns = self.columns
        return DeclaredTable(self.name, self.key, [*KEYS[self.key_kind], *(TYPES[c] for c in columns)],
                             lambda rng, _: random_values(rng, columns))


def table_shapes(n: int, exponent: float, seed: int, target: float = DEFAULT_FRESHNESS_SECONDS,
                 cold_target: float | None = None, hot: int = 5) -> list[Shape]:
    """`n` tables busiest first (`t00`, `t01`, ...): key kinds in turn (so the busiest tables have different
    keys, composite ones among them), a random number of random columns each. The first `hot` tables get
    freshness target `target`, the others `cold_target` (default the same)."""
    rng = random.Random(seed)
    kinds = list(KEYS)
    width = len(str(n - 1))
    names = list(TYPES)
    shapes = []
    for i, share in enumerate(zipf_shares(n, exponent)):
        picked = set(rng.sample(names, rng.randint(1, len(names))))
        shapes.append(Shape(f"t{i:0{width}d}", kinds[i % len(kinds)], tuple(c for c in names if c in picked), share,
                            target if i < hot or cold_target is None else cold_target))
    return shapes


def declaration_toml(shapes: list[Shape]) -> str:
    """The tables' declaration (contract section 7): what LAKEHOUSE_TABLES names for the ingest."""
    lines = ["# Made by `lakehouse dev bench tables` (dev/lakehouse_dev/bench/table_mix.py).", "",
             "[source]", f'topic_prefix = "{PREFIX}"']
    for s in shapes:
        key = ", ".join(f'"{k}"' for k in s.key)
        lines += ["", f"[tables.{s.name}]", f'source = "public.{s.name}"', f"key = [{key}]",
                  f"freshness_seconds = {s.freshness_seconds:g}"]
    return "\n".join(lines) + "\n"


def write_declaration(shapes: list[Shape], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(declaration_toml(shapes))
    return path


def snapshot_rows(shapes: list[Shape], rows: int) -> dict[str, int]:
    """Rows of each table's snapshot: about `rows` in all by share, at least MIN_SNAPSHOT_ROWS each."""
    return {s.name: max(MIN_SNAPSHOT_ROWS, round(rows * s.share)) for s in shapes}


class _KeyPool:
    """A table's live keys, a random one drawn in constant time (a hot table holds 100,000s)."""

    def __init__(self) -> None:
        self.keys: list[tuple] = []
        self.index: dict[tuple, int] = {}

    def add(self, key: tuple) -> None:
        self.index[key] = len(self.keys)
        self.keys.append(key)

    def remove(self, key: tuple) -> None:
        at, last = self.index.pop(key), self.keys.pop()
        if last != key:
            self.keys[at] = last
            self.index[last] = at

    def draw(self, rng: random.Random) -> tuple | None:
        return self.keys[rng.randrange(len(self.keys))] if self.keys else None


class TableMix:
    """The source of `shapes`: their snapshot, then changes spread over them by their shares.

    One generator per set of tables: two mixes of the same shapes and seed make the same records,
    which is how `bench tables` gives a deployment of 3 tables and one of 50 the same changes.
    """

    def __init__(self, shapes: list[Shape], seed: int) -> None:
        self.shapes = {s.name: s for s in shapes}
        self.source = DeclaredSource([s.table for s in shapes], seed)
        self.rng = random.Random(seed + 1)
        self.pools = {s.name: _KeyPool() for s in shapes}
        self.issued: Counter[str] = Counter()
        self._names = [s.name for s in shapes]
        self._weights = [s.share for s in shapes]

    def _new_key(self, name: str) -> tuple:
        self.issued[name] += 1
        return _key(self.shapes[name].key_kind, self.issued[name])

    def _insert(self, name: str, op: str = "c") -> list[Message]:
        key = self._new_key(name)
        self.pools[name].add(key)
        return self.source.insert(self.shapes[name].table, key, op=op)

    def snapshot(self, rows: dict[str, int]) -> list[Message]:
        """Each table's snapshot rows (`op` r), table by table."""
        return [m for name, n in rows.items() for _ in range(n) for m in self._insert(name, op="r")]

    def change(self, name: str) -> list[Message]:
        """One change of table `name`: an insert, update, delete or key update, by the shares above."""
        pool, table = self.pools[name], self.shapes[name].table
        key, roll = pool.draw(self.rng), self.rng.random()
        if key is None or roll >= DELETE_SHARE + REKEY_SHARE + UPDATE_SHARE:
            return self._insert(name)
        if roll < DELETE_SHARE:
            pool.remove(key)
            return self.source.delete(table, key)
        if roll < DELETE_SHARE + REKEY_SHARE:
            new = self._new_key(name)
            pool.remove(key)
            pool.add(new)
            return self.source.rekey(table, key, new)
        return self.source.update(table, key)

    def changes(self, records: int) -> list[Message]:
        """Exactly `records` Kafka records of changes, each change's table drawn by share."""
        out: list[Message] = []
        while len(out) < records:
            for name in self.rng.choices(self._names, self._weights, k=max(1, (records - len(out)) // 2)):
                out += self.change(name)
        return out[:records]


def record_shares(offsets: dict[str, list[int]], topics: dict[str, str]) -> dict[str, float]:
    """Each table's share of the Kafka records between two positions ({"topic/partition": [start, end]})."""
    per_topic: Counter[str] = Counter()
    for tp, (start, end) in offsets.items():
        per_topic[tp.rsplit("/", 1)[0]] += end - start
    total = sum(per_topic.values()) or 1
    return {t: per_topic[topic] / total for t, topic in topics.items()}


def top_share(shares: dict[str, float] | list[float], k: int) -> float:
    """The share of the `k` largest."""
    values = shares.values() if isinstance(shares, dict) else shares
    return sum(sorted(values, reverse=True)[:k])


def describe(shape: Shape) -> dict[str, Any]:
    """A table's shape as the figures show it."""
    return {"table": shape.name, "key": shape.key_kind, "columns": len(shape.key) + len(shape.columns),
            "share": round(shape.share, 5), "target": shape.freshness_seconds}
