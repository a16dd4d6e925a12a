"""Silver's cleaning and validation (Spark) against the contract's rules in plain Python (tests/model.py)."""

from __future__ import annotations

from datetime import UTC

import pytest
from pyspark.sql import functions as F

from lakehouse_dev.generator import ShopSource, WorkloadConfig
from pipelines.ingest.parse import row_schema
from pipelines.lake.contract import COLUMNS, TABLES
from pipelines.runtime.declared import read_declaration
from pipelines.transform.silver import clean, silver_columns
from tests.model import SILVER_RULES

pytestmark = pytest.mark.integration


def _bronze_df(spark, table, rows):
    schema = row_schema(table, read_declaration())
    df = spark.createDataFrame([tuple(r[c] for c in COLUMNS[table]) for r in rows], schema)
    return df.withColumn("_lsn", F.lit(1).cast("long")).withColumn("_source_ts", F.current_timestamp())


def _silver(bronze, table):
    """The shop's silver rows of `bronze`, as the cycle makes them from the declaration in force."""
    decl = read_declaration().table(table)
    return clean(bronze, decl, silver_columns(decl, bronze.columns))


def _normal(value):
    return value.astimezone(UTC).replace(tzinfo=None) if hasattr(value, "astimezone") and value.tzinfo else value


@pytest.mark.parametrize("seed", [1, 8])
def test_spark_cleaning_and_rules_equal_the_contract_model(spark, seed: int) -> None:
    source = ShopSource(seed)
    cfg = WorkloadConfig(seed=seed, customers=300, orders=900, changes=1500, invalid_fraction=0.15)
    source.snapshot(cfg)
    source.changes(cfg)
    for table in TABLES:
        rows = list(source.state[table].values())
        got = {r["id"]: r.asDict() for r in _silver(_bronze_df(spark, table, rows), table).collect()}
        rules_seen = set()
        for row in rows:
            clean, failed = SILVER_RULES[table](row)
            rules_seen.add(failed)
            g = got[row["id"]]
            assert g["failed_rule"] == failed, (table, row, g)
            if failed is None:
                assert {k: _normal(v) for k, v in clean.items()} == {k: g[k] for k in clean}, (table, row)
        assert None in rules_seen and len(rules_seen) >= 3, f"{table}: the workload exercises too few rules"


def test_each_rule_by_example(spark) -> None:
    ts = "2026-03-01T10:15:30.123456Z"
    customers = [
        {"id": 1, "email": "  Alice@Example.COM ", "full_name": "A", "country": " de", "created_at": ts,
         "updated_at": ts},
        {"id": 2, "email": "no-at-sign", "full_name": "B", "country": "DE", "created_at": ts, "updated_at": ts},
        {"id": 3, "email": "b@c.d", "full_name": "C", "country": "1A", "created_at": ts, "updated_at": ts},
        {"id": 4, "email": "b@c.d", "full_name": "D", "country": "FR", "created_at": "yesterday", "updated_at": ts},
    ]
    got = {r["id"]: r for r in _silver(_bronze_df(spark, "customers", customers), "customers").collect()}
    assert (got[1]["email"], got[1]["country"], got[1]["failed_rule"]) == ("alice@example.com", "DE", None)
    assert [got[i]["failed_rule"] for i in (2, 3, 4)] == ["email_format", "country_code", "created_at_timestamp"]
    def order(i: int, status: str = "paid", amount: str = "1.00", currency: str = "EUR") -> dict:
        return {"id": i, "customer_id": 9, "status": status, "amount": amount, "currency": currency,
                "created_at": ts, "updated_at": ts}

    orders = [order(1, amount="12.50"), order(2, status="lost"), order(3, currency="XXX"),
              order(4, amount="-5.00", currency="USD"), order(5, amount="abc", currency="USD"),
              order(6, currency="eur")]
    got = {r["id"]: r for r in _silver(_bronze_df(spark, "orders", orders), "orders").collect()}
    assert str(got[1]["amount"]) == "12.50" and str(got[1]["order_date"]) == "2026-03-01"
    assert [got[i]["failed_rule"] for i in range(1, 7)] == [
        None, "status_value", "currency_value", "amount_non_negative", "amount_decimal", "currency_value"]
