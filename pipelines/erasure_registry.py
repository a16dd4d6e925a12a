"""The erasure registry: pseudonyms of erased customers and orders, the key that makes them, and the
filters that honour them.

Written by `lakehouse gdpr erase` (pipelines.gdpr.erase); read by every job that brings source
data into the lake (ingest, silver), so that a replayed or late event of an erased customer
is dropped on its way in and the customer cannot come back. It lives below the layers that
read it for that reason. Only keyed hashes are stored: the registry holds no personal data.

Ids are pseudonymised with a keyed hash wherever the erasure keeps a record (this registry,
the certificate, the audit log). Source ids are small sequential integers: an unkeyed hash of
one is reversed by hashing every integer, so the key (LAKEHOUSE_ERASURE_KEY, or a key file
kept outside the lake) is what makes the records non-personal for whoever can read the lake.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.declaration import declared
from pipelines.settings import erasure_key_file, gdpr_path
from pipelines.table_stats import has_completed_commit

KINDS = ("customer", "order")


def erasure_key(key_file: Path | None = None) -> str:
    """The secret of the pseudonymising hash, from the first of:

    - LAKEHOUSE_ERASURE_KEY: the key itself;
    - LAKEHOUSE_ERASURE_KEY_SECRET: an AWS Secrets Manager secret (name or ARN) holding it.
      This is how EMR jobs get it: a step's driver runs on any node of the cluster, where a
      key file would not be, and step arguments are visible in the EMR console;
    - a key file (LAKEHOUSE_ERASURE_KEY_FILE), made on first use.

    Every job that hashes (ingest, etl, erasure) must see the same key: with another one,
    the registry no longer recognises erased customers.
    """
    if key := os.environ.get("LAKEHOUSE_ERASURE_KEY"):
        return key
    if secret := os.environ.get("LAKEHOUSE_ERASURE_KEY_SECRET"):
        return _secret_value(secret)
    path = key_file or erasure_key_file()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32))
    return path.read_text().strip()


def _secret_value(secret: str) -> str:
    """The string of an AWS Secrets Manager secret; never made here: every job must find the same one."""
    import boto3

    # An ARN names its region; a name uses the environment's (AWS_REGION, the profile).
    region = secret.split(":")[3] if secret.startswith("arn:") and secret.count(":") >= 6 else None
    try:
        value = boto3.client("secretsmanager", region_name=region).get_secret_value(SecretId=secret)
    except Exception as exc:
        raise RuntimeError(f"LAKEHOUSE_ERASURE_KEY_SECRET={secret}: cannot read the erasure key from AWS Secrets "
                           f"Manager ({type(exc).__name__}: {exc})") from exc
    key = (value.get("SecretString") or "").strip()
    if len(key) < 32:
        raise RuntimeError(f"LAKEHOUSE_ERASURE_KEY_SECRET={secret}: the secret's string is {len(key)} characters; "
                           "the erasure key must be at least 32 (e.g. `openssl rand -hex 32`)")
    return key


def subject_hash(kind: str, value: int, key: str) -> str:
    """Pseudonym of a customer or order id; `hash_column` computes the same in Spark."""
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r}: expected one of {KINDS}")
    return hashlib.sha256(f"{key}:{kind}:{value}".encode()).hexdigest()


def hash_column(kind: str, column: Column, key: str) -> Column:
    """Spark's `subject_hash`: the same pseudonym for the same id."""
    return F.sha2(F.concat(F.lit(f"{key}:{kind}:"), column.cast("string")), 256)


def registry_path(root: str) -> str:
    return f"{gdpr_path(root)}/erased"


def read_registry(spark: SparkSession, root: str) -> DataFrame | None:
    """(subject, kind) of every erased customer and order; None before the first erasure."""
    path = registry_path(root)
    if not has_completed_commit(path):
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
    decl = declared()
    on_orders = F.col("kafka_topic") == (decl.topic("orders") if "orders" in decl.tables else "")
    ids = [F.regexp_extract_all(text, F.lit(rf'"{name}"\s*:\s*"?(\d+)'), F.lit(1)) for name in ("id", "customer_id")]
    customer_ids = F.concat(F.when(~on_orders, F.array(key_id)).otherwise(F.array()),
                            F.when(~on_orders, ids[0]).otherwise(F.array()), ids[1])
    order_ids = F.concat(F.when(on_orders, F.array(key_id)).otherwise(F.array()),
                         F.when(on_orders, ids[0]).otherwise(F.array()))
    return F.concat(F.transform(F.filter(customer_ids, lambda x: x.isNotNull()),
                                lambda x: hash_column("customer", x, key)),
                    F.transform(F.filter(order_ids, lambda x: x.isNotNull()),
                                lambda x: hash_column("order", x, key)))
