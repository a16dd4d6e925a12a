"""What the lake holds of the subjects: the rows of every declared table whose `subject` column names them
(rows that moved to other customers since included), and the texts (their `pii` values) that identify them.

Every declared table with a `subject` is erased the same way (contract section 7), whatever its key:
a row, known by its own key (`key_text`: any number of columns, of any type), is the subjects' when its
newest version (by LSN, over every table that keeps versions of it) names one of them; a later delete
does not change whose it was. It goes entirely, every version. A row the source has given to another
customer since is that customer's now: it stays, and only its older versions naming the subject go.
A table keyed by its subject alone (the shop's customers: `erasure_kind` `customer`) is the case whose
rows cannot move. The erased rows are kept per table (`Target.rows`), never mixed: two tables may share
key values. The sweep, the purge and the verification work through the same lists.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import reduce
from typing import TypeVar

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

import hudi_configs
from pipelines.gdpr.scan import Subject
from pipelines.lake.catalog import Holds, erasure_kind, lake_catalog, lake_tables, names
from pipelines.lake.declaration import Declaration, TableDecl
from pipelines.lake.erasure_registry import key_in, key_text, subject_in
from pipelines.lake.table_stats import has_completed_commit
from pipelines.runtime.lake import Lake

# Texts shorter than this are not searched: they would be found everywhere.
MIN_TEXT = 4
# The shop's orders: gold's state lists their ids, and the quality results' `id` checks of them.
ORDERS = "orders"
T = TypeVar("T")
R = TypeVar("R")


def each_table(items: Iterable[T], work: Callable[[T], R]) -> list[R]:
    """`work` of every item, `[erasure] tables_at_once` at a time (threads of this driver), in order.

    Tables are independent writes (each its own commits and lock), so their sweeps and
    purges may overlap; an error is raised once every table has been worked on.
    """
    workers = int(hudi_configs.section("gdpr", "erasure")["tables_at_once"])
    items = list(items)
    if workers <= 1 or len(items) <= 1:
        return [work(item) for item in items]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="erasure") as pool:
        return list(pool.map(work, items))


def subject_tables(decl: Declaration) -> dict[str, TableDecl]:
    """The tables of `decl` with a `subject` column, by name: those the erasure finds rows of."""
    return {n: t for n, t in decl.tables.items() if t.subject}


def source_of(name: str, decl: Declaration) -> TableDecl | None:
    """The declared table with a `subject` whose rows lake table `name` holds (its bronze, change log, ledger,
    silver or quarantine); None for gold, the dead letters and tables of no subject."""
    sources = {t.name: t.source for t in lake_catalog(decl)}
    return subject_tables(decl).get(sources.get(name) or "")


def gold_by_customer(decl: Declaration) -> tuple[str, ...]:
    """Gold's tables keyed by the customer (`customer_id`): none when `decl` lacks gold's inputs."""
    return tuple(names(decl, "gold", holds=Holds.CUSTOMER_ID))


# ---------------------------------------------------------------- what one run erases


@dataclass(frozen=True)
class Target:
    """What one run erases: the customers, and per declared table the keys (`key_text`) of the rows that are
    theirs (`rows`) and of those now of another customer whose older versions name them (`moved`).

    `decl` is the declaration those tables are named in: their keys, subject columns and lake tables.
    """

    customers: tuple[int, ...]
    rows: dict[str, frozenset[str]] = field(default_factory=dict)
    moved: dict[str, frozenset[str]] = field(default_factory=dict)
    decl: Declaration = field(kw_only=True, repr=False, compare=False)

    def _ids(self, keys: dict[str, frozenset[str]]) -> list[int]:
        """The shop's orders among `keys`: ids of `orders`, when it is keyed by an integer `id`."""
        decl = self.decl.tables.get(ORDERS)
        if decl is None or decl.key != ("id",):
            return []
        return sorted(int(v) for t in keys.get(ORDERS, ()) if (v := json.loads(t)[0]) is not None and v.isdigit())

    @property
    def orders(self) -> list[int]:
        return self._ids(self.rows)

    @property
    def moved_orders(self) -> list[int]:
        return self._ids(self.moved)

    def subject(self, texts: Iterable[str]) -> Subject:
        """What the file scan looks for: the ids, the erased rows' keys per table, the texts."""
        rows = {t: frozenset(tuple(json.loads(k)) for k in keys) for t, keys in self.rows.items()
                if keys and (d := self.decl.tables.get(t)) is not None and d.key != (d.subject,)}
        return Subject(frozenset(self.customers), frozenset(self.orders), frozenset(texts), rows)

    def predicate(self, name: str, df: DataFrame) -> Column | None:
        """The rows of a read of lake table `name` that hold the subject: theirs, and any version naming them."""
        if name in gold_by_customer(self.decl):
            return F.col("customer_id").isin(list(self.customers)) if self.customers else None
        decl = source_of(name, self.decl)
        if decl is None or decl.subject is None:
            return None
        return of_subject(decl, df, self.customers, self.rows.get(decl.name, frozenset()))


def of_subject(decl: TableDecl, df: DataFrame, customers: Iterable[int], rows: frozenset[str]) -> Column | None:
    """Rows of `df` (of declared table `decl`) whose subject column names a customer, or whose key is in `rows`.

    A row's version that names another customer is not the subject's (it stays) unless its key is
    one of theirs; a version naming them goes whatever the row's newest says (a row that moved).
    """
    customers = list(customers)
    types = dict(df.dtypes)
    checks = [subject_in(decl.subject, types[decl.subject], customers)] \
        if customers and decl.subject and decl.subject in types else []
    if rows and all(c in types for c in decl.key):
        checks.append(key_in(decl.key, rows))
    return reduce(lambda a, b: a | b, checks) if checks else None


# ---------------------------------------------------------------- what the lake holds of the subject


@dataclass
class Found:
    customers: set[int]  # customers a table keyed by them holds a row of
    texts: set[str]
    shared_texts: int  # pii values also held by another customer's rows: checked by ids only
    rows: dict[str, set[str]] = field(default_factory=dict)  # per table, keys of the rows whose newest names them
    # Per table, keys of the rows an older version of which names one of the customers, and whose
    # newest names another: that customer's now. Only the versions naming the subject go.
    moved: dict[str, set[str]] = field(default_factory=dict)
    named: set[int] = field(default_factory=set)  # customers some version of a row names
    key_types: dict[str, tuple[str, ...]] = field(default_factory=dict)  # per table, its key columns' Spark types

    def target(self, customers: Iterable[int], decl: Declaration) -> Target:
        """What a run erases of `customers`: the rows found, of `decl`'s tables (those `find_subject` read)."""
        return Target(tuple(sorted(set(customers))), {t: frozenset(k) for t, k in self.rows.items()},
                      {t: frozenset(k) for t, k in self.moved.items()}, decl=decl)


def read_rows(spark: SparkSession, path: str) -> DataFrame:
    return spark.read.format("hudi").options(**hudi_configs.section("reads", "scan")).load(path)


def subject_reads(lake: Lake) -> list[tuple[TableDecl, DataFrame]]:
    """Reads of every lake table that holds rows of a declared table with a subject (those that exist)."""
    decl = lake.declaration
    decls = subject_tables(decl)
    sources = {t.name: t.source for t in lake_catalog(decl) if t.source is not None}
    return [(decls[sources[t.name]], read_rows(lake.spark, t.path)) for t in lake_tables(lake.root, decl)
            if sources.get(t.name) in decls and has_completed_commit(t.path)]


def _union(frames: list[DataFrame]) -> DataFrame | None:
    return reduce(lambda a, b: a.unionByName(b), frames) if frames else None


def find_subject(lake: Lake, customer_ids: tuple[int, ...]) -> Found:
    """The customers' rows (theirs, and those that moved) in every declared table with a subject, and their pii."""
    ids = [str(c) for c in customer_ids]
    reads = subject_reads(lake)
    rows, moved, named = _rows_of(reads, ids)
    target = Target(tuple(customer_ids), {t: frozenset(k) for t, k in rows.items()}, decl=lake.declaration)
    # One Spark job over every table (each job on a Hudi table pays its file listing).
    held = _union([df.filter(cond).select(
        F.lit(decl.name).alias("_table"),
        (F.trim(F.col(decl.subject).cast("string")) if decl.subject in df.columns else F.lit(None).cast("string"))
        .alias("_subject"), pii_values(decl, df).alias("_pii"))
        for decl, df in reads if (cond := of_subject(decl, df, customer_ids, target.rows.get(decl.name, frozenset())))
        is not None])
    customers, texts = set(), set()
    kinds = {n: erasure_kind(t) for n, t in subject_tables(lake.declaration).items()}
    for r in held.distinct().collect() if held is not None else []:
        if kinds.get(r["_table"]) == Holds.CUSTOMER and r["_subject"] in ids:
            customers.add(int(r["_subject"]))
        texts |= {v.strip() for v in r["_pii"] or () if v and len(v.strip()) >= MIN_TEXT}
    shared = shared_texts(reads, target, texts)
    key_types: dict[str, tuple[str, ...]] = {}
    for decl, df in reads:
        types = dict(df.dtypes)
        if all(c in types for c in decl.key):
            key_types.setdefault(decl.name, tuple(types[c] for c in decl.key))
    return Found(customers, texts - shared, len(shared), rows, moved, named, key_types)


def pii_values(decl: TableDecl, df: DataFrame) -> Column:
    """The row's `pii` values as an array of texts (an array column's elements each); those `df` lacks are left out."""
    types = dict(df.dtypes)
    parts = [F.col(c).cast("array<string>") if types[c].startswith("array") else F.array(F.col(c).cast("string"))
             for c in decl.pii if c in types]
    return F.flatten(F.array(*parts)) if parts else F.array().cast("array<string>")


def _rows_of(reads: list[tuple[TableDecl, DataFrame]], ids: list[str]
             ) -> tuple[dict[str, set[str]], dict[str, set[str]], set[int]]:
    """Per table, the rows any version of which names one of the customers: (theirs, moved to another, customers named).

    A table keyed by its subject is included: its rows name their customer in every version, so
    they are theirs exactly when they are the customer's.
    """
    versions = [df.select(F.lit(decl.name).alias("_table"), key_text(decl.key).alias("_key"),
                          F.trim(F.col(decl.subject).cast("string")).alias("_subject"),
                          F.col("_lsn").cast("long").alias("_lsn"))
                for decl, df in reads
                if decl.subject is not None and {*decl.key, decl.subject, "_lsn"} <= set(df.columns)]
    union = _union(versions)
    if union is None:
        return {}, {}, set()
    subject = F.col("_subject").isin(ids)
    newest = union.filter(F.col("_subject").isNotNull()).groupBy("_table", "_key").agg(
        F.max_by("_subject", "_lsn").alias("owner"),
        F.collect_set(F.when(subject, F.col("_subject"))).alias("named")).filter(F.size("named") > 0).collect()
    theirs: dict[str, set[str]] = {}
    moved: dict[str, set[str]] = {}
    for r in newest:
        (theirs if r["owner"] in ids else moved).setdefault(r["_table"], set()).add(r["_key"])
    return theirs, moved, {int(c) for r in newest for c in r["named"]}


def shared_texts(reads: list[tuple[TableDecl, DataFrame]], target: Target, texts: set[str]) -> set[str]:
    """Texts that occur in the pii of another customer's rows (in `reads`, subject_reads): finding them proves nothing.

    Asked again at verification, not only when the subject is found: the source keeps
    creating rows, and a new customer may carry the erased customer's name.
    """
    others = []
    for decl, df in reads:
        if not any(c in df.columns for c in decl.pii):
            continue
        mine = of_subject(decl, df, target.customers, target.rows.get(decl.name, frozenset()))
        rows = df.filter(~F.coalesce(mine, F.lit(False))) if mine is not None else df
        others.append(rows.select(F.lower(F.concat_ws("\n", pii_values(decl, df))).alias("_values")))
    union = _union(others)
    if not texts or union is None:
        return set()
    ordered = sorted(texts)
    hits = union.select(*[F.max(F.col("_values").contains(t.lower()).cast("int")).alias(f"t{i}")
                          for i, t in enumerate(ordered)]).first()
    assert hits is not None, "an aggregate without grouping has one row"
    return {t for i, t in enumerate(ordered) if hits[f"t{i}"]}
