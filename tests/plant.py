"""Plant a data-quality fault in a lake, as a bug upstream of silver would: `python -m tests.plant ROOT`.

One counted silver order gets the status 'teleported', which the cleaning rules never let
through; gold's per-day counts still agree, so only silver's status expectation can catch it.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Importable without Spark (Airflow's tests check for this value in the Data Docs).
BAD_STATUS = "teleported"


def plant_bad_status(spark: SparkSession, root: str) -> int:
    """Rewrite one placed/paid silver order with BAD_STATUS (a newer `_lsn`, so the upsert wins); its id."""
    from pyspark.sql import functions as F

    from pipelines.etl import silver_options
    from pipelines.settings import silver_path

    orders = silver_path("orders", root)
    counted = spark.read.format("hudi").load(orders).filter(F.col("status").isin("placed", "paid"))
    victim = counted.orderBy("id").limit(1)
    planted = victim.select(*[c for c in victim.columns if not c.startswith("_hoodie")]) \
        .withColumn("status", F.lit(BAD_STATUS)).withColumn("_lsn", F.col("_lsn") + 1) \
        .withColumn("_hoodie_is_deleted", F.lit(False))
    planted.write.format("hudi").options(**silver_options("silver_orders")).mode("append").save(orders)
    return victim.first()["id"]


if __name__ == "__main__":
    from pipelines.spark import get_spark

    print(plant_bad_status(get_spark("plant"), sys.argv[1]))
