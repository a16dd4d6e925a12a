"""Silver: cleaned, typed and validated rows, as the declaration says (contract sections 3 and 7).

One pure DataFrame function, `clean`, turns bronze-shaped rows of any declared table into
silver-shaped rows, so that each rule can be tested on its own and a table is onboarded by
declaring it (`pipelines.lake.declaration`), never by writing code here; the incremental cycle that
feeds it is `pipelines.transform.etl`. A row that fails a rule is not dropped: `failed_rule`
names the first rule it broke, in declared order, and the cycle keeps it in quarantine instead
of silver.

What a declaration's steps mean (contract section 7, and the project's own `cast` and `derive`):
- cleaning, before any rule: `trim` strips any whitespace (tabs too, not only Spark's spaces),
  then `upper` or `lower`; only text columns can be cleaned;
- `pattern`: a Java regular expression found anywhere in the value (`rlike`);
  `one_of`: the value is one of those listed; `min`/`max`: inclusive bounds; `not_null`;
- `cast`: the value converts exactly to the type, and from then on the column holds the
  converted value (silver stores it; later rules of the column see it). From text, a
  `decimal(p,s)` must be digits with at most p-s integer and s fraction digits (no rounding,
  no exponent), an integer must be digits, a timestamp or date what `to_timestamp`/`to_date`
  read; from another type, the value must survive the round trip (no overflow, no rounding);
  a value already of the type passes unchanged;
- every rule but `not_null` passes a NULL (the contract's rule), unless `not_null = true` stands beside
  its check (then the rule fails a NULL under its own name);
- `derive` `date_of`: the UTC date of a timestamp (after its cast), as a new column.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from decimal import Decimal
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines.errors import DeclarationError
from pipelines.lake.declaration import Rule, RuleKind, TableDecl, missing_columns
from pipelines.lake.layout import LEDGER_COLUMNS, META_COLUMNS

# The bronze metadata silver keeps: `_lsn` orders its upserts (a late re-run never moves a row back),
# `_source_ts` says how fresh a row is.
KEPT_METADATA = ("_lsn", "_source_ts")
# Columns silver and its quarantine make themselves: a source column cannot take these names.
SILVER_OWN = ("failed_rule", "_quarantined_at")
_MICROS_PER_DAY = 86_400_000_000
_DECIMAL = re.compile(r"^decimal\((\d+),\s*(\d+)\)$")
_SIMPLE_TYPES: dict[str, T.DataType] = {"timestamp": T.TimestampType(), "date": T.DateType(), "bigint": T.LongType(),
                                        "int": T.IntegerType(), "double": T.DoubleType(), "boolean": T.BooleanType()}


def is_metadata(column: str) -> bool:
    """A column the lake adds to a source row (CDC position, Hudi's fields, the cycle's flags), not a source column."""
    return (column in META_COLUMNS or column in LEDGER_COLUMNS or column.startswith("_hoodie_")
            or column in ("_deleted", "_ingest_date"))


def silver_columns(table: TableDecl, bronze_columns: Iterable[str]) -> list[str]:
    """The columns silver/<table> carries from bronze, in order (`clean` adds the derived ones and `failed_rule`).

    With declared `columns`: those, then the metadata silver keeps, then the `silver_extra` that bronze
    has (one it lacks yet is left out until the source adds it). Without: every source column of
    bronze (an added one included: silver then has bronze's columns), then the metadata.
    """
    have = list(bronze_columns)
    derived = {d.column for d in table.derive}
    if table.columns:
        source = [*dict.fromkeys([*table.key, *table.columns])]
        extra = [c for c in table.silver_extra if c in have and c not in source]
    else:
        source, extra = [c for c in have if not is_metadata(c) and c not in derived], []
    if clash := [c for c in [*source, *extra] if c in SILVER_OWN]:
        raise DeclarationError(f"{table.declared_in}: tables.{table.name}: column(s) {clash} take names silver "
                               f"gives its own columns ({', '.join(SILVER_OWN)})")
    return [*source, *(c for c in KEPT_METADATA if c in have), *extra]


def split(cleaned: DataFrame, raw: DataFrame, key: Sequence[str]) -> tuple[DataFrame, DataFrame]:
    """`clean`'s rows into (silver's, the quarantine's): the valid ones as cleaned, and the others as they arrived
    (`raw`, the same rows before cleaning) with the rule each failed, so that a held row can be corrected at its
    source and still be recognised."""
    valid = cleaned.filter(F.col("failed_rule").isNull()).drop("failed_rule")
    invalid = cleaned.filter(F.col("failed_rule").isNotNull()).select(*key, "failed_rule")
    return valid, raw.join(invalid, list(key))


def clean(bronze: DataFrame, table: TableDecl, columns: Sequence[str], *, where: str | None = None) -> DataFrame:
    """Bronze rows of `table` -> its silver rows: `columns` (see `silver_columns`) cleaned and cast, the derived
    columns, and `failed_rule` (the name of the first declared rule the row fails; null for a valid row).

    Raises DeclarationError, naming the declaration file (`where`, default: the file in force when it
    declares this table), the table and the field, when a cleaning step, rule or derivation names a
    column bronze lacks, or cleans a column that is not text: before anything is written.
    """
    at = f"{where or table.declared_in}: tables.{table.name}"
    types = {f.name: f.dataType for f in bronze.schema.fields}
    # The erasure's fields (subject, pii) are not silver's to check.
    if missing := [m for m in missing_columns(table, set(types)) if not m.startswith(("subject:", "pii:"))]:
        raise DeclarationError(f"{at}: bronze has no column for " + "; ".join(missing)
                               + f" (bronze's columns: {', '.join(c for c in types if not is_metadata(c))})")
    values: dict[str, Column] = {}
    for i, step in enumerate(table.clean):
        if not isinstance(types[step.column], T.StringType):
            raise DeclarationError(f"{at}.clean[{i}]: column {step.column!r} is {types[step.column].simpleString()}, "
                                   "not text: only text is trimmed or changes case")
        value = values.get(step.column, F.col(step.column))
        if step.trim:  # Spark's `trim` strips spaces only: padding may be tabs or newlines too
            value = F.regexp_replace(value, r"^\s+|\s+$", "")
        if step.upper:
            value = F.upper(value)
        if step.lower:
            value = F.lower(value)
        values[step.column] = value

    checks: list[tuple[str, Column]] = []
    for rule in table.rules:
        value = values.get(rule.column, F.col(rule.column))
        if rule.kind == RuleKind.CAST:
            converted, holds, types[rule.column] = _cast(value, types[rule.column], rule.value)
            values[rule.column] = converted
        else:
            holds = F.lit(True) if rule.kind == RuleKind.NOT_NULL else _holds(rule, value, types[rule.column])
        # A NULL passes a rule unless the rule refuses it (`not_null`, alone or beside another check).
        checks.append((rule.name, value.isNotNull() & holds if rule.not_null else value.isNull() | holds))

    derived = [_utc_date(values.get(d.date_of, F.col(d.date_of)), types[d.date_of]).alias(d.column)
               for d in table.derive]
    return bronze.select(*[values.get(c, F.col(c)).alias(c) for c in columns], *derived,
                         _first_failed(checks).alias("failed_rule"))


def _first_failed(checks: list[tuple[str, Column]]) -> Column:
    """The name of the first check that is not true (a check that is NULL fails), NULL when all hold."""
    result = F.lit(None).cast("string")
    for name, ok in reversed(checks):
        result = F.when(~F.coalesce(ok, F.lit(False)), F.lit(name)).otherwise(result)
    return result


def _holds(rule: Rule, value: Column, kind: T.DataType) -> Column:
    """Whether a non-null `value` (of type `kind`) passes a `one_of`, `pattern`, `min` or `max` rule."""
    if rule.kind == RuleKind.ONE_OF:
        return value.isin(*rule.value)
    if rule.kind == RuleKind.PATTERN:  # Java's regex, found anywhere: the declaration anchors it if it means the whole
        return (value if isinstance(kind, T.StringType) else value.cast("string")).rlike(rule.value)
    bound = _bound(rule.value, kind)
    return value >= bound if rule.kind == RuleKind.MIN else value <= bound


def _bound(value: Any, kind: T.DataType) -> Column:
    """A min/max bound as a literal comparable with a column of type `kind`, without going through a double."""
    if isinstance(value, str):  # a date, a timestamp or a number written as text: read as the column's type
        return F.lit(value).cast(kind)
    if isinstance(kind, T.DecimalType):  # 0.1 as a double is not 0.1: compare decimals with a decimal
        return F.lit(Decimal(str(value)))
    return F.lit(value)


def cast_type(name: str) -> T.DataType:
    """The Spark type a `cast` rule names (`decimal(12,2)`, `timestamp`, ...)."""
    if m := _DECIMAL.match(name):
        return T.DecimalType(int(m.group(1)), int(m.group(2)))
    return _SIMPLE_TYPES[name]


def _cast(value: Column, source: T.DataType, target_name: str) -> tuple[Column, Column, T.DataType]:
    """(converted value, whether a non-null value converts exactly, the new type) of a `cast` rule."""
    target = cast_type(target_name)
    if source == target:
        return value, F.lit(True), target
    if isinstance(source, T.StringType):
        if isinstance(target, T.TimestampType):
            converted = F.to_timestamp(value)
            return converted, converted.isNotNull(), target
        if isinstance(target, T.DateType):
            converted = F.to_date(value)
            return converted, converted.isNotNull(), target
        converted = value.cast(target)
        # Spark reads "1e3" or "12.345" as a decimal(12,2) by rounding, and "12.5" as a bigint by truncating:
        # only text that is already exactly such a value passes.
        if isinstance(target, T.DecimalType):
            whole = target.precision - target.scale
            digits = rf"\d{{1,{whole}}}" if whole else "0"
            fraction = rf"(\.\d{{1,{target.scale}}})?" if target.scale else ""
            return converted, value.rlike(f"^-?{digits}{fraction}$") & converted.isNotNull(), target
        if isinstance(target, T.IntegerType | T.LongType):
            return converted, value.rlike(r"^[+-]?\d+$") & converted.isNotNull(), target
        return converted, converted.isNotNull(), target
    # From a number, a boolean, a date or a timestamp: exact when the value comes back unchanged (a
    # decimal(14,2) that overflows decimal(12,2) is NULL, 1.5 as a bigint comes back 1.0).
    converted = value.cast(target)
    return converted, converted.isNotNull() & (converted.cast(source) == value), target


def _utc_date(value: Column, kind: T.DataType) -> Column:
    """The UTC date of a timestamp (whatever the session's zone), a date as it is, text read as a timestamp first."""
    if isinstance(kind, T.DateType):
        return value
    if isinstance(kind, T.TimestampNTZType):  # a wall-clock time has no zone: its own date
        return F.to_date(value)
    if not isinstance(kind, T.TimestampType):
        value = F.to_timestamp(value)
    return F.date_from_unix_date(F.floor(F.unix_micros(value) / _MICROS_PER_DAY).cast("int"))
