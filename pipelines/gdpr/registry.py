"""The erasure registry: pseudonyms of erased customers and orders, and the filters that honour it.

Written by `lakehouse gdpr erase` (pipelines.gdpr.erase); read by every job that brings source
data into the lake (ingest, silver), so that a replayed or late event of an erased customer
is dropped on its way in and the customer cannot come back. Only keyed hashes are stored
(pipelines.gdpr.request): the registry holds no personal data.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines import contract
from pipelines.settings import gdpr_path
from pipelines.table_stats import exists


def hash_column(kind: str, column: Column, key: str) -> Column:
    """Spark's `subject_hash`: the same pseudonym for the same id."""
    return F.sha2(F.concat(F.lit(f"{key}:{kind}:"), column.cast("string")), 256)


def registry_path(root: str) -> str:
    return f"{gdpr_path(root)}/erased"


def read_registry(spark: SparkSession, root: str) -> DataFrame | None:
    """(subject, kind) of every erased customer and order; None before the first erasure."""
    path = registry_path(root)
    if not exists(path):
        return None
    return spark.read.format("hudi").load(path).select("subject", "kind")


def without_erased(changes: DataFrame, table: str, registry: DataFrame | None, key: str) -> DataFrame:
    """Source changes minus those of erased customers and their orders (ingest and silver apply it)."""
    if registry is None:
        return changes
    erased = F.broadcast(registry.select("subject").distinct())
    if table == "customers":
        return changes.join(erased, hash_column("customer", changes["id"], key) == erased["subject"], "left_anti")
    by_order = changes.join(erased, hash_column("order", changes["id"], key) == erased["subject"], "left_anti")
    return by_order.join(erased, hash_column("customer", by_order["customer_id"], key) == erased["subject"],
                         "left_anti")


def dead_letters_without_erased(rows: DataFrame, registry: DataFrame | None, key: str) -> DataFrame:
    """Dead letters minus records whose Kafka key or envelope names an erased customer or order."""
    return rows if registry is None else _by_erased(rows, registry, key, "left_anti")


def dead_letters_of_erased(rows: DataFrame, registry: DataFrame, key: str) -> DataFrame:
    """The dead letters whose Kafka key or envelope names an erased customer or order."""
    return _by_erased(rows, registry, key, "left_semi")


def _by_erased(rows: DataFrame, registry: DataFrame, key: str, how: str) -> DataFrame:
    erased = F.broadcast(registry.select("subject").distinct())
    return rows.withColumn("_h", dead_letter_hashes(rows, key)).join(
        erased, F.array_contains(F.col("_h"), erased["subject"]), how).drop("_h")


def dead_letter_hashes(rows: DataFrame, key: str) -> Column:
    """Pseudonyms of every id a dead letter may name: its Kafka key, and the envelope's (customer) ids."""
    text = F.col("value").cast("string")
    key_id = F.get_json_object(F.col("key").cast("string"), "$.id")
    on_orders = F.col("kafka_topic") == contract.topic("orders")
    ids = [F.regexp_extract_all(text, F.lit(rf'"{name}"\s*:\s*"?(\d+)'), F.lit(1)) for name in ("id", "customer_id")]
    customer_ids = F.concat(F.when(~on_orders, F.array(key_id)).otherwise(F.array()),
                            F.when(~on_orders, ids[0]).otherwise(F.array()), ids[1])
    order_ids = F.concat(F.when(on_orders, F.array(key_id)).otherwise(F.array()),
                         F.when(on_orders, ids[0]).otherwise(F.array()))
    return F.concat(F.transform(F.filter(customer_ids, lambda x: x.isNotNull()),
                                lambda x: hash_column("customer", x, key)),
                    F.transform(F.filter(order_ids, lambda x: x.isNotNull()),
                                lambda x: hash_column("order", x, key)))
