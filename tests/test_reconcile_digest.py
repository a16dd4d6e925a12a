"""The lake side of reconcile's digest on a real Spark session: what the first scan kept is what the second pass
reads, for as many differing buckets as a 10M-row table has (about a thousand)."""

from __future__ import annotations

import pytest
from pyspark import StorageLevel
from pyspark.sql import SparkSession

from pipelines.reconcile.canonical import SourceColumn
from pipelines.reconcile.digest import Shape, bucket_of, lake_buckets, lake_frame, lake_rows

pytestmark = pytest.mark.integration


def test_the_rows_of_a_thousand_buckets_come_from_the_kept_frame(spark: SparkSession) -> None:
    shape = Shape((SourceColumn("id", "int8", "N"), SourceColumn("note", "text", "S")), ("id",),
                  {"id": "bigint", "note": "string"}, digits=3)
    rows = 40_000
    bronze = spark.range(rows).selectExpr("id", "concat('n', id) AS note")
    frame = lake_frame(bronze, shape).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        sums = lake_buckets(frame)
        assert sum(n for n, _ in sums.values()) == rows and len(sums) == 16 ** 3
        wanted = sorted(sums)[:999]  # an IN list of this length stays one (spark.toml, inSetConversionThreshold)
        got = lake_rows(frame, wanted)
    finally:
        frame.unpersist()
    keys = {f"{len(str(i))}:{i}": i for i in range(rows)}
    expected = {k for k in keys if bucket_of(k, shape.digits) in set(wanted)}
    assert set(got) == expected
    assert all(got[k].texts == (str(keys[k]), f"n{keys[k]}") for k in expected)
