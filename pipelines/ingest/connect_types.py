"""Kafka Connect field schemas -> the bronze column each becomes, and how its JSON text turns into that type.

Contract section 7: bronze stores each column as the type the source meant, not its wire form. The
row image is parsed as a map of column name to JSON text (`pipelines.ingest.parse`), so a column's
value arrives as text whatever its type; the Connect schema of a wrapped message
(`schemas.enable=true`) names its semantic type (Debezium's `io.debezium.time.Date`, ...), and that
decides both the column's Spark type and the expression that converts the text (`convert`).

A table declared `typed = false` (the shop) keeps the wire form: Connect's physical type only
(`int64` a bigint, anything else its text), as bronze held it before declarations.

Decimals are stored as `decimal(38, s)`: exact for every `numeric(p, s)` up to 38 digits, and a
source column widened in precision (`numeric(12,2)` to `numeric(14,2)`, contract section 6) keeps
its bronze type, where a precision-exact type would need a change Hudi cannot apply on write. A
numeric whose scale the schema does not give (unconstrained `numeric`), or wider than 38 digits,
stays its exact decimal text.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F

# Connect's physical types, as the JsonConverter names them in a schema, to a Spark type (the wire form). Its
# JSON schema spells FLOAT32 and FLOAT64 `float` and `double` (what Debezium 2.7.3 sends for `real` and
# `double precision`: tests/fixtures/declared); Connect's own enum names are accepted too.
PHYSICAL = {
    "int8": "int", "int16": "int", "int32": "int", "int64": "bigint",
    "float": "float", "double": "double", "float32": "float", "float64": "double", "boolean": "boolean",
    "string": "string", "bytes": "string",
}
# Debezium's semantic types (the schema's `name`) whose value needs more than a cast.
SEMANTIC = {
    "io.debezium.time.Date": ("date", "days"),
    "io.debezium.time.MicroTimestamp": ("timestamp", "micros"),
    "io.debezium.time.Timestamp": ("timestamp", "millis"),
    "io.debezium.time.NanoTimestamp": ("timestamp", "nanos"),
    "io.debezium.time.ZonedTimestamp": ("timestamp", "iso"),
    "org.apache.kafka.connect.data.Date": ("date", "days"),
    "org.apache.kafka.connect.data.Timestamp": ("timestamp", "millis"),
}
# How Debezium names a column's source type when `column.propagate.source.type` or
# `datatype.propagate.source.type` is on (dev/lakehouse_dev/connect_config.py sets it for numerics).
SOURCE_TYPE, SOURCE_LENGTH, SOURCE_SCALE = ("__debezium.source.column.type", "__debezium.source.column.length",
                                            "__debezium.source.column.scale")
DECIMAL_PRECISION = 38
CONVERSIONS = ("", "text", "cast", "days", "micros", "millis", "nanos", "iso", "base64", "array", "decimal")


def bronze_column(field: dict[str, Any], typed: bool = True) -> tuple[str, str]:
    """(Spark type, conversion) of the bronze column for a Connect field of `after`'s schema."""
    kind = field.get("type")
    if not typed:
        return PHYSICAL.get(kind or "", "string"), ""
    name = field.get("name") or ""
    if name in SEMANTIC:
        return SEMANTIC[name]
    parameters = field.get("parameters") or {}
    if kind == "string" and str(parameters.get(SOURCE_TYPE, "")).upper() in ("NUMERIC", "DECIMAL"):
        scale = _int(parameters.get(SOURCE_SCALE))
        length = _int(parameters.get(SOURCE_LENGTH))
        if scale is not None and length is not None and 0 < length <= DECIMAL_PRECISION and 0 <= scale <= length:
            return f"decimal({DECIMAL_PRECISION},{scale})", "decimal"
        return "string", "text"
    if kind == "bytes":
        return "binary", "base64"
    if kind == "array":
        items = field.get("items") or {}
        element, convert = bronze_column(items, typed)
        # Elements that are plain JSON values parse straight into the array; others keep their text.
        return (f"array<{element}>" if convert in ("cast", "text") else "array<string>"), "array"
    if kind in ("map", "struct"):
        return "string", "text"  # their JSON text
    spark = PHYSICAL.get(kind or "", "string")
    return spark, "text" if spark == "string" else "cast"


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def convert(text: Column, spark_type: str, conversion: str) -> Column:
    """The JSON text of a value (as the image map holds it) as `spark_type`, the way `conversion` says."""
    if conversion in ("", "cast"):
        return text if spark_type == "string" else text.cast(spark_type)
    if conversion == "text":
        return text
    if conversion == "days":
        return F.date_from_unix_date(text.cast("int"))
    if conversion == "micros":
        return F.timestamp_micros(text.cast("bigint"))
    if conversion == "millis":
        return F.timestamp_millis(text.cast("bigint"))
    if conversion == "nanos":
        return F.timestamp_micros(F.floor(text.cast("decimal(38,0)") / 1000).cast("bigint"))
    if conversion == "iso":
        return F.to_timestamp(text)
    if conversion == "base64":
        return F.unbase64(text)
    if conversion == "decimal":
        return text.cast(spark_type)
    if conversion == "array":
        return F.from_json(text, spark_type)
    raise ValueError(f"unknown conversion {conversion!r} (known: {', '.join(CONVERSIONS)})")
