"""The schema survey of a batch: per table, the kinds of its events and the shapes they come in, against the
shape the table has (pipelines.ingest.schema decides); events of a shape the table cannot apply become
dead letters (reason `schema: ...`).

The table's shape and the hashes of the declared shapes it has applied are read from main's newest
ingest commit once, then kept by the writer as its commits apply them.
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass, field

from pyspark.sql import Column, DataFrame, Row
from pyspark.sql import functions as F

from pipelines.ingest.connect_types import bronze_column
from pipelines.ingest.parse import TableParse, literal_array
from pipelines.ingest.schema import COLUMNS_META, SCHEMA_REASON, Shape, decide, infer_type, read_accepted
from pipelines.lake.declaration import Declaration
from pipelines.lake.layout import DECLARED_META

log = logging.getLogger(__name__)


@dataclass
class Survey:
    """One table's part of a batch after the schema decision (`SchemaSurvey.survey`)."""

    events: DataFrame  # held events turned into dead letters
    kinds: dict[str, int]
    shape: Shape
    changed: bool = False
    toast: list[str] = field(default_factory=list)  # columns carrying the unavailable-value placeholder
    applied_declared: set[int] = field(default_factory=set)  # hashes of the declared shapes applied


def tally(every: DataFrame) -> list[Row]:
    """One aggregation of the parsed batch: per Kafka partition, kind and Connect schema (a handful of
    groups), the offsets, the records and their values' bytes, when the oldest record entered Kafka (what
    a table's changes have waited, pipelines.ingest.cadence) and what the schema decision needs
    (`SchemaSurvey.survey`)."""
    def distinct(column: str) -> Column:
        return F.collect_set(F.when(F.size(column) > 0, F.col(column)))

    # A record of each new Connect schema comes along, whose `after` fields the decision reads.
    return every.groupBy("kafka_topic", "kafka_partition", "kind", "_decl_hash").agg(
        F.min("kafka_offset").alias("first"), F.max("kafka_offset").alias("last"), F.count("*").alias("n"),
        F.sum("_bytes").alias("bytes"),
        F.min("kafka_timestamp").alias("oldest"),
        F.first(F.when(F.col("_decl_new"), F.col("value")), ignorenulls=True).alias("sample"),
        distinct("_missing").alias("missing"), distinct("_badcast").alias("badcast"),
        F.array_distinct(F.flatten(F.collect_set("_new_keys"))).alias("new_keys"),
        F.array_distinct(F.flatten(F.collect_set("_toast"))).alias("toast")).collect()


class SchemaSurvey:
    """Each table's shape and the declared shapes it has applied, and the survey of each batch against them.

    `decl`: the declaration of the stream's query, whose tables it surveys for all its batches (a changed file
    is followed by the next query, with a survey of its own).
    """

    def __init__(self, root: str, decl: Declaration) -> None:
        self.root = root
        self.decl = decl
        self._main_meta: dict[str, dict[str, str]] = {}
        self._shapes: dict[str, Shape] = {}
        self._declared: dict[str, set[int]] = {}

    def start(self, main_meta: dict[str, dict[str, str]]) -> None:
        """`main_meta`: per table, the metadata of main's newest ingest commit, which records the table's shape."""
        self._main_meta = main_meta

    def shape(self, table: str) -> Shape:
        """The table's columns as the writer's commits left them (at first, as main's newest ingest commit says)."""
        if table not in self._shapes:
            meta = self._main_meta[table]
            self._shapes[table] = Shape.from_meta(self.decl.table(table), meta.get(COLUMNS_META))
            self._declared[table] = set(json.loads(meta.get(DECLARED_META) or "[]"))
        return self._shapes[table]

    def parses(self) -> dict[str, TableParse]:
        """How each table's records are parsed: its shape and the declared shapes that need no decision."""
        return {t: TableParse(self.shape(t), tuple(sorted(self._declared[t]))) for t in self.decl.names}

    def declared_meta(self, table: str, survey: Survey) -> str:
        """`DECLARED_META` of a commit of main that applies `survey`."""
        return json.dumps(sorted(self._declared[table] | survey.applied_declared))

    def keep(self, table: str, shape: Shape) -> None:
        """Main has committed rows of `shape`."""
        self._shapes[table] = shape

    def keep_declared(self, surveys: dict[str, Survey]) -> None:
        """Every table of the batch has committed: the declared shapes it applied need no decision any more."""
        for table, survey in surveys.items():
            self._declared[table] |= survey.applied_declared

    def survey_batch(self, parsed: dict[str, DataFrame], groups: list[Row], batch_id: int) -> dict[str, Survey]:
        """Per table, the survey of the batch's `parsed` events; `groups`: the batch's `tally`."""
        accepted = read_accepted(self.root)
        decl = self.decl
        mine = {table: [g for g in groups if g["kafka_topic"] == decl.topic(table)] for table in decl.names}
        return {table: self.survey(table, parsed[table], mine[table], accepted, batch_id) for table in decl.names}

    def survey(self, table: str, events: DataFrame, groups: list[Row], accepted: set[str], batch_id: int) -> Survey:
        """The batch's kinds and shapes for `table`: its new shape, and its events of a shape it cannot apply
        turned into dead letters (reason `schema: ...`). `groups`: the table's rows of the batch's `tally`;
        the rest runs only when a shape is new."""
        kinds: dict[str, int] = {}
        for g in groups:
            kinds[g["kind"]] = kinds.get(g["kind"], 0) + g["n"]
        row = [g for g in groups if g["kind"] == "row"]
        shape = self._shapes[table]
        survey = Survey(events, kinds, shape)
        if not row:
            return survey

        def union(column: str) -> list:
            return sorted({tuple(v) if isinstance(v, list) else v for g in row for v in g[column]})

        survey.toast = union("toast")
        schemas = self._declared_fields(table, {g["_decl_hash"]: g["sample"] for g in row if g["sample"]})
        missing = [list(m) for m in union("missing")]
        badcast = [list(b) for b in union("badcast")]
        new_keys = [k for k in union("new_keys") if not any(k in {n for n, *_ in f} for f in schemas.values())]
        if not (schemas or missing or badcast or new_keys):
            return survey
        inferred = {k: self._infer(events, k) for k in new_keys}
        decision = decide(shape, list(schemas.values()), missing, inferred, accepted, batch_id)
        survey.shape, survey.changed = decision.shape, decision.changed
        held_declared = {h: decision.held_declared[tuple(f)] for h, f in schemas.items()
                         if tuple(f) in decision.held_declared}
        survey.applied_declared = set(schemas) - set(held_declared)
        holds: list[tuple[Column, str]] = [(F.col("_decl_hash") == h, reason) for h, reason in held_declared.items()]
        holds += [(F.col("_missing") == literal_array(list(m)), reason) for m, reason in decision.held_missing.items()]
        for cast_failed in badcast:
            # (a column this batch widens holds the values now)
            gone = [c for c in cast_failed if f"{table}.{c}" not in accepted
                    and survey.shape.columns[c].type == shape.columns[c].type]
            if gone:
                holds.append((F.col("_badcast") == literal_array(cast_failed),
                              f"{SCHEMA_REASON}{table}.{','.join(gone)}: values that do not fit bronze's type "
                              + ", ".join(shape.columns[c].type for c in gone)))
        if holds:
            is_row = F.col("kind") == "row"
            reason = functools.reduce(lambda acc, h: acc.when(is_row & h[0], F.lit(h[1])),
                                      holds[1:], F.when(is_row & holds[0][0], F.lit(holds[0][1])))
            held = reason.isNotNull()
            survey.events = events.withColumn("reason", F.when(held, reason).otherwise(F.col("reason"))) \
                .withColumn("kind", F.when(held, F.lit("dead")).otherwise(F.col("kind")))
            survey.kinds = {r["kind"]: r["count"] for r in survey.events.groupBy("kind").count().collect()}
            log.warning("bronze/%s held: %s", table, "; ".join(sorted({h[1] for h in holds})))
        if survey.changed:
            log.warning("bronze/%s changes shape: %s", table, ", ".join(
                f"{c.name} {c.type}" for c in survey.shape.columns.values() if shape.columns.get(c.name) != c))
        return survey

    def _declared_fields(self, table: str, samples: dict[int, bytes]) -> dict[int, list[tuple[str, str, str]]]:
        """Per new Connect schema (by hash), `after`'s fields as (name, bronze type, conversion), read from one
        of its records."""
        typed = self.decl.table(table).typed
        fields: dict[int, list[tuple[str, str, str]]] = {}
        for digest, value in samples.items():
            schema = json.loads(value).get("schema") or {}
            after = next((f for f in schema.get("fields") or [] if isinstance(f, dict) and f.get("field") == "after"),
                         None)
            if after is None or not isinstance(after.get("fields"), list):
                log.warning("bronze/%s: a Connect schema (hash %s) has no field list for `after`: the columns its "
                            "records add are not typed from it", table, digest)
                continue
            fields[digest] = [(f.get("field"), *bronze_column(f, typed)) for f in after["fields"]]
        return fields

    @staticmethod
    def _infer(events: DataFrame, column: str, sample: int = 200) -> str | None:
        """The type of a column new to the table, from the JSON values of the bare images that carry it."""
        rows = events.filter((F.col("kind") == "row") & F.col("_decl_hash").isNull()
                             & F.col("_image")[column].isNotNull()).select("value").limit(sample).collect()
        values = []
        for r in rows:
            doc = json.loads(r["value"])
            envelope = doc.get("payload", doc) if "schema" in doc else doc
            image = envelope.get("after") or envelope.get("before") or {}
            values.append(image.get(column))
        return infer_type(values)
