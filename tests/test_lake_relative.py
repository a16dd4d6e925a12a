"""Checkpoints name the tables they read relative to the lake root, and still read the absolute names of before."""

from __future__ import annotations

import pytest

from pipelines.lake.hudi_timeline import consumed
from pipelines.lake.layout import (
    changelog_path,
    dead_letter_path,
    gold_path,
    lake_relative,
    quarantine_path,
    silver_path,
)

pytestmark = pytest.mark.unit


def test_a_table_keeps_its_name_under_any_root() -> None:
    # A root may itself hold a layer's name: only the end of the path names the table.
    for root in ("/tmp/run/lake", "./lake", "s3://lake/prod", "s3a://lake/prod/", "/data/gold/silver"):
        assert lake_relative(changelog_path("orders", root)) == "bronze/_changelog/orders"
        assert lake_relative(silver_path("customers", root)) == "silver/customers"
        assert lake_relative(quarantine_path("orders", root)) == "silver/_quarantine/orders"
        assert lake_relative(gold_path("_customer_orders", root)) == "gold/_customer_orders"
        assert lake_relative(dead_letter_path(root)) == "bronze/_dead_letters"
    assert lake_relative("/somewhere/else") == "/somewhere/else"


def test_checkpoints_written_with_absolute_paths_are_still_read() -> None:
    old = {"/home/ops/lake/bronze/_changelog/orders": "20261101000000000",
           "/home/ops/lake/bronze/_changelog/customers": "20261102000000000"}
    # The same lake, now reached through another root (copied to an object store).
    assert consumed(old, changelog_path("orders", "s3://lake/prod")) == "20261101000000000"
    assert consumed(old, changelog_path("customers", "/home/ops/lake")) == "20261102000000000"
    new = {"bronze/_changelog/orders": "20261103000000000"}
    assert consumed(new, changelog_path("orders", "/anywhere")) == "20261103000000000"
    assert consumed(new, changelog_path("customers", "/anywhere")) is None
