"""Plant a data-quality fault in a lake, as a bug upstream of silver would: `python -m tests.plant ROOT`.

One counted silver order gets the status 'teleported', which the cleaning rules never let
through; gold's per-day counts still agree, so only silver's status expectation can catch it.
`plant_bad_emails` gives silver customers e-mails the rules would have quarantined: the
failed expectation then keeps them in its results, which an erasure must redact.
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


def plant_bad_emails(spark: SparkSession, root: str, n: int) -> list[tuple[int, str]]:
    """Give the first `n` silver customers an e-mail without '@' (newer `_lsn`); their (id, e-mail)."""
    from pyspark.sql import functions as F

    from pipelines.etl import silver_options
    from pipelines.settings import silver_path

    customers = silver_path("customers", root)
    chosen = spark.read.format("hudi").load(customers).orderBy("id").limit(n)
    planted = chosen.select(*[c for c in chosen.columns if not c.startswith("_hoodie")]) \
        .withColumn("email", F.concat(F.lit("planted-"), F.col("id").cast("string"), F.lit(" at shop.test"))) \
        .withColumn("_lsn", F.col("_lsn") + 1).withColumn("_hoodie_is_deleted", F.lit(False)).localCheckpoint()
    planted.write.format("hudi").options(**silver_options("silver_customers")).mode("append").save(customers)
    return [(r["id"], r["email"]) for r in planted.orderBy("id").collect()]


if __name__ == "__main__":
    from pipelines.spark import get_spark

    print(plant_bad_status(get_spark("plant"), sys.argv[1]))
