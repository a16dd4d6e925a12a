"""Reconciliation's parts that need no database and no JVM: which source types are compared, how many buckets a
table gets, which buckets differ, and the SQL that PostgreSQL runs for a row's canonical text (the end-to-end
check of both sides against every type of contract section 7 is tests/test_declared_source.py)."""

from __future__ import annotations

import pytest

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
