"""The etl's silver step for a declared table with a composite key: silver and quarantine keyed by the whole key.

Two keys that share a column value are two rows; a key that turns invalid leaves silver for quarantine and
back; a delete leaves both. The step is fed bronze changes directly (`SilverStep`): what the changes of a
composite-keyed bronze are is the ingest's part, tested with it.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.lake.declaration import parse
from pipelines.lake.layout import quarantine_path, silver_path
from pipelines.runtime.lake import Lake
from pipelines.transform.changes import Window
from pipelines.transform.etl import SilverStep, write_silver
from pipelines.transform.silver import silver_columns

pytestmark = pytest.mark.integration

DECLARATION = '''
[source]
topic_prefix = "x"
[tables.stock]
source = "app.stock"
key = ["site", "sku"]
typed = false
columns = { site = "string", sku = "bigint", qty = "string" }
[[tables.stock.rules]]
column = "qty"
cast = "int"
[[tables.stock.rules]]
column = "qty"
min = 0
'''


def _changes(spark: SparkSession, rows: list[tuple]) -> DataFrame:
    """Bronze changes as `bronze_changes` gives them: (site, sku, qty, _lsn, _deleted) and the CDC metadata."""
    return spark.createDataFrame(rows, "site string, sku long, qty string, _lsn long, _deleted boolean") \
        .withColumn("_source_ts", F.current_timestamp()).withColumn("_op", F.lit("u"))


def _read(spark: SparkSession, path: str) -> dict[tuple, dict]:
    return {(r["site"], r["sku"]): r.asDict() for r in spark.read.format("hudi").load(path).collect()}


def test_silver_and_quarantine_keep_one_row_per_composite_key(spark: SparkSession, tmp_path: Path) -> None:
    declaration = parse(tomllib.loads(DECLARATION), "team.toml")
    table, root = declaration.table("stock"), str(tmp_path / "lake")
    lake = Lake(root, declaration, session=spark)

    def cycle(rows: list[tuple], until: str) -> dict[str, int]:
        changes = _changes(spark, rows)
        window = Window(f"{root}/bronze/_changelog/stock", None, until)
        return write_silver(lake, SilverStep(table, window, changes, tuple(silver_columns(table, changes.columns))))

    assert cycle([("a", 1, "5", 10, False), ("b", 1, "7", 11, False), ("a", 2, "-1", 12, False),
                  ("b", 2, "x", 13, False)], "20260301000000000") == {"valid": 2, "invalid": 2, "deleted": 0}
    silver, quarantine = _read(spark, silver_path("stock", root)), _read(spark, quarantine_path("stock", root))
    assert {k: r["qty"] for k, r in silver.items()} == {("a", 1): 5, ("b", 1): 7}
    assert {k: r["failed_rule"] for k, r in quarantine.items()} == {("a", 2): "qty_min", ("b", 2): "qty_cast"}
    assert quarantine[("b", 2)]["qty"] == "x", "quarantine keeps bronze's value"

    # (a, 1) turns invalid, (a, 2) valid, (b, 1) is deleted, (b, 2) stays: one key column shared is not one key.
    assert cycle([("a", 1, "-3", 20, False), ("a", 2, "4", 21, False), ("b", 1, None, 22, True)],
                 "20260301000100000") == {"valid": 1, "invalid": 1, "deleted": 1}
    silver, quarantine = _read(spark, silver_path("stock", root)), _read(spark, quarantine_path("stock", root))
    assert {k: (r["qty"], r["_lsn"]) for k, r in silver.items()} == {("a", 2): (4, 21)}
    assert {k: r["failed_rule"] for k, r in quarantine.items()} == {("a", 1): "qty_min", ("b", 2): "qty_cast"}
    assert dict(spark.read.format("hudi").load(silver_path("stock", root)).dtypes)["qty"] == "int"
