"""One table of the lake against its source: the digests compared, the differing buckets read row by row, and
every row that differs looked at again until it has settled.

A running stream is behind the source by up to a table's freshness target, so a difference seen once may be a
change on its way. Each differing key is read again on both sides after `settle` seconds: a key that matches
then was on its way; one that still differs while the source row stayed the same is drift; one whose source row
changed again is read again, up to `rounds` times, and reported as unsettled (not drift) if it never holds still.

Rows of erased customers (and erased rows) that the source still holds are not drift: the lake erased them on
purpose, and the erasure registry names them (`pipelines.lake.erasure_registry.without_erased`, the filter the
stream applies).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from psycopg import sql
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession

from pipelines.errors import ReconcileError
from pipelines.lake.declaration import TableDecl
from pipelines.lake.erasure_registry import read_registry, without_erased
from pipelines.lake.layout import main_path
from pipelines.lake.table_stats import has_completed_commit
from pipelines.reconcile.canonical import SourceColumn
from pipelines.reconcile.digest import (
    Row,
    Shape,
    bucket_of,
    differing,
    digits_for,
    lake_buckets,
    lake_frame,
    lake_rows,
    source_buckets,
    source_rows,
    source_rows_of,
)
from pipelines.runtime.lake import Lake
from pipelines.source.catalog import read_publication, split_name
from pipelines.source.membership import remember


@dataclass(frozen=True)
class Options:
    """`settle`: seconds between two looks at a differing key; `rounds`: how many looks after the first; `listed`:
    how many keys of each kind the report names."""

    settle: float = 30.0
    rounds: int = 3
    listed: int = 20


@dataclass
class TableReport:
    """What reconciling one table found. Keys are {column: canonical text}; `differ` adds the columns that
    differ with both sides' texts. `not_compared`: source columns of a type without a canonical form, or that
    bronze lacks (`source_only`).

    `layer`: what was reconciled, `bronze` against the source database, or `silver` / `silver_quarantine`
    against what the declaration makes of bronze (`pipelines.reconcile.silver`: there the source side is that
    expectation, the lake side the ETL's table, and `as_of` the version of bronze it was computed from)."""

    table: str
    source: str
    layer: str = "bronze"
    as_of: str | None = None
    source_rows: int = 0
    lake_rows: int = 0
    missing: list[dict[str, Any]] = field(default_factory=list)  # in the source, not in the lake
    extra: list[dict[str, Any]] = field(default_factory=list)  # in the lake, not in the source
    differ: list[dict[str, Any]] = field(default_factory=list)
    unsettled: list[dict[str, Any]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)  # every kind's full count (the lists stop at `listed`)
    not_compared: list[str] = field(default_factory=list)
    source_only: list[str] = field(default_factory=list)
    erased_left_out: int = 0
    buckets: int = 0
    buckets_differing: int = 0
    rows_read: dict[str, int] = field(default_factory=dict)  # rows moved out of each side row by row
    seconds: float = 0.0
    # Every drifted key of each kind (missing, extra, differ), not only the listed ones: what a heal re-delivers.
    keys: dict[str, list[dict[str, Any]]] = field(default_factory=dict, repr=False)

    @property
    def drift(self) -> bool:
        return any(self.counts.get(k) for k in ("missing", "extra", "differ"))

    def document(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "keys"} | {"drift": self.drift}


def source_columns(conn: Any, source: str) -> list[SourceColumn]:
    """The columns of the source table `schema.table` in their order, with their types (a domain's base type);
    ReconcileError when there is no such table."""
    schema, table = split_name(source)
    found = conn.execute(
        "SELECT a.attname, coalesce(b.typname, t.typname), coalesce(b.typcategory, t.typcategory) "
        "FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace "
        "JOIN pg_type t ON t.oid = a.atttypid LEFT JOIN pg_type b ON t.typtype = 'd' AND b.oid = t.typbasetype "
        "WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        (schema, table)).fetchall()
    if not found:
        raise ReconcileError(f"{source}: no such table in the source database")
    return [SourceColumn(name, typname, category if isinstance(category, str) else category.decode())
            for name, typname, category in found]


def shape_of(decl: TableDecl, columns: list[SourceColumn], bronze: DataFrame, rows: int,
             report: TableReport) -> Shape:
    """What is compared: the source's columns that bronze holds and that have a canonical form."""
    dtypes = dict(bronze.dtypes)
    compared = tuple(c for c in columns if c.name in dtypes and c.kind is not None)
    report.not_compared = [f"{c.name} ({c.typname})" for c in columns if c.kind is None]
    report.source_only = [c.name for c in columns if c.name not in dtypes and c.kind is not None]
    names = {c.name for c in compared}
    if lacking := [k for k in decl.key if k not in names]:
        raise ReconcileError(f"{decl.name}: key column(s) {', '.join(lacking)} cannot be compared (not in bronze, "
                             f"or of a type without a canonical form)")
    return Shape(compared, decl.key, dtypes, digits_for(rows))


def _relation(source: str) -> sql.Composable:
    schema, table = split_name(source)
    return sql.Identifier(schema, table)


def _estimate(conn: Any, source: str) -> int:
    schema, table = split_name(source)
    row = conn.execute("SELECT greatest(c.reltuples, 0)::bigint FROM pg_class c JOIN pg_namespace n ON "
                       "n.oid = c.relnamespace WHERE n.nspname = %s AND c.relname = %s", (schema, table)).fetchone()
    return int(row[0]) if row else 0


def reconcile_table(lake: Lake, conn: Any, name: str, options: Options = Options()) -> TableReport:
    """Reconcile bronze's `name` with its source table through `conn` (a connection to the source database)."""
    started = time.monotonic()
    decl = lake.declaration.tables[name]
    report = TableReport(name, decl.source)
    path = main_path(name, lake.root)
    if not has_completed_commit(path):
        raise ReconcileError(f"bronze/{name} has no commit yet: nothing to reconcile (has the stream run?)")
    spark = lake.spark
    member = read_publication(conn, lake.config.source.publication)  # before the look: what it was known whole as
    bronze = _snapshot(spark, path)
    shape = shape_of(decl, source_columns(conn, decl.source), bronze, _estimate(conn, decl.source), report)
    relation = _relation(decl.source)
    source, held = _digests(conn, relation, lake_frame(bronze, shape), shape, report)
    report.rows_read = {"source": len(source), "lake": len(held)}
    sides = _Sides(lake, conn, name, relation, shape)
    _settle(sides, _differing_keys(source, held), (source, held), options, report)
    if not report.drift and not report.counts.get("unsettled") and member and decl.source in member.memberships:
        remember(lake.root, {name: member.memberships[decl.source]})  # a gap before now is healed or harmless
    report.seconds = round(time.monotonic() - started, 3)
    return report


def _digests(conn: Any, relation: sql.Composable, frame: DataFrame, shape: Shape,
             report: TableReport) -> tuple[dict[str, Row], dict[str, Row]]:
    """Both sides' bucket sums, then the rows of the buckets that differ, each side's scans side by side.

    The lake's first scan keeps what it computed (`persist`): its second pass filters that instead of reading and
    merging bronze's files and hashing every row again, which at 10M rows cost longer than the first scan, and it
    sees the same snapshot as the sums did whatever the stream commits meanwhile."""
    frame = frame.persist(StorageLevel.MEMORY_AND_DISK)
    try:
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="reconcile-source") as pool:
            pending = pool.submit(source_buckets, conn, relation, shape)  # PostgreSQL's scan beside Spark's
            lake_sums = lake_buckets(frame)
            source_sums = pending.result()
            report.source_rows, report.lake_rows = (sum(n for n, _ in s.values()) for s in (source_sums, lake_sums))
            report.buckets = len(source_sums.keys() | lake_sums.keys())
            buckets = differing(source_sums, lake_sums)
            report.buckets_differing = len(buckets)
            if not buckets:
                return {}, {}
            rows = pool.submit(source_rows, conn, relation, shape, buckets)
            held = lake_rows(frame, buckets)
            return rows.result(), held
    finally:
        frame.unpersist()


def _snapshot(spark: SparkSession, path: str) -> DataFrame:
    """Bronze's live rows as of its newest commit, read once (its columns as the source's names)."""
    return spark.read.format("hudi").load(path)


def _differing_keys(source: dict[str, Row], held: dict[str, Row]) -> set[str]:
    return {k for k in source.keys() | held.keys() if _hash(source.get(k)) != _hash(held.get(k))}


@dataclass(frozen=True)
class _Sides:
    """The two sides of one table: the source relation through `conn`, bronze's table in `lake`."""

    lake: Lake
    conn: Any
    table: str
    relation: sql.Composable
    shape: Shape

    def rows(self, keys: dict[str, dict[str, Any]]) -> tuple[dict[str, Row], dict[str, Row]]:
        """Both sides' rows of `keys` ({key text: its key columns' texts}) now: PostgreSQL's looked up by key,
        bronze's from a scan of its newest snapshot for the keys' buckets."""
        buckets = sorted({bucket_of(k, self.shape.digits) for k in keys})
        held = lake_rows(lake_frame(_snapshot(self.lake.spark, main_path(self.table, self.lake.root)), self.shape),
                         buckets)
        return source_rows_of(self.conn, self.relation, self.shape, list(keys.values())), held


def _settle(sides: _Sides, keys: set[str], first: tuple[dict[str, Row], dict[str, Row]], options: Options,
            report: TableReport) -> None:
    """Look at the differing `keys` again until each matches, is drift (the source row held still while they
    differed) or has been looked at `options.rounds` times; the report gets each kind."""
    source, held = first
    shape = sides.shape
    drift: dict[str, tuple[Row | None, Row | None]] = {}
    if options.rounds == 0:  # a lake no stream writes: what differs now is drift
        drift = {k: (source.get(k), held.get(k)) for k in keys}
        keys = set()
    for _ in range(options.rounds):
        if not keys:
            break
        time.sleep(options.settle)
        now_source, now_held = sides.rows({k: _key_of(shape, source.get(k) or held.get(k)) for k in sorted(keys)})
        still = set()
        for key in keys:
            was, now, lake_now = source.get(key), now_source.get(key), now_held.get(key)
            if _hash(now) == _hash(lake_now):
                continue  # it was on its way
            if _hash(was) == _hash(now):
                drift[key] = (now, lake_now)
            else:
                still.add(key)
        keys, source = still, {**source, **now_source}
    report.unsettled = [_key_of(shape, source.get(k)) for k in sorted(keys)[:options.listed]]
    report.counts["unsettled"] = len(keys)
    _classify(sides.lake, shape, drift, options, report)


def _hash(row: Row | None) -> str | None:
    return None if row is None else row.hash


def _key_of(shape: Shape, row: Row | None) -> dict[str, Any]:
    if row is None:
        return {}
    texts = dict(zip([c.name for c in shape.columns], row.texts, strict=True))
    return {k: texts[k] for k in shape.key}


def _classify(lake: Lake, shape: Shape, drift: dict[str, tuple[Row | None, Row | None]], options: Options,
              report: TableReport) -> None:
    """Sort the drifted keys into missing, extra and differ; source rows of erased subjects left out."""
    missing = {k: s for k, (s, h) in drift.items() if h is None and s is not None}
    erased = _erased(lake, shape, report.table, list(missing.values()))
    report.erased_left_out = len(erased)
    kept_missing = [r for k, r in sorted(missing.items()) if _key_of(shape, r) not in erased]
    extra = [h for _, (s, h) in sorted(drift.items()) if s is None and h is not None]
    both = [(s, h) for _, (s, h) in sorted(drift.items()) if s is not None and h is not None]
    report.counts.update(missing=len(kept_missing), extra=len(extra), differ=len(both))
    report.keys = {"missing": [_key_of(shape, r) for r in kept_missing], "extra": [_key_of(shape, r) for r in extra],
                   "differ": [_key_of(shape, s) for s, _ in both]}
    report.missing = [_key_of(shape, r) for r in kept_missing[:options.listed]]
    report.extra = [_key_of(shape, r) for r in extra[:options.listed]]
    names = [c.name for c in shape.columns]
    report.differ = [{"key": _key_of(shape, s), "columns": {
        n: {"source": a, "lake": b} for n, a, b in zip(names, s.texts, h.texts, strict=True) if a != b}}
        for s, h in both[:options.listed]]


def _erased(lake: Lake, shape: Shape, table: str, rows: list[Row]) -> list[dict[str, Any]]:
    """The keys of `rows` (source rows the lake lacks) that the erasure registry names: rows the lake erased."""
    decl = lake.declaration.tables[table]
    registry = read_registry(lake.spark, lake.root) if rows and decl.subject is not None else None
    if registry is None:
        return []
    names = [c.name for c in shape.columns]
    needed = [n for n in dict.fromkeys([*decl.key, decl.subject]) if n in names]
    # Canonical texts cast back to bronze's types: exact for the integer and text columns subjects and keys are.
    values = [tuple(r.texts[names.index(n)] for n in needed) for r in rows]
    frame = lake.spark.createDataFrame(values, ", ".join(f"`{n}` string" for n in needed))
    frame = frame.select(*[frame[f"`{n}`"].cast(shape.dtypes[n]).alias(n) for n in needed])
    kept = {tuple(str(r[n]) for n in decl.key) for r in without_erased(
        frame, table, registry, lake.erasure_key, lake.declaration).collect()}
    return [_key_of(shape, r) for r, v in zip(rows, values, strict=True)
            if tuple(str(v[needed.index(k)]) for k in decl.key) not in kept]
