"""What the lake holds of the subjects: their customers' rows, their orders (those that moved to other
customers included), and the texts (e-mail, name) that identify them.

The tables that hold customers and orders are named here once; the sweep, the purge and the
verification work through the same lists.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import hudi_configs
from pipelines.catalog import lake_tables, names
from pipelines.table_stats import has_completed_commit

# Tables whose rows hold a customer (key `id`), an order (key `id`), or name a customer (`customer_id`).
CUSTOMER_TABLES = tuple(names(holds="customer"))
ORDER_TABLES = tuple(names(holds="order"))
GOLD_BY_CUSTOMER = tuple(names("gold", holds="customer_id"))
# Texts shorter than this are not searched: they would be found everywhere.
MIN_TEXT = 4
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


# ---------------------------------------------------------------- what the lake holds of the subject


@dataclass
class Found:
    customers: set[int]
    orders: set[int]  # the subjects' orders: their newest version names one of the customers
    texts: set[str]
    shared_texts: int  # e-mails/names also held by another customer: checked by ids only
    # Orders an older version of which names one of the customers, and whose newest names
    # another: that customer's now. Only the versions naming the subject go.
    moved: set[int] = field(default_factory=set)
    named: set[int] = field(default_factory=set)  # customers some version of an order names


def read_rows(spark: SparkSession, path: str) -> DataFrame:
    return spark.read.format("hudi").options(**hudi_configs.section("reads", "scan")).load(path)


def customer_reads(spark: SparkSession, root: str) -> dict[str, DataFrame]:
    """Reads of the customer tables that exist, by name."""
    return {t.name: read_rows(spark, t.path) for t in lake_tables(root)
            if t.name in CUSTOMER_TABLES and has_completed_commit(t.path)}


def find_subject(spark: SparkSession, root: str, customer_ids: tuple[int, ...]) -> Found:
    """The customers' rows and orders anywhere in bronze and silver, and their e-mails and names."""
    tables = {t.name: t for t in lake_tables(root)}
    ids = list(customer_ids)
    customers, texts = set(), set()
    reads = customer_reads(spark, root)
    # One Spark job over every customer table (each job on a Hudi table pays its file listing).
    rows = [df.filter(F.col("id").isin(ids)).select(
        "id", *[F.col(c) if c in df.columns else F.lit(None).cast("string").alias(c) for c in ("email", "full_name")])
        for df in reads.values()]
    if rows:
        union = rows[0]
        for df in rows[1:]:
            union = union.unionByName(df)
        for r in union.distinct().collect():
            customers.add(r["id"])
            texts |= {v.strip() for v in (r["email"], r["full_name"]) if v and len(v.strip()) >= MIN_TEXT}
    orders, moved, named = _orders_of(spark, [tables[name].path for name in ORDER_TABLES], ids)
    shared = shared_texts(reads, ids, texts)
    return Found(customers, orders, texts - shared, len(shared), moved, named)


def _orders_of(spark: SparkSession, paths: list[str], ids: list[int]) -> tuple[set[int], set[int], set[int]]:
    """The orders any version of which names one of the customers: (theirs, moved to another customer, customers named).

    An order is the customers' when its newest version (by LSN, over every table that keeps
    versions of orders) names one of them; a later delete does not change whose it was.
    An order the source gave to someone else since is that customer's row now: it stays,
    and only its older versions naming the subject are erased.
    """
    versions = [df.select("id", "customer_id", F.col("_lsn").cast("long").alias("_lsn"))
                for path in paths if has_completed_commit(path)
                and {"id", "customer_id", "_lsn"} <= set((df := read_rows(spark, path)).columns)]
    if not versions:
        return set(), set(), set()
    union = versions[0]
    for df in versions[1:]:
        union = union.unionByName(df)
    subject = F.col("customer_id").isin(ids)
    newest = union.filter(F.col("customer_id").isNotNull()).groupBy("id").agg(
        F.max_by("customer_id", "_lsn").alias("owner"),
        F.collect_set(F.when(subject, F.col("customer_id"))).alias("named")).filter(F.size("named") > 0).collect()
    theirs = {r["id"] for r in newest if r["owner"] in ids}
    return theirs, {r["id"] for r in newest} - theirs, {c for r in newest for c in r["named"]}


def shared_texts(reads: dict[str, DataFrame], customer_ids: list[int], texts: set[str]) -> set[str]:
    """Texts that occur in another customer's e-mail or name (in `reads`, customer_reads): finding them proves nothing.

    Asked again at verification, not only when the subject is found: the source keeps
    creating customers, and a new one may carry the erased customer's name.
    """
    others = [df.filter(~F.col("id").isin(customer_ids)).select("email", "full_name")
              for df in reads.values() if "email" in df.columns]
    if not texts or not others:
        return set()
    union = others[0]
    for df in others[1:]:
        union = union.unionByName(df)
    values = F.lower(F.concat_ws("\n", "email", "full_name"))
    ordered = sorted(texts)
    hits = union.select(*[F.max(values.contains(t.lower()).cast("int")).alias(f"t{i}")
                          for i, t in enumerate(ordered)]).first()
    return {t for i, t in enumerate(ordered) if hits[f"t{i}"]}
