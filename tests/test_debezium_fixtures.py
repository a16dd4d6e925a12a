"""The parser on what Debezium 2.7.3 really emits, in both converter settings.

The records in tests/fixtures/debezium/ were captured from the real connector on PostgreSQL 15
(tests/debezium_capture.py): a snapshot, inserts, updates, a delete and its tombstone under
REPLICA IDENTITY DEFAULT, `ALTER TABLE ... ADD COLUMN` and rows that set it, a TRUNCATE.
Expectations come from the independent model's reading of each record (tests/model.py).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from lakehouse_dev.generator import Message
from pipelines.ingest.parse import TableParse, image_columns, parse_events, parse_topics
from pipelines.ingest.schema import Shape
from pipelines.lake.contract import COLUMNS, TABLES, topic
from pipelines.runtime.declared import read_declaration
from tests.model import row_event, unwrap

pytestmark = pytest.mark.integration

FIXTURES = Path(__file__).with_name("fixtures") / "debezium"
KAFKA_SCHEMA = T.StructType([
    T.StructField("topic", T.StringType()), T.StructField("partition", T.IntegerType()),
    T.StructField("offset", T.LongType()), T.StructField("timestamp", T.TimestampType()),
    T.StructField("key", T.BinaryType()), T.StructField("value", T.BinaryType()),
])


def _load(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (FIXTURES / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()]


def _message(record: dict[str, Any]) -> Message:
    return Message(record["topic"], None if record["key"] is None else record["key"].encode(),
                   None if record["value"] is None else record["value"].encode())


@pytest.mark.parametrize(("name", "wrapped"), [("schemas_true", True), ("schemas_false", False)])
def test_parser_on_captured_envelopes(spark: SparkSession, name: str, wrapped: bool) -> None:
    records = _load(name)
    envelopes = [(r, *unwrap(_message(r))) for r in records]
    # The capture holds every case the contract names, in the converter setting it claims.
    ops = {env["op"] for _, _, env in envelopes if env}
    assert ops == {"r", "c", "u", "d", "t"}, ops
    assert any(r["value"] is None for r in records), "no tombstone"
    assert any("loyalty_tier" in (env["after"] or {}) for _, _, env in envelopes if env), "no added column"
    assert all((schema is not None) == wrapped for r, schema, _ in envelopes if r["value"] is not None)

    stamp = datetime(2026, 3, 1, tzinfo=UTC)
    decl = read_declaration()
    for table in TABLES:
        mine = [r for r in records if r["topic"] == topic(table)]
        raw = spark.createDataFrame(
            [(r["topic"], r["partition"], r["offset"], stamp, _message(r).key, _message(r).value) for r in mine],
            KAFKA_SCHEMA)
        parsed = {(p["kafka_partition"], p["kafka_offset"]): p.asDict() for p in parse_events(raw, table, decl)
                  .select("*", *image_columns(Shape.initial(decl.table(table)))).collect()}
        assert len(parsed) == len(mine)
        for record in mine:
            got = parsed[(record["partition"], record["offset"])]
            _, envelope = unwrap(_message(record))
            if envelope is None:
                assert got["kind"] == "tombstone", got
                continue
            if envelope["op"] == "t":
                assert (got["kind"], got["_lsn"]) == ("truncate", envelope["source"]["lsn"]), got
                continue
            event = row_event(envelope)
            assert event is not None and got["kind"] == "row", (got["reason"], record)
            op, key, lsn, image = event
            assert (got["_op"], got["id"], got["_lsn"]) == (op, key, lsn)
            if op != "d":  # a delete's image is its key (REPLICA IDENTITY DEFAULT)
                assert {c: got[c] for c in COLUMNS[table]} == {c: image[c] for c in COLUMNS[table]}


def test_one_pass_over_every_topic_parses_each_record_as_its_table(spark: SparkSession) -> None:
    """The ingest parses a batch's topics in one pass (`parse_topics`); each record must come out exactly as a
    pass over its own topic alone (`parse_events`) reads it, including a record whose envelope names the other
    table (a dead letter of the topic it arrived on)."""
    records = _load("schemas_true") + _load("schemas_false")
    stamp = datetime(2026, 3, 1, tzinfo=UTC)
    rows = [(r["topic"], r["partition"], i, stamp, _message(r).key, _message(r).value) for i, r in enumerate(records)]
    stray = next(r for r in records if r["topic"] == topic("customers") and r["value"])
    rows.append((topic("orders"), 0, len(rows), stamp, None, stray["value"].encode()))
    raw = spark.createDataFrame(rows, KAFKA_SCHEMA)

    def by_position(df: DataFrame) -> dict[tuple[str, int], dict[str, Any]]:
        return {(p["kafka_topic"], p["kafka_offset"]): p.asDict(recursive=True) for p in df.collect()}

    decl = read_declaration()
    one_pass = by_position(parse_topics(raw, {t: TableParse(Shape.initial(decl.table(t))) for t in TABLES}, decl))
    alone: dict[tuple[str, int], dict[str, Any]] = {}
    for table in TABLES:
        alone |= by_position(parse_events(raw.filter(raw.topic == topic(table)), table, decl))
    assert len(one_pass) == len(rows) and one_pass == alone
    assert one_pass[(topic("orders"), len(rows) - 1)]["reason"].startswith("event of table 'customers'")
    assert {r["kind"] for r in one_pass.values()} >= {"row", "tombstone", "truncate", "dead"}
