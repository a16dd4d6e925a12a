"""Silver: cleaned, typed and validated rows, per contract section 3.

Pure DataFrame functions (bronze-shaped rows in, silver-shaped rows out) so that each
rule can be tested on its own; the incremental cycle that feeds them is `pipelines.transform.etl`.
A row that fails a rule is not dropped: `failed_rule` names the first rule it broke,
and the cycle keeps it in quarantine instead of silver.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from pipelines import contract

AMOUNT_TYPE = "decimal(12,2)"

# Rule names, as stored in quarantine's `failed_rule`: first match wins, in this order.
CUSTOMER_RULES = ("email_format", "country_code", "created_at_timestamp", "updated_at_timestamp")
ORDER_RULES = ("status_value", "currency_value", "amount_decimal", "amount_non_negative",
               "created_at_timestamp", "updated_at_timestamp")


def _trim(column: str) -> Column:
    """Trimmed of any whitespace, not only spaces (Spark's `trim`): padding may be tabs too."""
    return F.regexp_replace(F.col(column), r"^\s+|\s+$", "")


def _timestamp(column: str) -> Column:
    """Debezium's ISO-8601 UTC text as a timestamp; null if it is not one."""
    return F.to_timestamp(F.col(column))


def _first_failed(checks: list[tuple[str, Column]]) -> Column:
    result = F.lit(None).cast("string")
    for name, ok in reversed(checks):
        result = F.when(~F.coalesce(ok, F.lit(False)), F.lit(name)).otherwise(result)
    return result


def clean_customers(bronze: DataFrame, extras: Sequence[str] = ()) -> DataFrame:
    """Cleaned and typed customers with `failed_rule` (null for a valid row); `extras` carried as they are."""
    email = F.lower(_trim("email"))
    country = F.upper(_trim("country"))
    df = bronze.select(
        "id", email.alias("email"), F.col("full_name"), country.alias("country"),
        _timestamp("created_at").alias("created_at"), _timestamp("updated_at").alias("updated_at"),
        "_lsn", "_source_ts", *extras,
    )
    checks = [
        ("email_format", F.col("email").rlike(contract.EMAIL_PATTERN)),
        ("country_code", F.col("country").rlike(contract.COUNTRY_PATTERN)),
        ("created_at_timestamp", F.col("created_at").isNotNull()),
        ("updated_at_timestamp", F.col("updated_at").isNotNull()),
    ]
    return df.withColumn("failed_rule", _first_failed(checks))


def clean_orders(bronze: DataFrame, extras: Sequence[str] = ()) -> DataFrame:
    """Cleaned and typed orders (amount decimal(12,2), order_date) with `failed_rule`; `extras` carried as they are.

    The rules read the contract's columns only: a source column added since is not validated
    (pipelines.catalog says why silver carries one at all).
    """
    amount_text = _trim("amount")
    df = bronze.select(
        # The contract cleans email and country only: status and currency are checked as delivered.
        "id", "customer_id", "status", "currency",
        amount_text.cast(AMOUNT_TYPE).alias("amount"), amount_text.alias("_amount_text"),
        _timestamp("created_at").alias("created_at"), _timestamp("updated_at").alias("updated_at"),
        "_lsn", "_source_ts", *extras,
    ).withColumn("order_date", F.to_date(F.col("created_at")))
    checks = [
        ("status_value", F.col("status").isin(*contract.ORDER_STATUSES)),
        ("currency_value", F.col("currency").isin(*contract.CURRENCIES)),
        # A numeric(12,2) string: digits with at most two decimals, within 10 integer digits.
        ("amount_decimal", F.col("_amount_text").rlike(r"^-?\d{1,10}(\.\d{1,2})?$") & F.col("amount").isNotNull()),
        ("amount_non_negative", F.col("amount") >= 0),
        ("created_at_timestamp", F.col("created_at").isNotNull()),
        ("updated_at_timestamp", F.col("updated_at").isNotNull()),
    ]
    return df.withColumn("failed_rule", _first_failed(checks)).drop("_amount_text")


CLEANERS = {"customers": clean_customers, "orders": clean_orders}
