"""The erasure registry: pseudonyms of erased customers and of their rows in declared tables, the key
that makes them, and the filters that honour them.

Written by `lakehouse gdpr erase` (pipelines.gdpr.erase); read by every job that brings source
data into the lake (ingest, silver), so that a replayed or late event of an erased customer
is dropped on its way in and the customer cannot come back. It lives below the layers that
read it for that reason. Only keyed hashes are stored: the registry holds no personal data.

Ids are pseudonymised with a keyed hash wherever the erasure keeps a record (this registry,
the certificate, the audit log). Source ids are small sequential integers: an unkeyed hash of
one is reversed by hashing every integer, so the key (pipelines.runtime.secrets: never kept in the
lake) is what makes the records non-personal for whoever can read the lake.

Every declared table with a `subject` column (contract section 7) is filtered: a change goes when
its subject column names an erased customer (`customer` pseudonyms), or when its key is that of an
erased row of that table (`row` pseudonyms: a row whose newest version named the customer, so
that a replayed older version of it, or its delete, cannot bring it back under any customer). A
row's pseudonym hashes the table's name with its key (`key_text`: every key column as text, in
the declared order), so a composite key of any type works and two tables sharing key values never
share pseudonyms. The shop's orders keep the `order` pseudonym of their id that registries held
before rows of any table were registered (`row_pseudonym`).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Literal, get_args

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.lake.declaration import Declaration
from pipelines.lake.layout import gdpr_path
from pipelines.lake.table_stats import has_completed_commit

SubjectKind = Literal["customer", "order", "row"]  # what a pseudonym stands for
KINDS: tuple[SubjectKind, ...] = get_args(SubjectKind)
# The pseudonyms of the shop's orders (`order:<id>`), from before any table's rows were registered.
LEGACY_ORDERS = ("orders", ("id",))


def subject_hash(kind: SubjectKind, value: int, key: str) -> str:
    """Pseudonym of a customer or (the shop's) order id; `hash_column` computes the same in Spark."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: expected one of {KINDS}")
    return hashlib.sha256(f"{key}:{kind}:{value}".encode()).hexdigest()


def hash_column(kind: SubjectKind, column: Column, key: str) -> Column:
    """Spark's `subject_hash`: the same pseudonym for the same id."""
    return F.sha2(F.concat(F.lit(f"{key}:{kind}:"), column.cast("string")), 256)


def key_text(columns: tuple[str, ...] | list[str]) -> Column:
    """A row's key as one text: a JSON array of its key columns' values as Spark casts them to text.

    The one form in which the erasure names a row of any table (a composite key, of any column
    types): what it registers, what it filters and what its sweep deletes are this text, computed by
    Spark from the typed columns wherever the row is, so the three always agree.
    """
    return F.to_json(F.array(*[F.col(c).cast("string") for c in columns]))


def key_in(columns: tuple[str, ...] | list[str], texts: set[str] | frozenset[str]) -> Column:
    """Rows whose key (`key_text`) is one of `texts`; a single column is compared as itself (cheaper, same rows)."""
    if len(columns) == 1:
        values = {json.loads(t)[0] for t in texts}
        return F.col(columns[0]).cast("string").isin(sorted(v for v in values if v is not None))
    return key_text(columns).isin(sorted(texts))


def subject_in(column: str, dtype: str, customers: list[int] | tuple[int, ...]) -> Column:
    """Rows whose subject column names one of the customers: as numbers in an integer column, as text otherwise."""
    if dtype in ("bigint", "int", "smallint", "tinyint"):
        return F.col(column).isin(list(customers))
    return F.trim(F.col(column).cast("string")).isin([str(c) for c in customers])


def _legacy_orders(table: str, key_columns: tuple[str, ...]) -> bool:
    return (table, tuple(key_columns)) == LEGACY_ORDERS


def row_pseudonym(table: str, key_columns: tuple[str, ...], text: str, key: str) -> tuple[str, str]:
    """(pseudonym, kind) of a row of `table` whose key is `text` (`key_text`); `row_hash_column` in Spark.

    The shop's orders keep `order:<id>`, as registries written before held them (an order erased
    then stays out for good); every other table's row hashes the table's name and the key text.
    """
    if _legacy_orders(table, key_columns):
        return subject_hash("order", int(json.loads(text)[0]), key), "order"
    return hashlib.sha256(f"{key}:row:{table}:{text}".encode()).hexdigest(), "row"


def row_hash_column(table: str, key_columns: tuple[str, ...], key: str, key_of: Column | None = None) -> Column:
    """Spark's `row_pseudonym`: the same pseudonym for a row of `table` (`key_of`: its key text, else `key_text`)."""
    text = key_of if key_of is not None else key_text(key_columns)
    if _legacy_orders(table, key_columns):
        return hash_column("order", F.get_json_object(text, "$[0]"), key)
    return F.sha2(F.concat(F.lit(f"{key}:row:{table}:"), text), 256)


def registry_path(root: str) -> str:
    return f"{gdpr_path(root)}/erased"


def read_registry(spark: SparkSession, root: str) -> DataFrame | None:
    """(subject, kind) of every erased customer and row; None before the first erasure."""
    path = registry_path(root)
    if not has_completed_commit(path):
        return None
    return spark.read.format("hudi").load(path).select("subject", "kind")


def without_erased(changes: DataFrame, table: str, registry: DataFrame | None, key: str,
                   declaration: Declaration) -> DataFrame:
    """Source changes of declared `table` minus those of erased customers and of their rows (ingest and silver).

    A table without a `subject` holds nobody's rows: nothing is filtered. Otherwise a change goes
    when its subject column names an erased customer, or its key is an erased row's (a delete's
    image may carry the key only).
    """
    decl = declaration.tables.get(table)
    if registry is None or decl is None or decl.subject is None:
        return changes
    erased = F.broadcast(registry.select("subject").distinct())
    out = changes
    if decl.subject in out.columns:
        out = out.join(erased, hash_column("customer", out[decl.subject], key) == erased["subject"], "left_anti")
    if decl.key != (decl.subject,) and all(c in out.columns for c in decl.key):
        out = out.join(erased, row_hash_column(table, decl.key, key) == erased["subject"], "left_anti")
    return out


def dead_letters_without_erased(rows: DataFrame, registry: DataFrame | None, key: str,
                                decl: Declaration) -> DataFrame:
    """Dead letters minus records whose Kafka key or envelope names an erased customer or order."""
    return rows if registry is None else _by_erased(rows, registry, key, decl, "left_anti")


def dead_letters_of_erased(rows: DataFrame, registry: DataFrame, key: str, decl: Declaration) -> DataFrame:
    """The dead letters whose Kafka key or envelope names an erased customer or order."""
    return _by_erased(rows, registry, key, decl, "left_semi")


def _by_erased(rows: DataFrame, registry: DataFrame, key: str, decl: Declaration, how: str) -> DataFrame:
    erased = F.broadcast(registry.select("subject").distinct())
    return rows.withColumn("_h", dead_letter_hashes(rows, key, decl)).join(
        erased, F.array_contains(F.col("_h"), erased["subject"]), how).drop("_h")


def dead_letter_hashes(rows: DataFrame, key: str, decl: Declaration) -> Column:
    """Pseudonyms of every id a dead letter may name: its Kafka key, and the (customer) ids of its envelope.

    A dead letter is a record that could not be read, so it is searched as text: by its topic's
    declared table, the subject column's values in the value (`"<subject>": N`) are customers, and
    the Kafka key names the row (its key columns' values, as `key_text` renders them for text and
    integers). `customer_id` anywhere, and on a topic no declared table has, `id` too, count as
    customers: whatever the record was, a customer's id there is theirs.
    """
    text = F.col("value").cast("string")
    raw_key = F.col("key").cast("string")
    topic = F.col("kafka_topic")

    def numbers(name: str, where: Column = text) -> Column:
        return F.regexp_extract_all(where, F.lit(rf'"{re.escape(name)}"\s*:\s*"?(\d+)'), F.lit(1))

    def customers(ids: Column) -> Column:
        return F.transform(F.filter(ids, lambda x: x.isNotNull()), lambda x: hash_column("customer", x, key))

    empty = F.array().cast("array<string>")
    hashes = customers(numbers("customer_id"))
    undeclared = ~topic.isin(list(decl.topics()))
    hashes = F.concat(hashes, F.when(undeclared, customers(F.concat(numbers("id"), numbers("id", raw_key))))
                      .otherwise(empty))
    for name, t in decl.tables.items():
        if not t.subject:
            continue
        mine = customers(F.concat(numbers(t.subject), numbers(t.subject, raw_key)))
        if t.key != (t.subject,):  # a row of its own key: the Kafka key (or the value's single key field) names it
            mine = F.concat(mine, _row_hashes(name, t.key, raw_key, numbers(t.key[0]) if len(t.key) == 1 else None,
                                              key))
        hashes = F.concat(hashes, F.when(topic == decl.topic(name), mine).otherwise(empty))
    return hashes


def _row_hashes(table: str, columns: tuple[str, ...], raw_key: Column, values: Column | None, key: str) -> Column:
    """Row pseudonyms of a dead letter of `table`: its Kafka key's columns, and `values` of a single key column."""
    def field(c: str) -> Column:  # a key with its Connect schema has its columns under `payload`
        return F.coalesce(F.get_json_object(raw_key, f"$.{c}"), F.get_json_object(raw_key, f"$.payload.{c}"))

    parts = F.to_json(F.array(*[field(c) for c in columns]))
    found = F.when(field(columns[0]).isNotNull(),
                   F.array(row_hash_column(table, columns, key, parts))).otherwise(F.array().cast("array<string>"))
    if values is None:
        return found
    return F.concat(found, F.transform(values, lambda x: row_hash_column(table, columns, key, F.to_json(F.array(x)))))
