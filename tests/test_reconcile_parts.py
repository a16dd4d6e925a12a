"""Reconciliation's parts that need no database and no JVM: which source types are compared, how many buckets a
table gets, which buckets differ, and the SQL that PostgreSQL runs for a row's canonical text (the end-to-end
check of both sides against every type of contract section 7 is tests/test_declared_source.py); which Spark types
silver's reconcile compares, and how its report reads (end to end: tests/test_reconcile_silver.py)."""

from __future__ import annotations

import pytest

from pipelines.errors import ReconcileError
from pipelines.reconcile.canonical import SourceColumn, pg_row_text, pg_text
from pipelines.reconcile.digest import MAX_DIGITS, differing, digits_for

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("typname", "category", "kind"), [
    ("int8", "N", "int"), ("float4", "N", "float"), ("numeric", "N", "numeric"), ("bpchar", "S", "char"),
    ("timestamptz", "D", "micros"), ("date", "D", "date"), ("bytea", "U", "bytes"), ("_text", "A", "array"),
    ("mood", "E", "text"), ("jsonb", "U", "text"), ("uuid", "U", "text"),
    ("interval", "T", None), ("time", "D", None), ("money", "N", None), ("tsrange", "R", None)])
def test_each_source_type_has_its_kind_or_is_left_out(typname: str, category: str, kind: str | None) -> None:
    assert SourceColumn("c", typname, category).kind == kind


def test_a_column_of_no_kind_has_no_canonical_text() -> None:
    with pytest.raises(ValueError, match="not compared"):
        pg_text(SourceColumn("span", "interval", "T"))


def test_buckets_grow_with_the_table_and_stop_at_the_cap() -> None:
    assert [digits_for(n) for n in (0, 10, 64 * 16, 64 * 16 + 1, 10**6, 10**7, 10**12)] == [1, 1, 1, 2, 4, 5,
                                                                                          MAX_DIGITS]


def test_a_bucket_differs_by_its_count_its_sum_or_its_absence() -> None:
    source = {"a": (2, 10), "b": (1, 5), "c": (3, 7)}
    lake = {"a": (2, 10), "b": (1, 6), "d": (1, 1)}
    assert differing(source, lake) == ["b", "c", "d"]
    assert differing(source, dict(source)) == []


def test_a_row_s_text_marks_nulls_and_lengths_with_names_quoted() -> None:
    columns = [SourceColumn("Order No", "int8", "N"), SourceColumn("note", "text", "S")]
    text = pg_row_text([pg_text(c) for c in columns]).as_string(None)
    assert '"Order No"::text' in text and "coalesce(length(" in text and "'~'" in text, text


def _fixture_records(name: str) -> list[dict]:
    import json
    from pathlib import Path

    return json.loads((Path(__file__).parent / "fixtures" / "declared" / f"{name}.json").read_text())["records"]


def test_a_heal_s_delete_is_debezium_s_own_delete_at_the_given_position() -> None:
    """The delete a heal writes for a key only the lake holds, from another record of the topic as its template,
    is the event Debezium wrote when that row was deleted: the same key bytes (so the same partition and log
    compaction key), schema, `before` and op; the position is the heal's."""
    import json

    from pipelines.lake.declaration import TableDecl
    from pipelines.reconcile.heal import delete_record

    template = json.loads(_fixture_records("insert")[0]["value"])
    deleted = _fixture_records("delete")[0]
    wanted = json.loads(deleted["value"])
    decl = TableDecl("all_types", "public", "all_types", ("id",))
    key, value = delete_record(template, decl, [SourceColumn("id", "int8", "N")], {"id": "10"}, 26466192)
    got = json.loads(value)
    assert key == deleted["key"].encode()
    assert got["schema"] == wanted["schema"]
    assert {k: got["payload"][k] for k in ("before", "after", "op")} == \
        {k: wanted["payload"][k] for k in ("before", "after", "op")}
    assert got["payload"]["source"]["lsn"] == 26466192 and got["payload"]["source"]["table"] == "all_types"


@pytest.mark.parametrize(("text", "schema", "wire"), [
    ("5", {"type": "int64"}, 5), ("abc", {"type": "string"}, "abc"), ("true", {"type": "boolean"}, True),
    ("19000", {"type": "int32", "name": "io.debezium.time.Date"}, 19000),
    ("1700000000123456", {"type": "int64", "name": "io.debezium.time.Timestamp"}, 1700000000123),
    ("1700000000123456", {"type": "string", "name": "io.debezium.time.ZonedTimestamp"},
     "2023-11-14T22:13:20.123456Z"),
    (str(4612811918334230528), {"type": "double"}, 2.5), ("00ff", {"type": "bytes"}, "AP8="),
    ("7", None, 7)])
def test_a_key_s_canonical_text_becomes_its_json_form(text: str, schema: dict | None, wire: object) -> None:
    from pipelines.reconcile.heal import wire_value

    assert wire_value(text, schema, "bigint") == wire


def test_a_heal_s_key_filter_selects_exactly_the_keys() -> None:
    from pipelines.reconcile.heal import key_filter

    one = key_filter([SourceColumn("id", "int8", "N")], [{"id": "1"}, {"id": "2"}]).as_string(None)
    assert one == """("id" IN ('1', '2'))"""
    two = key_filter([SourceColumn("region", "text", "S"), SourceColumn("at", "timestamp", "D")],
                     [{"region": "eu", "at": "5"}]).as_string(None)
    assert two.startswith("""(("region" = 'eu' AND (round(extract(epoch FROM "at")""") and two.endswith("= '5'))")


def test_a_heal_s_keys_are_packed_into_as_few_signals_as_fit_each_whole() -> None:
    import json

    from pipelines.reconcile import heal

    columns = [SourceColumn("id", "int8", "N")]
    keys = [{"id": str(10_000_000 + i)} for i in range(667)]
    texts = heal.key_signals(None, "public\\.orders", columns, keys, heal.SIGNAL_DATA_WIDTH)
    assert texts is not None and len(texts) == 5 and all(len(t) <= heal.SIGNAL_DATA_WIDTH for t in texts)
    assert len(texts[0]) > heal.SIGNAL_DATA_WIDTH - 12, "a signal is filled before the next is started"
    filters = [json.loads(t)["additional-conditions"][0]["filter"] for t in texts]
    assert [k for f in filters for k in f.removeprefix('("id" IN (').removesuffix("))").split(", ")] == \
        [f"'{k['id']}'" for k in keys], "every key once, in order"
    assert filters[0] == key_filter_text(columns, keys[:filters[0].count(",") + 1])
    composite = [SourceColumn("region", "text", "S"), SourceColumn("n", "int8", "N")]
    wide = heal.key_signals(None, "public\\.t", composite, [{"region": "é\"" * 20, "n": str(i)} for i in range(9)],
                            heal.SIGNAL_DATA_WIDTH)
    assert wide is not None and all(len(t) <= heal.SIGNAL_DATA_WIDTH for t in wide), \
        "escapes counted as JSON writes them"
    many = [{"id": str(i)} for i in range(heal.MAX_SIGNALS * heal.SIGNAL_DATA_WIDTH // 4)]
    assert heal.key_signals(None, "public\\.orders", columns, many, heal.SIGNAL_DATA_WIDTH) is None, \
        "past MAX_SIGNALS the whole table is read instead"
    with pytest.raises(ReconcileError, match="alone does not fit"):
        heal.key_signals(None, "public\\.t", composite, [{"region": "x" * 3000, "n": "1"}], heal.SIGNAL_DATA_WIDTH)


def key_filter_text(columns: list[SourceColumn], keys: list[dict[str, str]]) -> str:
    from pipelines.reconcile.heal import key_filter

    return key_filter(columns, keys).as_string(None)


@pytest.mark.parametrize(("dtype", "kind"), [
    ("bigint", "int"), ("int", "int"), ("smallint", "int"), ("double", "float"), ("float", "float"),
    ("boolean", "bool"), ("decimal(12,2)", "numeric"), ("date", "date"), ("timestamp", "micros"),
    ("timestamp_ntz", "micros"), ("binary", "bytes"), ("array<string>", "array"), ("string", "text"),
    ("struct<a:int>", None), ("map<string,int>", None)])
def test_each_spark_type_of_silver_has_the_kind_its_source_type_would(dtype: str, kind: str | None) -> None:
    from pipelines.reconcile.silver import comparable

    column = comparable("c", dtype)
    assert (column.kind if column else None) == kind


def test_a_silver_report_reads_like_bronze_s_with_its_own_sides() -> None:
    from pipelines.reconcile.cli import _lines
    from pipelines.reconcile.compare import TableReport

    report = TableReport("orders", "bronze/orders", layer="silver", as_of="20261203115501234", source_rows=3,
                         lake_rows=3, missing=[{"id": "1"}], extra=[{"id": "9"}],
                         differ=[{"key": {"id": "2"}, "columns": {"status": {"source": "paid", "lake": "x"}}}],
                         counts={"missing": 1, "extra": 1, "differ": 1, "unsettled": 0})
    assert _lines(report).splitlines() == [
        "silver/orders (against bronze/orders as of 20261203115501234 and the declared rules): DRIFT: expected 3 "
        "rows, silver 3; missing from silver 1, only in silver 1, values differ 1 (0.0 s)",
        "  missing: {'id': '1'}", "  only in silver: {'id': '9'}",
        "  differs: {'id': '2'}: status expected 'paid' silver 'x'"]
    quarantine = TableReport("orders", "bronze/orders", layer="silver_quarantine", counts={"missing": 0})
    first = _lines(quarantine).splitlines()[0]
    assert first.startswith("silver_quarantine/orders (against bronze/orders's newest version") and ": ok: " in first
    assert "the quarantine 0" in first
