"""Silver's quality suites from the declaration (no Spark): each rule kind, the key (compound when composite)."""

from __future__ import annotations

import os
import tomllib
from datetime import timedelta

import pytest

from pipelines.lake.declaration import parse
from pipelines.runtime.declared import read_declaration
from pipelines.runtime.lake import Lake
from pipelines.services.quality import silver_expectations, suites
from pipelines.services.quality_due import quality_suites, quality_work

pytestmark = pytest.mark.unit


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
    shop = read_declaration()
    customers, orders = _checks(shop.table("customers")), _checks(shop.table("orders"))
    for checks in (customers, orders):
        assert ("expect_column_values_to_be_unique", (("column", "id"),)) in checks
        assert ("expect_column_values_to_not_be_null", (("column", "id"),)) in checks
    assert {c for t, c in customers if t == "expect_column_values_to_match_regex"} == {
        (("column", "email"), ("regex", r"^[^@\s]+@[^@\s]+\.[^@\s]+$")),
        (("column", "country"), ("regex", "^[A-Z]{2}$"))}
    assert {dict(c)["column"] for t, c in orders if t == "expect_column_values_to_be_in_set"} == {"status", "currency"}
    assert ("expect_column_values_to_be_between", (("column", "amount"), ("min_value", "0.0"))) in orders
    assert any(t == "expect_column_values_to_not_be_null" and dict(c)["column"] == "order_date" for t, c in orders)


@pytest.mark.parametrize("declaration", ["shop", "team"])
def test_the_dag_decides_on_the_suites_quality_runs(declaration: str, tmp_path, monkeypatch) -> None:
    """data_quality decides from `quality_suites` (no Spark) which suites `lakehouse quality` runs: the same names,
    the shop's with gold's, a declaration without gold's inputs without them."""
    if declaration == "team":
        (tmp_path / "team.toml").write_text('[source]\ntopic_prefix = "x"\n[tables.t]\nsource = "app.t"\nkey = ["k"]\n')
        monkeypatch.setenv("LAKEHOUSE_TABLES", str(tmp_path / "team.toml"))
    lake = Lake.at(str(tmp_path / "lake"))
    names = [s.name for s in suites(lake, timedelta(hours=1))]  # builds, reads nothing: no Spark session starts
    assert lake.session is None
    assert names == [spec.name for spec in quality_suites(lake.declaration)]
    assert any(n.startswith("gold/") for n in names) == (declaration == "shop")


@pytest.mark.parametrize(("tables", "jobs"), [(5, [["t0", "t1"], ["t2", "t3"], ["t4"]]), (1, [["t0"]]),
                                              (0, [["customers", "orders"], ["gold"]])])
def test_the_dags_quality_jobs_take_a_few_tables_each(tables: int, jobs: list[list[str]], tmp_path,
                                                       monkeypatch) -> None:
    """data_quality's decision on a lake where no suite has passed yet (every one due), at 2 tables per job
    (table_services.toml [jobs], overridden): the declared tables in the declaration's order, a job's each with
    its bronze and silver suites, gold's as one more table, last; one due table is one job of one table.
    `tables` 0: the shop's declaration."""
    if tables:
        (tmp_path / "team.toml").write_text('[source]\ntopic_prefix = "x"\n' + "".join(
            f'[tables.t{i}]\nsource = "app.t{i}"\nkey = ["k"]\n' for i in range(tables)))
        monkeypatch.setenv("LAKEHOUSE_TABLES", str(tmp_path / "team.toml"))
    (tmp_path / "jobs.toml").write_text("[table_services.jobs]\ntables_per_job = 2\n")
    overrides = [os.environ.get("LAKEHOUSE_HUDI_OVERRIDES"), str(tmp_path / "jobs.toml")]
    monkeypatch.setenv("LAKEHOUSE_HUDI_OVERRIDES", os.pathsep.join(filter(None, overrides)))
    decl = read_declaration()
    decided = quality_work(str(tmp_path / "lake"), decl)  # reads no table: none exists
    assert [job["tables"] for job in decided] == jobs
    suites = {spec.name: spec.group for spec in quality_suites(decl)}
    for job in decided:
        assert job["args"][0] == "quality" and set(job["args"][1::2]) == {"--suite"}
        # Each of its tables' suites, table by table.
        assert job["args"][2::2] == [name for t in job["tables"] for name, group in suites.items() if group == t]
        assert job["label"] == ", ".join(job["tables"])
