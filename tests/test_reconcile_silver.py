"""`lakehouse reconcile --layer silver` on a lake the pipeline built (the shared lake: ingest, then one etl cycle):
silver and its quarantine equal what the declared rules make of bronze as of the version they consumed, with
bronze moved on since, and after an incremental cycle that catches up; rows changed, deleted and added in silver
and its quarantine by Hudi writes of the test's own are each named with their kind (and, for a changed row, its
columns), and the command exits 1."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from lakehouse_dev.generator import WorkloadConfig
from pipelines.ingest.bronze import run_ingest
from pipelines.lake.catalog import silver_options
from pipelines.lake.layout import DELETED_FLAG, quarantine_path, silver_path
from pipelines.runtime.lake import Lake
from tests.lake import LakeCopy, run_cli

pytestmark = pytest.mark.integration

TABLE = "orders"


def _reports(*args: str) -> tuple[int, dict[str, dict[str, Any]]]:
    done = run_cli("reconcile", "--layer", "silver", "--table", TABLE, "--json", *args)
    assert done.exit_code in (0, 1), done.output
    return done.exit_code, {r["layer"]: r for r in json.loads(done.stdout)}


def _rows(spark: SparkSession, path: str) -> DataFrame:
    rows = spark.read.format("hudi").load(path)
    return rows.drop(*[c for c in rows.columns if c.startswith("_hoodie_") and c != DELETED_FLAG])


def _upsert(frame: DataFrame, path: str, name: str) -> None:
    frame.write.format("hudi").options(**silver_options(name, ("id",))) \
        .option("hoodie.datasource.write.operation", "upsert").mode("append").save(path)


def _no_drift() -> dict[str, dict[str, Any]]:
    code, found = _reports()
    assert code == 0, found
    assert set(found) == {"silver", "silver_quarantine"}
    for report in found.values():
        assert not report["drift"] and report["counts"] == {"missing": 0, "extra": 0, "differ": 0, "unsettled": 0}
        assert report["as_of"] and report["source_rows"] == report["lake_rows"] > 0, report
        assert not report["source_only"] and not report["not_compared"], report
    return found


def test_silver_behind_bronze_is_not_drift_and_tampered_rows_are(spark: SparkSession, lake: LakeCopy,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from pipelines.transform.etl import silver_cycle

    monkeypatch.setenv("LAKEHOUSE_ROOT", lake.root)
    # Bronze moves on past what the etl consumed: silver is behind, not wrong.
    lake.produce(lake.source.changes(WorkloadConfig(seed=41, changes=120)))
    run_ingest(Lake.at(lake.root, spark), once=True, bootstrap=lake.bootstrap)
    behind = _no_drift()
    # An incremental cycle brings silver up to bronze (it has work: silver was behind), and is exact too.
    counts = silver_cycle(Lake.at(lake.root, spark), TABLE)
    assert sum(counts.values()) > 0, counts
    caught_up = _no_drift()
    assert {layer: (behind[layer]["as_of"] < r["as_of"]) for layer, r in caught_up.items()} == \
        {"silver": True, "silver_quarantine": True}, (behind, caught_up)

    # Behind the etl's back: one silver row changed, one deleted (flagged, as the etl deletes), one added; one
    # quarantined row deleted.
    silver = _rows(spark, silver_path(TABLE, lake.root))
    changed, gone, copied = silver.orderBy("id").limit(3).collect()
    frame = spark.createDataFrame([changed, gone, copied], silver.schema)
    tampered = frame.withColumn("_lsn", F.col("_lsn") + 1) \
        .withColumn("status", F.when(F.col("id") == changed["id"], F.lit("tampered")).otherwise(F.col("status"))) \
        .withColumn(DELETED_FLAG, F.col("id") == gone["id"]) \
        .withColumn("id", F.when(F.col("id") == copied["id"], F.col("id") + 10**9).otherwise(F.col("id")))
    _upsert(tampered, silver_path(TABLE, lake.root), f"silver_{TABLE}")
    quarantine = _rows(spark, quarantine_path(TABLE, lake.root))
    held = quarantine.orderBy("id").limit(1).collect()[0]
    _upsert(spark.createDataFrame([held], quarantine.schema).withColumn("_lsn", F.col("_lsn") + 1)
            .withColumn(DELETED_FLAG, F.lit(True)), quarantine_path(TABLE, lake.root), f"silver_quarantine_{TABLE}")

    code, found = _reports()
    assert code == 1
    report = found["silver"]
    assert report["drift"] and report["counts"] == {"missing": 1, "extra": 1, "differ": 1, "unsettled": 0}, report
    assert report["missing"] == [{"id": str(gone["id"])}], report
    assert report["extra"] == [{"id": str(copied["id"] + 10**9)}], report
    assert [d["key"] for d in report["differ"]] == [{"id": str(changed["id"])}], report
    assert report["differ"][0]["columns"]["status"] == {"source": changed["status"], "lake": "tampered"}, report
    assert set(report["differ"][0]["columns"]) == {"status", "_lsn"}, report
    report = found["silver_quarantine"]
    assert report["counts"] == {"missing": 1, "extra": 0, "differ": 0, "unsettled": 0}, report
    assert report["missing"] == [{"id": str(held["id"])}], report
