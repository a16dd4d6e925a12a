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
    from pyspark.sql import Column, DataFrame, SparkSession

# Importable without Spark (Airflow's tests check for this value in the Data Docs).
BAD_STATUS = "teleported"


def _plant(root: str, table: str, rows: DataFrame, column: str, value: Column) -> DataFrame:
    """`rows` of silver `table` written again with `column` = `value` and a newer `_lsn` (so the upsert wins)."""
    from pyspark.sql import functions as F

    from pipelines.lake.layout import silver_path
    from pipelines.transform.etl import silver_options

    planted = rows.select(*[c for c in rows.columns if not c.startswith("_hoodie")]) \
        .withColumn(column, value).withColumn("_lsn", F.col("_lsn") + 1) \
        .withColumn("_hoodie_is_deleted", F.lit(False)).localCheckpoint()
    planted.write.format("hudi").options(**silver_options(f"silver_{table}")).mode("append") \
        .save(silver_path(table, root))
    return planted


def plant_bad_status(spark: SparkSession, root: str) -> int:
    """Rewrite one placed/paid silver order with BAD_STATUS; its id."""
    from pyspark.sql import functions as F

    from pipelines.lake.layout import silver_path

    counted = spark.read.format("hudi").load(silver_path("orders", root)).filter(F.col("status").isin("placed", "paid"))
    return _plant(root, "orders", counted.orderBy("id").limit(1), "status", F.lit(BAD_STATUS)).first()["id"]


def plant_bad_emails(spark: SparkSession, root: str, n: int) -> list[tuple[int, str]]:
    """Give the first `n` silver customers an e-mail without '@'; their (id, e-mail)."""
    from pyspark.sql import functions as F

    from pipelines.lake.layout import silver_path

    chosen = spark.read.format("hudi").load(silver_path("customers", root)).orderBy("id").limit(n)
    planted = _plant(root, "customers", chosen, "email",
                     F.concat(F.lit("planted-"), F.col("id").cast("string"), F.lit(" at shop.test")))
    return [(r["id"], r["email"]) for r in planted.orderBy("id").collect()]


if __name__ == "__main__":
    from pipelines.runtime.spark import get_spark

    print(plant_bad_status(get_spark("plant"), sys.argv[1]))
