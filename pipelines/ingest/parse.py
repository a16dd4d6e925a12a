"""Kafka records of a source topic -> classified rows: a change with its image, a truncate, a tombstone,
a message to ignore, or a dead letter with its reason. Every record yields one row: nothing is dropped
without a trace.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines.ingest.connect_types import convert
from pipelines.ingest.schema import Column as ShapeColumn
from pipelines.ingest.schema import Shape
from pipelines.lake import contract
from pipelines.lake.declaration import Declaration
from pipelines.runtime.settings import unavailable_placeholder

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


def row_schema(table: str, decl: Declaration) -> T.StructType:
    """A table of `decl`: its declared columns with their wire types (the shop's bronze row, without its metadata).

    Bronze mirrors the shop as it arrived; typing and cleaning are silver's job, so a
    value silver will reject still lands here and can be traced back.
    """
    t = decl.table(table)
    return T.StructType([T.StructField(c, T.LongType() if t.wire_type(c) == "bigint" else T.StringType())
                         for c in t.columns])


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
        # would be most of the cost of parsing a backlog.
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


def parse_events(raw: DataFrame, table: str, decl: Declaration, shape: Shape | None = None,
                 known_declared: tuple[int, ...] = (), placeholder: str | None = None) -> DataFrame:
    """Kafka records of one table's topic -> one row per record, classified (`parse_topics`, for one table of
    `decl`; its declared shape unless `shape`)."""
    spec = TableParse(shape or Shape.initial(decl.table(table)), known_declared)
    return parse_topics(raw, {table: spec}, decl, placeholder)


def parse_topics(raw: DataFrame, tables: dict[str, TableParse], decl: Declaration,
                 placeholder: str | None = None) -> DataFrame:
    """Kafka records -> one row per record, classified as its topic's table says (`read_envelopes`, then `classify`).

    `decl` names each table's topic: the declaration the stream's query runs with, whatever the file says now.
    """
    return classify(read_envelopes(raw), tables, decl, placeholder, all_mine=len(tables) == 1)


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


def classify(envelopes: DataFrame, tables: dict[str, TableParse], decl: Declaration, placeholder: str | None = None,
             *, all_mine: bool = False) -> DataFrame:
    """Envelopes (`read_envelopes`) -> one row per record, classified as its topic's table says.

    `kind` is `row` (a change with its image), `truncate`, `tombstone`, `ignored` (op=m)
    or `dead` (with `reason` and the raw `value`). Every input record yields exactly one
    output row, so nothing is dropped without a trace. Each record is classified by the table of
    its topic (a record of another topic is a dead letter), or with `all_mine`, every record by the
    one table of `tables`.

    The tables' rules are data, not code: each record looks up its topic's `_rules` (`_table_rules`: the
    table's key, its bigint columns, its shape, ...) in a literal map, and one expression reads them, so
    the plan is the same size at 50 tables as at one, and the ingest passes every declared table. An
    expression or a filtered part per table would make a plan that Spark analyzes again every batch,
    seconds a batch at 50 tables.

    The image is kept as a map (`_image`); `image_columns` types it by the table's shape. Beside
    it, what the schema decision needs (pipelines.ingest.schema), empty for a record of a known
    shape: `_decl_hash` (of the Connect schema's text, for a wrapped record), `_decl_new` (true when
    that hash is not in the table's `known_declared`),
    `_new_keys` (columns not in `shape`), `_missing` (declared columns absent from a bare
    `after`), `_badcast` (bare values that do not fit their column's type), `_toast` (columns
    carrying the unavailable-value `placeholder`). The raw value is kept for dead letters and
    for records of an unknown shape (they may be held); `_bytes` is its length for every record.
    """
    placeholder = placeholder or unavailable_placeholder()
    kinds = sorted({(c.type, c.convert) for spec in tables.values() for c in _typed_extras(spec.shape)})
    records = envelopes.withColumn("_rules", _rules_lookup(tables, decl, kinds, all_mine))
    record = _Record.of_envelope()
    classified = records.withColumn("_classified", _classification(record)).select(
        "*", *_shape_findings(record, kinds, placeholder))
    return _parsed_rows(classified, record)


@dataclass(frozen=True)
class _Record:
    """The parts of a record that classifying it reads, as expressions over `read_envelopes`' rows and `_rules`."""

    rules: Column  # its table's rules (`_table_rules`); null for a topic of no table
    envelope: Column
    op: Column
    lsn: Column
    image: Column  # the row image the change carries: `before` for a delete, `after` for the others

    @classmethod
    def of_envelope(cls) -> _Record:
        """The record's rules, envelope, op, LSN and image."""
        envelope = F.col("_env")
        op = envelope["op"]
        # An incremental snapshot's reads (a table added while the stream runs: `lakehouse dev source sync`) carry
        # no LSN; `source.sequence`'s last element is the stream position the chunk was read at, past every change
        # of the row the read reflects and before every change after it: it orders like an LSN.
        incremental = F.element_at(F.from_json(envelope["source"]["sequence"], "array<string>"), -1).cast("long")
        source = envelope["source"]
        lsn = F.coalesce(source["lsn"], F.when(source["snapshot"] == "incremental", incremental))
        image = F.when(op == "d", envelope["before"]).otherwise(envelope["after"])
        return cls(F.col("_rules"), envelope, op, lsn, image)


def _rules_lookup(tables: dict[str, TableParse], decl: Declaration, kinds: list[tuple[str, str]],
                  all_mine: bool) -> Column:
    """Step: each record's table rules, looked up by its topic in one literal map (one table's: all of them)."""
    rules = {t: _table_rules(t, spec, decl, kinds) for t, spec in tables.items()}
    if all_mine:
        (looked_up,) = rules.values()
        return looked_up
    if rules:
        return F.create_map(*[x for t, r in rules.items() for x in (F.lit(decl.topic(t)), r)])[
            F.col("kafka_topic")]
    return F.lit(None).cast(_RULES)


def _dead(reason: Column) -> Column:
    return F.struct(F.lit("dead").alias("kind"), reason.alias("reason"))


def _usable(kind: str) -> Column:
    return F.struct(F.lit(kind).alias("kind"), F.lit(None).cast("string").alias("reason"))


def _wrong_types(rules: Column, then: str) -> Column:
    return F.concat(F.lit("fields do not have the types of the "), rules["table"], F.lit(f" envelope ({then}"))


def _classification(record: _Record) -> Column:
    """Step: the record's kind and, for a dead letter, why: the first rule it breaks, in the order they are checked."""
    rules, envelope, op, image = record.rules, record.envelope, record.op, record.image
    side = F.when(op == "d", F.lit(" without before.")).otherwise(F.lit(" without after."))
    return (
        F.when(rules.isNull(),
               _dead(F.concat(F.lit("topic '"), F.col("kafka_topic"), F.lit("' is no source table's"))))
        .when(F.col("value").isNull(), _usable("tombstone"))
        .when(F.encode(F.col("_text"), "UTF-8") != F.col("value"), _dead(F.lit("value is not valid UTF-8 text")))
        .when(F.col("_unparsed"), _dead(
            F.when(F.get_json_object("_text", "$").isNull(), F.lit("value is not valid JSON"))
            .when(~F.ltrim(F.col("_text")).startswith("{"),
                  F.lit("JSON value is not an object, so not a Debezium envelope"))
            .otherwise(_wrong_types(rules, "row images must be objects and source.lsn a JSON number)"))))
        .when(op.isNull(), _dead(F.lit("no 'op' field: not a Debezium envelope")))
        .when(~op.isin(*contract.ROW_OPS, *contract.OTHER_OPS),
              _dead(F.concat(F.lit("unknown op '"), op, F.lit("'"))))
        .when(op == "m", _usable("ignored"))
        .when(record.lsn.isNull(), _dead(F.concat(F.lit("op="), op, F.lit(" without source.lsn"))))
        .when(envelope["source"]["table"].isNotNull() & (envelope["source"]["table"] != rules["source_table"]),
              _dead(F.concat(F.lit("event of table '"), envelope["source"]["table"], F.lit("' on topic "),
                             rules["topic"])))
        .when(op == "t", _usable("truncate"))
        .when(image.isNull(), _dead(F.concat(F.lit("op="), op, F.when(op == "d", F.lit(" without 'before'"))
                                             .otherwise(F.lit(" without 'after'")))))
        .when(F.exists(rules["key"], lambda k: image[k].isNull()),
              _dead(F.concat(F.lit("op="), op, side, rules["key_text"])))
        .when(F.exists(rules["numbers"], lambda c: image[c].isNotNull() & image[c].cast("bigint").isNull()),
              _dead(F.concat(_wrong_types(rules, ""), rules["numbers_text"], F.lit(" must be JSON integers)"))))
        .otherwise(_usable("row"))
    )


def _shape_findings(record: _Record, kinds: list[tuple[str, str]], placeholder: str) -> list[Column]:
    """Step: what the schema decision needs of a row's shape, empty for a record of a known shape (`classify`)."""
    rules, image = record.rules, record.image
    is_row = F.col("_classified.kind") == "row"
    upsert = is_row & (record.op != "d")
    connect_schema = F.col("_schema")  # its JSON text; null for a bare envelope
    decl_hash = F.xxhash64(connect_schema)
    empty = F.array().cast("array<string>")
    # An image whose columns are the shape's, in its order (nearly every record), has nothing new and
    # lacks nothing: one array comparison instead of two set differences per record.
    as_shape = F.map_keys(image) == rules["shape"]

    def does_not_fit(spark_type: str, conversion: str) -> Callable[[Column], Column]:
        return lambda c: image[c].isNotNull() & convert(image[c], spark_type, conversion).isNull()

    unfit = [F.filter(rules[f"typed{i}"], does_not_fit(*kind)) for i, kind in enumerate(kinds)]
    toast = F.when(upsert & F.col("_text").contains(placeholder),
                   F.map_keys(F.map_filter(image, lambda _, x: x == placeholder))).otherwise(empty)
    return [
        F.when(is_row & connect_schema.isNotNull() & ~F.array_contains(rules["known"], decl_hash),
               F.lit(True)).alias("_decl_new"),
        F.when(is_row & connect_schema.isNotNull(), decl_hash).alias("_decl_hash"),
        F.when(is_row & ~as_shape, F.array_except(F.map_keys(image), rules["shape"])).otherwise(empty)
        .alias("_new_keys"),
        F.when(upsert & connect_schema.isNull() & ~as_shape, F.array_except(rules["declared"], F.map_keys(image)))
        .otherwise(empty).alias("_missing"),
        (F.when(is_row & connect_schema.isNull(), F.concat(*unfit)).otherwise(empty) if unfit else empty)
        .alias("_badcast"),
        toast.alias("_toast")]


def _parsed_rows(classified: DataFrame, record: _Record) -> DataFrame:
    """Step: the rows `classify` returns, the raw value kept only where it may be needed."""
    unknown_shape = F.col("_decl_new").isNotNull() | (F.size("_new_keys") > 0) | (F.size("_missing") > 0) | \
        (F.size("_badcast") > 0)
    envelope = record.envelope
    # The raw value is kept for dead letters (and records that may become one) only: the batch's
    # parsed rows stay cached while every table is written, and a wrapped envelope's value is
    # mostly its schema (kilobytes).
    return classified.select(
        "kafka_topic", "kafka_partition", "kafka_offset", "kafka_timestamp", "key",
        F.when((F.col("_classified.kind") == "dead") | unknown_shape, F.col("value")).alias("value"),
        F.col("_classified.kind").alias("kind"), F.col("_classified.reason").alias("reason"),
        record.op.alias("_op"), record.lsn.alias("_lsn"),
        F.timestamp_millis(envelope["source"]["ts_ms"]).alias("_source_ts"),
        envelope["source"]["txId"].alias("_tx_id"), record.image.alias("_image"),
        "_decl_new", "_decl_hash", "_new_keys", "_missing", "_badcast", "_toast",
        # What the record's value weighs, the raw one's (the stream exports bytes read per table).
        F.coalesce(F.length(F.col("value")), F.lit(0)).alias("_bytes"))


# `_table_rules`' fields before the typed extras' (`typed0`, ...): the type of a lookup that finds no table.
_RULES = ("struct<table:string,source_table:string,topic:string,key:array<string>,key_text:string,"
          "numbers:array<string>,numbers_text:string,declared:array<string>,shape:array<string>,known:array<bigint>>")


def _typed_extras(shape: Shape) -> list[ShapeColumn]:
    """A shape's columns added since the declaration whose values are not text: a bare value of one must fit."""
    return [shape.columns[c] for c in shape.extras if shape.columns[c].type != "string"]


def _table_rules(table: str, spec: TableParse, decl: Declaration, kinds: list[tuple[str, str]]) -> Column:
    """What classifying a record of `table` needs to know of it, as a literal struct (`classify`'s `_rules`)."""
    t = decl.table(table)
    numbers = sorted(c for c in t.columns if t.wire_type(c) == "bigint")
    typed = _typed_extras(spec.shape)
    return F.struct(
        F.lit(table).alias("table"), F.lit(t.table).alias("source_table"), F.lit(decl.topic(table)).alias("topic"),
        literal_array(t.key).alias("key"), F.lit("/".join(t.key)).alias("key_text"),
        literal_array(numbers).alias("numbers"), F.lit(", ".join(numbers)).alias("numbers_text"),
        literal_array(tuple(t.columns)).alias("declared"), literal_array(list(spec.shape.columns)).alias("shape"),
        (F.array(*[F.lit(h).cast("bigint") for h in spec.known_declared]) if spec.known_declared
         else F.array().cast("array<bigint>")).alias("known"),
        *[literal_array([c.name for c in typed if (c.type, c.convert) == kind]).alias(f"typed{i}")
          for i, kind in enumerate(kinds)])


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
