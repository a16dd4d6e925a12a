"""Each side's digest of a table: per bucket of key hashes, the number of rows and the sum of their row hashes,
and, for the buckets that differ, each row's key, hash and column texts.

A bucket is the first `digits` hex digits of the md5 of a row's key text, so a key falls in the same bucket on
both sides whatever its type; a row's hash is the md5 of its canonical text (`canonical`), of which the first 15
hex digits (60 bits) are summed, so the sums of two buckets differ when any row in them does (data-diff's
checksum). One scan of each side gives every bucket's sum; the buckets that differ are read row by row in one
more scan, restricted to them (of the lake, a scan of what the first one kept: `compare.reconcile_table`).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

from psycopg import sql
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipelines.reconcile.canonical import SourceColumn, pg_row_text, pg_text, row_text, spark_text

# Kinds whose canonical text PostgreSQL reads back as the column's own value (`col = 'text'`, an index usable);
# the others are matched by their canonical expression.
_LITERAL_KINDS = ("int", "text", "bool", "numeric")
# Rows per bucket aimed at: the rows of a differing bucket are what is read row by row.
ROWS_PER_BUCKET = 64
MAX_DIGITS = 5  # 1,048,576 buckets: 64 rows each at 67M rows


@dataclass(frozen=True)
class Row:
    """A row as reconciliation sees it: its canonical column texts (in the compared columns' order) and hash."""

    texts: tuple[str | None, ...]
    hash: str


def digits_for(rows: int) -> int:
    """How many hex digits name a bucket for a table of about `rows` rows."""
    return max(1, min(MAX_DIGITS, math.ceil(math.log(max(rows, 1) / ROWS_PER_BUCKET, 16)) if rows > 0 else 1))


@dataclass(frozen=True)
class Shape:
    """What is compared of one table: its columns (`columns`, each with bronze's Spark type in `dtypes`) and which
    of them form the key, and how many hex digits name a bucket."""

    columns: tuple[SourceColumn, ...]
    key: tuple[str, ...]
    dtypes: dict[str, str]
    digits: int

    @property
    def key_columns(self) -> list[SourceColumn]:
        by_name = {c.name: c for c in self.columns}
        return [by_name[k] for k in self.key]


def bucket_of(key: str, digits: int) -> str:
    """The bucket of a row whose key text is `key`, as both sides' queries compute it."""
    return hashlib.md5(key.encode()).hexdigest()[:digits]


def pg_parts(shape: Shape) -> tuple[sql.Composable, sql.Composable, sql.Composable, list[sql.Composable]]:
    """PostgreSQL's key text, bucket, row text and column texts of `shape`."""
    texts = [pg_text(c) for c in shape.columns]
    key = pg_row_text([pg_text(c) for c in shape.key_columns])
    bucket = sql.SQL("substr(md5({}), 1, {})").format(key, sql.Literal(shape.digits))
    return key, bucket, pg_row_text(texts), texts


def source_buckets(conn: Any, relation: sql.Composable, shape: Shape) -> dict[str, tuple[int, int]]:
    """PostgreSQL's {bucket: (rows, sum of row hashes)} of `relation` (one scan, in the connection's snapshot)."""
    _, bucket, row, _ = pg_parts(shape)
    query = sql.SQL("SELECT {b}, count(*), sum(('x' || substr(md5({r}), 1, 15))::bit(60)::bigint) "
                    "FROM {t} GROUP BY 1").format(b=bucket, r=row, t=relation)
    return {b: (int(n), int(s)) for b, n, s in conn.execute(query).fetchall()}


def source_rows(conn: Any, relation: sql.Composable, shape: Shape, buckets: list[str]) -> dict[str, Row]:
    """PostgreSQL's rows of `relation` in `buckets`, by key text."""
    _, bucket, _, _ = pg_parts(shape)
    # IN over a subquery, not = ANY(array): PostgreSQL hashes the buckets once instead of searching the array for
    # every row of the table (about a thousand buckets at 10M rows).
    return _rows_where(conn, relation, shape, sql.SQL("{} IN (SELECT unnest(%s::text[]))").format(bucket),
                       (buckets,))


def _rows_where(conn: Any, relation: sql.Composable, shape: Shape, condition: sql.Composable,
                params: tuple[Any, ...] = ()) -> dict[str, Row]:
    """PostgreSQL's rows of `relation` that meet `condition`, by key text."""
    key, _, row, texts = pg_parts(shape)
    query = sql.SQL("SELECT {k}, md5({r}), {cols} FROM {t} WHERE {c}").format(
        k=key, r=row, cols=sql.SQL(", ").join(texts), t=relation, c=condition)
    return {k: Row(tuple(rest), h) for k, h, *rest in conn.execute(query, params).fetchall()}


def key_filter(columns: list[SourceColumn], keys: list[dict[str, Any]]) -> sql.Composable:
    """A WHERE condition selecting exactly `keys` (canonical texts per key column), parenthesised: Debezium
    appends it to its chunk query after an AND."""
    head, sep, tail = filter_frame(columns)
    return head + sql.SQL(sep).join(key_term(columns, k) for k in keys) + sql.SQL(tail)


def filter_frame(columns: list[SourceColumn]) -> tuple[sql.Composable, str, str]:
    """What surrounds and separates the keys' terms in `key_filter`: `(id IN (` `, ` `))`, or `(` ` OR ` `)`."""
    if len(columns) == 1:
        return sql.SQL("({} IN (").format(_match(columns[0])), ", ", "))"
    return sql.SQL("("), " OR ", ")"


def key_term(columns: list[SourceColumn], key: dict[str, Any]) -> sql.Composable:
    """One key's term of `key_filter`: its value, or its columns' equalities."""
    if len(columns) == 1:
        return sql.Literal(key[columns[0].name])
    return sql.SQL("({})").format(sql.SQL(" AND ").join(
        sql.SQL("{} = {}").format(_match(c), sql.Literal(key[c.name])) for c in columns))


def _match(c: SourceColumn) -> sql.Composable:
    return sql.Identifier(c.name) if c.kind in _LITERAL_KINDS else pg_text(c)


def source_rows_of(conn: Any, relation: sql.Composable, shape: Shape, keys: list[dict[str, Any]]) -> dict[str, Row]:
    """PostgreSQL's rows of `relation` with `keys` ({key column: canonical text}), by key text: looked up by the
    key (its index, for the key kinds whose text is the value), not by a scan for their buckets."""
    if not keys:
        return {}
    return _rows_where(conn, relation, shape, key_filter(shape.key_columns, keys))


def lake_frame(bronze: DataFrame, shape: Shape) -> DataFrame:
    """Bronze's rows as reconcile compares them: key text `_k`, bucket `_b`, row hash `_h`, column texts `_c0`..."""
    texts = [spark_text(c, shape.dtypes[c.name]) for c in shape.columns]
    by_name = dict(zip([c.name for c in shape.columns], texts, strict=True))
    key = row_text([by_name[k] for k in shape.key])
    return bronze.select(key.alias("_k"), F.md5(row_text(texts)).alias("_h"),
                         *[t.alias(f"_c{i}") for i, t in enumerate(texts)]) \
        .withColumn("_b", F.substring(F.md5("_k"), 1, shape.digits))


def lake_buckets(frame: DataFrame) -> dict[str, tuple[int, int]]:
    """{bucket: (rows, sum of row hashes)} of `frame`, a `lake_frame` (one scan of its snapshot)."""
    sums = frame.groupBy("_b").agg(F.count(F.lit(1)).alias("n"), F.sum(
        F.conv(F.substring("_h", 1, 15), 16, 10).cast("decimal(38,0)")).alias("s"))
    return {r["_b"]: (int(r["n"]), int(r["s"])) for r in sums.collect()}


def lake_rows(frame: DataFrame, buckets: list[str]) -> dict[str, Row]:
    """The rows of `frame`, a `lake_frame`, in `buckets`, by key text."""
    width = sum(1 for c in frame.columns if c.startswith("_c"))
    # A semi-join with the buckets, not `isin`: on a persisted frame Spark turns an IN list into one OR per value
    # for its partition statistics, and the code it generates for a thousand buckets overflows the stack.
    wanted = frame.sparkSession.createDataFrame([(b,) for b in buckets], "_b string")
    picked = frame.join(F.broadcast(wanted), "_b", "left_semi")
    return {r["_k"]: Row(tuple(r[f"_c{i}"] for i in range(width)), r["_h"]) for r in picked.collect()}


def differing(source: dict[str, tuple[int, int]], lake: dict[str, tuple[int, int]]) -> list[str]:
    """The buckets whose rows or sums differ, or that only one side has."""
    return sorted(b for b in source.keys() | lake.keys() if source.get(b) != lake.get(b))
