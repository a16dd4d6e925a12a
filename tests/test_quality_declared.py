"""Silver's quality suites from the declaration (no Spark): each rule kind, the key (compound when composite)."""

from __future__ import annotations

import tomllib

from pipelines.declaration import declared, parse
from pipelines.services.quality import silver_expectations


def _checks(table) -> set[tuple]:
    """(expectation type, its arguments) of a table's silver suite."""
    return {(e.expectation_type, tuple(sorted((k, str(v)) for k, v in e.configuration.kwargs.items()
                                                if k not in ("batch_id", "result_format"))))
            for e in silver_expectations(table)}


def test_each_rule_kind_and_a_composite_key() -> None:
    table = parse(tomllib.loads('''
[source]
topic_prefix = "x"
[tables.t]
source = "app.t"
key = ["site", "sku"]
rules = [{ column = "k", one_of = ["a", "b"] }, { column = "c", pattern = "^[0-9]+$" }, { column = "q", min = 0 },
         { column = "q", max = 9 }, { column = "n", not_null = true }, { column = "q", cast = "bigint" },
         { column = "d", cast = "decimal(12,2)" }]
derive = [{ column = "day", date_of = "at" }]
'''), "team.toml").table("t")
    types = {t for t, _ in _checks(table)}
    assert types == {"expect_column_values_to_not_be_null", "expect_compound_columns_to_be_unique",
                     "expect_column_values_to_be_in_set", "expect_column_values_to_match_regex",
                     "expect_column_values_to_be_between", "expect_column_values_to_be_of_type"}
    checks = _checks(table)
    assert ("expect_compound_columns_to_be_unique", (("column_list", "['site', 'sku']"),)) in checks
    assert {("expect_column_values_to_not_be_null", (("column", c),)) for c in ("site", "sku", "n")} <= checks
    assert ("expect_column_values_to_be_of_type", (("column", "q"), ("type_", "LongType"))) in checks
    assert ("expect_column_values_to_be_of_type", (("column", "d"), ("type_", "DecimalType"))) in checks
    assert ("expect_column_values_to_be_of_type", (("column", "day"), ("type_", "DateType"))) in checks
    assert ("expect_column_values_to_be_between", (("column", "q"), ("min_value", "0.0"))) in checks
    assert ("expect_column_values_to_be_between", (("column", "q"), ("max_value", "9.0"))) in checks


def test_the_shop_suites_check_the_contract_rules() -> None:
    customers, orders = _checks(declared().table("customers")), _checks(declared().table("orders"))
    for checks in (customers, orders):
        assert ("expect_column_values_to_be_unique", (("column", "id"),)) in checks
        assert ("expect_column_values_to_not_be_null", (("column", "id"),)) in checks
    assert {c for t, c in customers if t == "expect_column_values_to_match_regex"} == {
        (("column", "email"), ("regex", r"^[^@\s]+@[^@\s]+\.[^@\s]+$")),
        (("column", "country"), ("regex", "^[A-Z]{2}$"))}
    assert {dict(c)["column"] for t, c in orders if t == "expect_column_values_to_be_in_set"} == {"status", "currency"}
    assert ("expect_column_values_to_be_between", (("column", "amount"), ("min_value", "0.0"))) in orders
    assert any(t == "expect_column_values_to_not_be_null" and dict(c)["column"] == "order_date" for t, c in orders)
