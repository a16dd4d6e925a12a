"""The declaration of tables (contract section 7): the shop's own declaration says what the contract says, and a
wrong declaration stops every command before it writes anything, naming the file, the table and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipelines.cli.app import main
from pipelines.errors import DeclarationError
from pipelines.lake import contract
from pipelines.lake.catalog import change_feed_tables, erasure_uncovered, gold_declared, names
from pipelines.lake.declaration import load
from pipelines.runtime.declared import read_declaration

pytestmark = pytest.mark.unit

GOOD = """
[source]
topic_prefix = "erp"

[tables.payments]
source = "billing.payments"
key = ["region", "payment_no"]
subject = "customer_id"
pii = ["card_holder"]

[[tables.payments.rules]]
column = "method"
one_of = ["card", "sepa"]
[[tables.payments.clean]]
column = "currency"
trim = true
upper = true
"""


def test_the_shop_is_declared_as_the_contract_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LAKEHOUSE_TABLES", raising=False)
    decl = read_declaration()
    assert decl.names == contract.TABLES and decl.topic_prefix == contract.TOPIC_PREFIX
    for name in contract.TABLES:
        t = decl.table(name)
        assert decl.topic(name) == contract.topic(name) and t.key == (contract.PRIMARY_KEY,)
        assert tuple(t.columns) == contract.COLUMNS[name]
        assert {c for c, kind in t.columns.items() if kind == "bigint"} == contract.BIGINT_COLUMNS[name]
    orders = {r.name: r for r in decl.table("orders").rules}
    assert orders["status_value"].value == list(contract.ORDER_STATUSES)
    assert orders["currency_value"].value == list(contract.CURRENCIES)
    customers = {r.name: r for r in decl.table("customers").rules}
    assert customers["email_format"].value == contract.EMAIL_PATTERN
    assert customers["country_code"].value == contract.COUNTRY_PATTERN
    assert gold_declared(decl) and not erasure_uncovered(decl)


def test_a_team_declaration_drives_the_catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "tables.toml"
    path.write_text(GOOD)
    monkeypatch.setenv("LAKEHOUSE_TABLES", str(path))
    decl = read_declaration()
    assert decl.topic("payments") == "erp.billing.payments" and decl.table("payments").key == ("region", "payment_no")
    assert decl.table_of_topic("erp.billing.payments") == "payments"
    assert names(decl) == ["bronze/payments", "bronze/_deletes/payments", "bronze/_changelog/payments",
                       "bronze/_dead_letters", "silver/payments", "silver/_quarantine/payments"]
    assert change_feed_tables(decl) == {"bronze/payments": ("region", "payment_no"),
                                    "silver/payments": ("region", "payment_no")}
    assert not gold_declared(decl), "gold's aggregates need the shop's customers and orders"
    assert erasure_uncovered(decl) == [], "the erasure covers any table with a subject column"
    path.write_text(GOOD.replace("billing.payments", "billing.pay"))  # each read reads the file as it is
    assert read_declaration().topic("payments") == "erp.billing.pay"


@pytest.mark.parametrize(("change", "message"), [
    (lambda t: t.replace('topic_prefix = "erp"', ""), r"\[source\] topic_prefix is required"),
    (lambda t: t.replace('key = ["region", "payment_no"]', "key = []"), r"tables\.payments\.key: must be a non-empty"),
    (lambda t: t.replace('source = "billing.payments"', 'source = "payments"'),
     r"tables\.payments\.source: must be \"schema\.table\""),
    (lambda t: t.replace("one_of = [", "one_off = ["),
     r"tables\.payments\.rules\[0\]: unknown field\(s\) \['one_off'\]"),
    (lambda t: t.replace('column = "method"', 'column = "method"\npattern = "x"'),
     r"tables\.payments\.rules\[0\]: exactly one of"),
    (lambda t: t.replace("upper = true", "upper = true\nlower = true"),
     r"tables\.payments\.clean\[0\]: upper and lower"),
    (lambda t: t.replace('pii = ["card_holder"]', 'pii = ["card_holder"]\nowner = "x"'),
     r"tables\.payments: unknown field\(s\) \['owner'\]"),
    (lambda t: t + '\n[tables.payments]\nsource = "billing.other"\nkey = ["id"]\n', r"not valid TOML"),
    (lambda t: t + '\n[tables.copy]\nsource = "billing.payments"\nkey = ["id"]\n',
     r"tables\.copy: source 'billing\.payments' is already declared as tables\.payments"),
    (lambda t: t.replace("[tables.payments]", "[tables.Payments]").replace("tables.payments.", "tables.Payments."),
     r"tables\.Payments: the lake's name must be lower-case"),
    (lambda t: t.replace('key = ["region", "payment_no"]', 'key = ["region", "payment_no"]\n'
                         'typed = false\ncolumns = { region = "string", payment_no = "bigint" }'),
     r"tables\.payments\.subject: column 'customer_id' is not among the table's declared columns"),
    (lambda t: t.replace('subject = "customer_id"\n', ""), r"tables\.payments\.pii: personal data needs a `subject`"),
    (lambda t: t.replace('key = ["region", "payment_no"]', 'key = ["region", "payment_no"]\nfreshness_seconds = "15"'),
     r"tables\.payments\.freshness_seconds: must be a number of seconds from 1 to 86400 \(got '15'\)"),
    (lambda t: t.replace('key = ["region", "payment_no"]', 'key = ["region", "payment_no"]\nbuckets = 0'),
     r"tables\.payments\.buckets: must be a whole number from 1 to 4096 \(got 0\)"),
    (lambda t: t.replace('key = ["region", "payment_no"]', 'key = ["region", "payment_no"]\ncompact_every = 2.5'),
     r"tables\.payments\.compact_every: must be a whole number from 1 to 1000 \(got 2\.5\)"),
])
def test_a_wrong_declaration_names_file_table_and_field_and_nothing_runs(tmp_path: Path, change, message) -> None:
    path = tmp_path / "tables.toml"
    path.write_text(change(GOOD))
    with pytest.raises(DeclarationError, match=message) as error:
        load(path)
    assert str(error.value).startswith(str(path))
    # Every command reads it first: nothing starts, nothing is written.
    root = tmp_path / "lake"
    result = CliRunner().invoke(main, ["etl"], env={"LAKEHOUSE_TABLES": str(path), "LAKEHOUSE_ROOT": str(root)})
    assert result.exit_code == 2 and str(path) in result.output, result.output
    assert not root.exists()


def test_a_missing_declaration_file_is_named(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["status"], env={"LAKEHOUSE_TABLES": str(tmp_path / "none.toml")})
    assert result.exit_code == 2 and "none.toml: no such declaration file" in result.output
    assert json.loads(json.dumps(result.output))  # printable as it is: no traceback
    assert "Traceback" not in result.output
