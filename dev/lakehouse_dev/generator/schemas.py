"""Kafka Connect schemas (`schemas.enable=true`) of the envelopes, built once per table and shape."""

from __future__ import annotations

import functools
from typing import Any

from lakehouse_dev.generator.values import SNAPSHOT_MARKERS, TIMESTAMP_COLUMNS, dumps
from pipelines.lake.contract import BIGINT_COLUMNS, COLUMNS, TABLES, topic

# --- Kafka Connect schemas (schemas.enable=true), built once per table ------------------------------

def column_schema(table: str, column: str) -> dict[str, Any]:
    kind = "int64" if column in BIGINT_COLUMNS[table] else "string"
    field: dict[str, Any] = {"type": kind, "optional": False}
    if column in TIMESTAMP_COLUMNS:
        field |= {"name": "io.debezium.time.ZonedTimestamp", "version": 1}
    return field | {"field": column}


def string_field(field: str, optional: bool = False) -> dict[str, Any]:
    return {"type": "string", "optional": optional, "field": field}


def int64_field(field: str, optional: bool = False) -> dict[str, Any]:
    return {"type": "int64", "optional": optional, "field": field}


SOURCE_SCHEMA = {
    "type": "struct",
    "fields": [
        string_field("version"), string_field("connector"), string_field("name"), int64_field("ts_ms"),
        {
            "type": "string", "optional": True, "name": "io.debezium.data.Enum", "version": 1,
            "parameters": {"allowed": ",".join(SNAPSHOT_MARKERS)},
            "default": "false", "field": "snapshot",
        },
        string_field("db"), string_field("sequence", optional=True), string_field("schema"), string_field("table"),
        int64_field("txId", optional=True), int64_field("lsn", optional=True), int64_field("xmin", optional=True),
    ],
    "optional": False,
    "name": "io.debezium.connector.postgresql.Source",
    "field": "source",
}
TRANSACTION_SCHEMA = {
    "type": "struct",
    "fields": [string_field("id"), int64_field("total_order"), int64_field("data_collection_order")],
    "optional": True,
    "name": "event.block",
    "version": 1,
    "field": "transaction",
}


def envelope_schema(table: str, extra: tuple[tuple[str, str], ...] | None = None) -> dict[str, Any]:
    """The Connect schema of the table's envelope; `extra`: its columns and types once the table's shape
    changed (`ShopSource.alter`), contract columns included."""
    fields = [column_schema(table, column) for column in COLUMNS[table]] if extra is None else [
        column_schema(table, c) if c in COLUMNS[table] and kind == column_schema(table, c)["type"]
        else {"type": kind, "optional": True, "field": c} for c, kind in extra]
    value = {
        "type": "struct",
        "fields": fields,
        "optional": True,
        "name": f"{topic(table)}.Value",
    }
    return {
        "type": "struct",
        "fields": [
            value | {"field": "before"}, value | {"field": "after"}, SOURCE_SCHEMA,
            string_field("op"), int64_field("ts_ms", optional=True), TRANSACTION_SCHEMA,
        ],
        "optional": False,
        "name": f"{topic(table)}.Envelope",
        "version": 1,
    }


MESSAGE_SCHEMA = {
    "type": "struct",
    "fields": [
        SOURCE_SCHEMA, string_field("op"), int64_field("ts_ms", optional=True),
        {
            "type": "struct",
            "fields": [string_field("prefix"), {"type": "bytes", "optional": True, "field": "content"}],
            "optional": False,
            "name": "io.debezium.connector.postgresql.Message",
            "field": "message",
        },
    ],
    "optional": False,
    "name": "io.debezium.connector.postgresql.MessageValue",
}
# Serialized once: the schema is most of a wrapped record's bytes and never changes.
SCHEMA_BYTES = {table: dumps(envelope_schema(table)) for table in TABLES} | {"m": dumps(MESSAGE_SCHEMA)}
# PostgreSQL's type for a Connect type, in the DDL `ShopSource.alter` returns.
PG_TYPES = {"int16": "smallint", "int32": "integer", "int64": "bigint", "float64": "double precision",
             "boolean": "boolean", "string": "text"}


@functools.cache
def shape_schema(table: str, columns: tuple[tuple[str, str], ...]) -> bytes:
    """The envelope's schema for a changed shape, serialized once per shape."""
    return dumps(envelope_schema(table, columns))
