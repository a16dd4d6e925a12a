"""One canonical text for each column value, computed alike by PostgreSQL (SQL) and by Spark over bronze.

Bronze stores a value as the type the source meant (contract section 7) or, for a table declared `typed = false`,
in its wire form (a decimal string, an ISO timestamp, Debezium's micros); PostgreSQL has its own text forms. Both
sides are brought to one form per kind of PostgreSQL type, chosen so that equal values give equal texts:

| kind    | PostgreSQL types                    | canonical text                                      |
|---------|-------------------------------------|-----------------------------------------------------|
| int     | smallint, integer, bigint, oid      | the decimal integer                                 |
| float   | real, double precision              | the IEEE 754 bits of the value as a double (exact)  |
| bool    | boolean                             | `true` / `false`                                    |
| numeric | numeric                             | the decimal without trailing zeros (`12.5`)         |
| char    | char(n)                             | the text without its padding                        |
| date    | date                                | days since 1970-01-01                               |
| micros  | timestamp, timestamptz              | microseconds since 1970-01-01 UTC (wall clock as UTC)|
| bytes   | bytea                               | lower-case hex                                      |
| array   | any array                           | the JSON array                                      |
| text    | text, varchar, name, enums, uuid, json, jsonb | the text                                  |

A column of any other type (time, interval, money, ranges, geometry, ...) is not compared: its forms on the
two sides are not known to agree, and a false drift is worse than a column left out (the report names it).

A row's text joins its columns' texts, each as `<length>:<text>` and NULL as `~`, so no two rows share a text
unless every column is equal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from psycopg import sql
from pyspark.sql import Column
from pyspark.sql import functions as F

NULL_TEXT = "~"
SEPARATOR = "|"

_BY_TYPE = {"int2": "int", "int4": "int", "int8": "int", "oid": "int", "float4": "float", "float8": "float",
            "bool": "bool", "numeric": "numeric", "bpchar": "char", "date": "date", "timestamp": "micros",
            "timestamptz": "micros", "bytea": "bytes", "text": "text", "varchar": "text", "name": "text",
            "uuid": "text", "json": "text", "jsonb": "text", "citext": "text"}


@dataclass(frozen=True)
class SourceColumn:
    """A column of the source table: its name, PostgreSQL's type name (`pg_type.typname`, a domain's base type)
    and type category (`typcategory`: `A` an array, `E` an enum)."""

    name: str
    typname: str
    category: str

    @property
    def kind(self) -> str | None:
        """The canonical kind of its values (see the module's table); None when it is not compared."""
        if self.category == "A":
            return "array"
        if self.category == "E":
            return "text"
        return _BY_TYPE.get(self.typname)


# PostgreSQL's canonical text of each kind, `{}` the column.
_PG_FORMS = {
    "int": "{}::text",
    "float": "(('x' || encode(float8send({}::float8), 'hex'))::bit(64)::bigint)::text",
    "bool": "{}::text",
    "numeric": "trim_scale({})::text",
    "char": "rtrim({}::text)",
    "date": "({} - date '1970-01-01')::text",
    "micros": "(round(extract(epoch FROM {}) * 1000000)::bigint)::text",
    "bytes": "encode({}, 'hex')",
    "array": "array_to_json({})::text",
    "text": "{}::text",
}


def pg_text(column: SourceColumn) -> sql.Composable:
    """PostgreSQL's canonical text of `column`'s value (NULL for NULL)."""
    return sql.SQL(_PG_FORMS[_kind(column)]).format(sql.Identifier(column.name))


def spark_text(column: SourceColumn, dtype: str) -> Column:
    """Spark's canonical text of bronze's `column`, of Spark type `dtype` (its simple string: `bigint`,
    `decimal(38,2)`, `timestamp`, `string`, ...), equal to `pg_text` for an equal value."""
    c, kind = F.col(f"`{column.name}`"), _kind(column)
    if kind == "int":
        return c.cast("bigint").cast("string")
    if kind == "float":  # a NULL never reaches the Java method, whose parameter is a primitive double
        bits = F.expr(f"java_method('java.lang.Double', 'doubleToLongBits', "
                      f"coalesce(cast(`{column.name}` as double), 0D))")
        return F.when(c.isNotNull(), bits)
    if kind == "bool":
        return F.lower(c.cast("string"))
    if kind == "numeric":
        return _without_trailing_zeros(_plain_decimal(c, dtype))
    if kind == "char":
        return F.rtrim(c.cast("string"))
    if kind == "date":
        return (F.datediff(c, F.lit("1970-01-01").cast("date")) if dtype == "date" else c.cast("int")).cast("string")
    if kind == "micros":
        return _micros(c, dtype).cast("string")
    if kind == "bytes":
        return F.lower(F.hex(c if dtype == "binary" else F.unbase64(c)))
    if kind == "array":
        return F.to_json(c) if dtype.startswith("array") else c.cast("string")
    return c.cast("string")


def _kind(column: SourceColumn) -> str:
    kind = column.kind
    if kind is None:
        raise ValueError(f"column {column.name} ({column.typname}) is not compared")
    return kind


def _plain_decimal(c: Column, dtype: str) -> Column:
    """A decimal's text without an exponent. Spark prints a decimal as Java's BigDecimal.toString does, which
    writes small values with one (`1.000E-7`, zero at scale 10 as `0E-10`); formatted at the column's own scale it
    is exact and plain (format_number's grouping commas taken out). A wire string has none."""
    if match := re.fullmatch(r"decimal\(\d+,(\d+)\)", dtype):
        return F.regexp_replace(F.format_number(c, int(match.group(1))), ",", "")
    return c.cast("string")


def _without_trailing_zeros(text: Column) -> Column:
    """`12.50` -> `12.5`, `3.00` -> `3`, `100` stays: PostgreSQL's trim_scale."""
    trimmed = F.regexp_replace(F.regexp_replace(text, "0+$", ""), "\\.$", "")
    return F.when(text.contains("."), trimmed).otherwise(text)


def _micros(c: Column, dtype: str) -> Column:
    """Microseconds since the epoch of a bronze timestamp (the session's time zone is UTC), of an ISO text
    (ZonedTimestamp on the wire) or of Debezium's micros as a number."""
    if dtype in ("bigint", "int"):
        return c.cast("bigint")
    if dtype == "string":
        return F.unix_micros(F.to_timestamp(c))
    return F.unix_micros(c.cast("timestamp"))


def row_text(parts: list[Column]) -> Column:
    """Spark's text of a row from its columns' canonical texts, in order."""
    return F.concat_ws(SEPARATOR, *[F.coalesce(F.concat(F.length(p).cast("string"), F.lit(":"), p),
                                               F.lit(NULL_TEXT)) for p in parts])


def pg_row_text(parts: list[sql.Composable]) -> sql.Composable:
    """PostgreSQL's text of a row from its columns' canonical texts, in order (equal to `row_text`'s)."""
    wrapped = [sql.SQL("coalesce(length({0})::text || ':' || {0}, {1})").format(p, sql.Literal(NULL_TEXT))
               for p in parts]
    return sql.SQL("concat_ws({}, {})").format(sql.Literal(SEPARATOR), sql.SQL(", ").join(wrapped))
