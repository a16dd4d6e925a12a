"""Kafka records of a source topic -> classified rows: a change with its image, a truncate, a tombstone,
a message to ignore, or a dead letter with its reason. Every record yields one row: nothing is dropped
without a trace.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines import contract
from pipelines.declaration import declared
from pipelines.ingest.connect_types import convert
from pipelines.ingest.schema import Shape
from pipelines.settings import unavailable_placeholder

# --------------------------------------------------------------------------- parsing

_SOURCE = T.StructType([
    T.StructField("version", T.StringType()),
    T.StructField("connector", T.StringType()),
    T.StructField("name", T.StringType()),
    T.StructField("ts_ms", T.LongType()),
    T.StructField("snapshot", T.StringType()),
    T.StructField("db", T.StringType()),
    T.StructField("sequence", T.StringType()),
    T.StructField("schema", T.StringType()),
    T.StructField("table", T.StringType()),
    T.StructField("txId", T.LongType()),
    T.StructField("lsn", T.LongType()),
    T.StructField("xmin", T.LongType()),
])


def row_schema(table: str) -> T.StructType:
    """A declared table's declared columns with their wire types (the shop's bronze row, without its metadata).

    Bronze mirrors the shop as it arrived; typing and cleaning are silver's job, so a
    value silver will reject still lands here and can be traced back.
    """
    decl = declared().table(table)
    return T.StructType([T.StructField(c, T.LongType() if decl.wire_type(c) == "bigint" else T.StringType())
                         for c in decl.columns])


# A row image as column name -> the value's JSON text (strings unquoted): every column the
# source sends is kept, including those added after the table was created (pipelines.ingest.schema).
_IMAGE = T.MapType(T.StringType(), T.StringType())


def _envelope_fields() -> list[T.StructField]:
    return [
        T.StructField("before", _IMAGE),
        T.StructField("after", _IMAGE),
        T.StructField("source", _SOURCE),
        T.StructField("op", T.StringType()),
        T.StructField("ts_ms", T.LongType()),
    ]


def value_schema() -> T.StructType:
    """Both converter settings in one schema: the bare envelope, or `{"schema", "payload"}`."""
    return T.StructType([
        # A Kafka Connect schema (`schemas.enable=true`) as its JSON text: it is the same for every
        # record of a shape, so a batch hashes it and reads `after`'s fields from one record per
        # new hash (`survey.SchemaSurvey`); parsed into arrays for every record, it
        # was most of the cost of parsing a backlog.
        T.StructField("schema", T.StringType()),
        T.StructField("payload", T.StructType(_envelope_fields())),
        *_envelope_fields(),
        T.StructField("_corrupt", T.StringType()),
    ])


def literal_array(values: list[str] | tuple[str, ...]) -> Column:
    return F.array(*[F.lit(v) for v in values]) if values else F.array().cast("array<string>")


@dataclass(frozen=True)
class TableParse:
    """What parsing one table's records needs: its shape, and the Connect schemas (hashes) it has applied."""

    shape: Shape
    known_declared: tuple[int, ...] = ()


def parse_events(raw: DataFrame, table: str, shape: Shape | None = None, known_declared: tuple[int, ...] = (),
                 placeholder: str | None = None) -> DataFrame:
    """Kafka records of one table's topic -> one row per record, classified (`parse_topics`, for one table)."""
    return parse_topics(raw, {table: TableParse(shape or Shape.initial(table), known_declared)}, placeholder)


def parse_topics(raw: DataFrame, tables: dict[str, TableParse], placeholder: str | None = None) -> DataFrame:
    """Kafka records -> one row per record, classified as its topic's table says (`read_envelopes`, then `classify`).

    The ingest materializes the envelopes between the two steps, so that the records are read and
    their JSON parsed once (`BronzeBatchWriter`); this lazy form serves single tables and tests.
    """
    return classify(read_envelopes(raw), tables, placeholder, all_mine=len(tables) == 1)


def read_envelopes(raw: DataFrame) -> DataFrame:
    """Kafka records -> their Debezium envelopes parsed, whatever their table: the JSON is decoded here, once.

    Both converter settings are read by one schema (`value_schema`): `_env` is the payload of a
    wrapped record or the bare envelope, `_schema` a wrapped record's Connect schema as its text,
    `_unparsed` true when the value is not a JSON object of the envelope's types.
    """
    text = F.col("value").cast("string")
    parsed = F.from_json(text, value_schema(), {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": "_corrupt"})
    df = raw.select(
        F.col("topic").alias("kafka_topic"), F.col("partition").alias("kafka_partition"),
        F.col("offset").alias("kafka_offset"), F.col("timestamp").alias("kafka_timestamp"),
        "key", "value", text.alias("_text"), parsed.alias("_v"),
    )
    v = F.col("_v")
    bare = F.struct(*[v[f.name].alias(f.name) for f in _envelope_fields()])
    return df.select(
        "kafka_topic", "kafka_partition", "kafka_offset", "kafka_timestamp", "key", "value", "_text",
        (v.isNull() | v["_corrupt"].isNotNull()).alias("_unparsed"), v["schema"].alias("_schema"),
        F.when(v["payload"].isNotNull(), v["payload"]).otherwise(bare).alias("_env"))


def classify(envelopes: DataFrame, tables: dict[str, TableParse], placeholder: str | None = None, *,
             all_mine: bool = False) -> DataFrame:
    """Envelopes (`read_envelopes`) -> one row per record, classified as its topic's table says.

    `kind` is `row` (a change with its image), `truncate`, `tombstone`, `ignored` (op=m)
    or `dead` (with `reason` and the raw `value`). Every input record yields exactly one
    output row, so nothing is dropped without a trace. Each record is classified by the table of
    its topic (a record of another topic is a dead letter), or with `all_mine`, every record by the
    one table of `tables`.

    Each table's records are classified by an expression of its own, over its topic's part of the
    envelopes, and the parts are put together: one expression choosing among the tables (a CASE
    per column with a branch per table) grew with the table count until Spark's generated code
    was too large to compile, and a batch of 50 tables spent 35 to 60 s here (BENCHMARKS.md,
    "Fifty tables"). Only the tables in `tables` are looked at, so the writer passes those whose
    topics the batch has records of: an idle table costs nothing.

    The image is kept as a map (`_image`); `image_columns` types it by the table's shape. Beside
    it, what the schema decision needs (pipelines.ingest.schema), empty for a record of a known
    shape: `_decl_hash` (of the Connect schema's text, for a wrapped record), `_decl_new` (true when
    that hash is not in the table's `known_declared`),
    `_new_keys` (columns not in `shape`), `_missing` (declared columns absent from a bare
    `after`), `_badcast` (bare values that do not fit their column's type), `_toast` (columns
    carrying the unavailable-value `placeholder`). The raw value is kept for dead letters and
    for records of an unknown shape (they may be held).
    """
    placeholder = placeholder or unavailable_placeholder()
    e = F.col("_env")
    op = e["op"]
    # An incremental snapshot's reads (a table added while the stream runs: `lakehouse source sync`) carry no
    # LSN; `source.sequence`'s last element is the stream position the chunk was read at, past every change
    # of the row the read reflects and before every change after it: it orders like an LSN.
    incremental = F.element_at(F.from_json(e["source"]["sequence"], "array<string>"), -1).cast("long")
    lsn = F.coalesce(e["source"]["lsn"], F.when(e["source"]["snapshot"] == "incremental", incremental))
    image = F.when(op == "d", e["before"]).otherwise(e["after"])
    decl = declared()

    def dead(reason: Column) -> Column:
        return F.struct(F.lit("dead").alias("kind"), reason.alias("reason"))

    def ok(kind: str) -> Column:
        return F.struct(F.lit(kind).alias("kind"), F.lit(None).cast("string").alias("reason"))

    no_image = F.concat(F.lit("op="), op, F.when(op == "d", F.lit(" without 'before'"))
                        .otherwise(F.lit(" without 'after'")))

    def not_bigint(c: str) -> Column:
        return image[c].isNotNull() & image[c].cast("bigint").isNull()

    def classified(table: str) -> Column:
        where = f"on topic {decl.topic(table)}"
        t = decl.table(table)
        numbers = sorted(c for c in t.columns if t.wire_type(c) == "bigint")
        mistyped = functools.reduce(lambda a, b: a | b, [not_bigint(c) for c in numbers], F.lit(False))
        key = "/".join(t.key)
        no_key = F.concat(F.lit("op="), op, F.when(op == "d", F.lit(f" without before.{key}"))
                          .otherwise(F.lit(f" without after.{key}")))
        key_missing = functools.reduce(lambda a, b: a | b, [image[k].isNull() for k in t.key])
        return (
            F.when(F.col("value").isNull(), ok("tombstone"))
            .when(F.encode(F.col("_text"), "UTF-8") != F.col("value"), dead(F.lit("value is not valid UTF-8 text")))
            .when(F.col("_unparsed"), dead(
                F.when(F.get_json_object("_text", "$").isNull(), F.lit("value is not valid JSON"))
                .when(~F.ltrim(F.col("_text")).startswith("{"),
                      F.lit("JSON value is not an object, so not a Debezium envelope"))
                .otherwise(F.lit(f"fields do not have the types of the {table} envelope "
                                 "(row images must be objects and source.lsn a JSON number)"))))
            .when(op.isNull(), dead(F.lit("no 'op' field: not a Debezium envelope")))
            .when(~op.isin(*contract.ROW_OPS, *contract.OTHER_OPS),
                  dead(F.concat(F.lit("unknown op '"), op, F.lit("'"))))
            .when(op == "m", ok("ignored"))
            .when(lsn.isNull(), dead(F.concat(F.lit("op="), op, F.lit(" without source.lsn"))))
            .when(e["source"]["table"].isNotNull() & (e["source"]["table"] != t.table),
                  dead(F.concat(F.lit("event of table '"), e["source"]["table"], F.lit(f"' {where}"))))
            .when(op == "t", ok("truncate"))
            .when(image.isNull(), dead(no_image))
            .when(key_missing, dead(no_key))
            .when(mistyped, dead(F.lit(f"fields do not have the types of the {table} envelope "
                                       f"({', '.join(numbers)} must be JSON integers)")))
            .otherwise(ok("row"))
        )

    is_row = F.col("_c.kind") == "row"
    upsert = is_row & (op != "d")
    connect_schema = F.col("_schema")  # its JSON text; null for a bare envelope
    decl_hash = F.xxhash64(connect_schema)
    empty = F.array().cast("array<string>")

    def decl_new(spec: TableParse) -> Column:
        unknown = connect_schema.isNotNull() & ~decl_hash.isin(*spec.known_declared) if spec.known_declared \
            else connect_schema.isNotNull()
        return F.when(is_row & unknown, F.lit(True))

    def as_shape(spec: TableParse) -> Column:
        # An image whose columns are the shape's, in its order (nearly every record), has nothing new and
        # lacks nothing: one array comparison instead of two set differences per record.
        return F.map_keys(image) == literal_array(list(spec.shape.columns))

    def new_keys(spec: TableParse) -> Column:
        return F.when(is_row & ~as_shape(spec), F.array_except(
            F.map_keys(image), literal_array(list(spec.shape.columns)))).otherwise(empty)

    def missing(table: str, spec: TableParse) -> Column:
        fixed = tuple(decl.table(table).columns)
        if not fixed:
            return empty
        return F.when(upsert & connect_schema.isNull() & ~as_shape(spec), F.array_except(
            literal_array(fixed), F.map_keys(image))).otherwise(empty)

    def badcast(spec: TableParse) -> Column:
        shape = spec.shape
        typed = [c for c in shape.extras if shape.columns[c].type != "string"]
        return F.when(is_row & connect_schema.isNull(), F.array_compact(F.array(*[
            F.when(image[c].isNotNull() & convert(image[c], shape.columns[c].type, shape.columns[c].convert).isNull(),
                   F.lit(c)) for c in typed
        ]))).otherwise(empty) if typed else empty

    toast = F.when(upsert & F.col("_text").contains(placeholder),
                   F.map_keys(F.map_filter(image, lambda _, x: x == placeholder))).otherwise(empty)

    def part(records: DataFrame, c: Column, new: Column, keys: Column, lacking: Column, bad: Column) -> DataFrame:
        df = records.withColumn("_c", c).select(
            "*", new.alias("_decl_new"), F.when(is_row & connect_schema.isNotNull(), decl_hash).alias("_decl_hash"),
            keys.alias("_new_keys"), lacking.alias("_missing"), bad.alias("_badcast"), toast.alias("_toast"))
        odd = F.col("_decl_new").isNotNull() | (F.size("_new_keys") > 0) | (F.size("_missing") > 0) | \
            (F.size("_badcast") > 0)
        # The raw value is kept for dead letters (and records that may become one) only: the batch's
        # parsed rows stay cached while every table is written, and a wrapped envelope's value is
        # mostly its schema (kilobytes).
        return df.select(
            "kafka_topic", "kafka_partition", "kafka_offset", "kafka_timestamp", "key",
            F.when((F.col("_c.kind") == "dead") | odd, F.col("value")).alias("value"),
            F.col("_c.kind").alias("kind"), F.col("_c.reason").alias("reason"),
            op.alias("_op"), lsn.alias("_lsn"), F.timestamp_millis(e["source"]["ts_ms"]).alias("_source_ts"),
            e["source"]["txId"].alias("_tx_id"), image.alias("_image"),
            "_decl_new", "_decl_hash", "_new_keys", "_missing", "_badcast", "_toast")

    def of(table: str) -> DataFrame:
        return envelopes if all_mine else envelopes.filter(F.col("kafka_topic") == decl.topic(table))

    parts = [part(of(table), classified(table), decl_new(spec), new_keys(spec), missing(table, spec), badcast(spec))
             for table, spec in tables.items()]
    if not all_mine:
        not_mine = dead(F.concat(F.lit("topic '"), F.col("kafka_topic"), F.lit("' is no source table's")))
        others = envelopes.filter(~F.col("kafka_topic").isin(*[decl.topic(t) for t in tables]))
        parts.append(part(others, not_mine, F.lit(None).cast("boolean"), empty, empty, empty))
    return functools.reduce(DataFrame.unionByName, parts)


def image_columns(shape: Shape) -> list[Column]:
    """The image's values as the shape's typed columns (a column the image lacks: null)."""
    return [convert(F.col("_image")[c], col.type, col.convert).alias(c) for c, col in shape.columns.items()]


def dead_letters(events: DataFrame, batch_id: int) -> DataFrame:
    """The `dead` rows of parsed events, in the dead-letter table's shape."""
    return events.filter(F.col("kind") == "dead").select(
        F.concat_ws("/", "kafka_topic", "kafka_partition", "kafka_offset").alias("position"),
        "kafka_topic", "kafka_partition", "kafka_offset", "kafka_timestamp", "key", "value",
        F.concat(F.col("reason"), F.lit(" (at "), F.col("kafka_topic"), F.lit("/"), F.col("kafka_partition"),
                 F.lit("@"), F.col("kafka_offset"), F.lit(")")).alias("reason"),
        F.lit(batch_id).cast("long").alias("batch_id"), F.current_timestamp().alias("ingested_at"),
    )
