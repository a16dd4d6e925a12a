"""GDPR erasure of a declared table beyond the shop (contract section 7's last point): real Kafka, Spark, Hudi.

The declaration is the shop's customers and orders plus `payments`, keyed by (region, payment_no), a
string and a bigint, naming its customer in `customer_id` and holding their `card_holder`. Key values
are shared on purpose: ("eu", 1) and ("us", 1), and another's payment numbered like one of the victim's orders.
One run erases a customer with rows in all three tables and one that only `payments` holds. Afterwards
no table, retained version (Spark and hudi-rs, time travel) or file holds their rows or card holders:
the rows whose newest version names them go whole, a payment moved to another customer keeps its
current row; every other row is as before; old events replayed do not bring anything back.
"""

from __future__ import annotations

import dataclasses
import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from hudi import HudiReadOptions
from kafka.admin import KafkaAdminClient, NewTopic
from pyspark.sql import SparkSession

from lakehouse_dev.generator import Message, ShopSource, WorkloadConfig, produce
from pipelines.gdpr.erase import erase_all
from pipelines.gdpr.request import parse_request
from pipelines.gdpr.scan import Subject, scan_lake
from pipelines.ingest.bronze import run_ingest
from pipelines.lake.catalog import erasure_uncovered, lake_tables
from pipelines.lake.contract import TABLES, topic
from pipelines.lake.hudi_timeline import retained_instants
from pipelines.lake.layout import main_path, silver_path
from pipelines.lake.table_stats import has_completed_commit, open_table, read_table
from pipelines.runtime.lake import Lake
from pipelines.transform.etl import run_etl
from tests.declared_tables import DeclaredSource, DeclaredTable
from tests.lake import assert_bronze_equals_model, assert_lake_equals_model
from tests.model import fold_with_lsn
from tests.test_gdpr import erased_model, snapshot, texts_of, theirs_and_moved

pytestmark = pytest.mark.integration


@dataclasses.dataclass
class ShopTopic(DeclaredTable):
    """A declared table on the shop's topics (`shop.public.<name>`), beside the shop's own."""

    @property
    def topic(self) -> str:
        return f"shop.public.{self.name}"


def _same(v: Any) -> Any:
    return v


PAYMENTS = ShopTopic("payments", ("region", "payment_no"),
                     [("region", {"type": "string"}, _same), ("payment_no", {"type": "int64"}, _same),
                      ("customer_id", {"type": "int64"}, _same), ("card_holder", {"type": "string"}, _same),
                      ("amount", {"type": "int32"}, _same)], lambda rng, row: {})
DECLARATION = resources.files("pipelines.lake").joinpath("shop_tables.toml").read_text() + """
[tables.payments]
source = "public.payments"
key = ["region", "payment_no"]
subject = "customer_id"
pii = ["card_holder"]
[[tables.payments.rules]]
column = "amount"
min = 0
"""
ONLY_PAYMENTS = 900_001  # a customer only `payments` holds
VICTIM_TEXTS = ("Vera Cardholder-Victim", "Vera Second-Card", "Vera Third-Card", "Zeno Onlypayments")


def put(source: DeclaredSource, key: tuple, op: str = "c", **values: Any) -> list[Message]:
    """An insert (`c`) or update (`u`) of a payment with exactly these values."""
    source.lsn += 10
    row = {**dict(zip(PAYMENTS.key, key, strict=True)), **values}
    source.state[PAYMENTS.name][key] = row
    return [source._message(PAYMENTS, op, None, row, source.lsn)]


def of_subject(name: str, row: dict[str, Any], victims: set[int], orders: set[int], payments: set[tuple],
               texts: set[str]) -> bool:
    """Independent of pipelines.gdpr: does a row (of lake table `name`) belong to the erased customers?"""
    if row.get("customer_id") in victims:
        return True
    if name.endswith("customers") and row.get("id") in victims:
        return True
    if name.endswith("orders") and row.get("id") in orders:
        return True
    if name.endswith("payments") and (row.get("region"), row.get("payment_no")) in payments:
        return True
    blob = " ".join(str(v) for v in row.values()).lower()
    return any(t.lower() in blob for t in texts)


def payments_rows(spark: SparkSession | None, path: str, instant: str | None = None) -> list[dict[str, Any]]:
    """A payments table's rows as Spark (`spark`) or hudi-rs (None) reads them, at `instant` or now."""
    columns = ["region", "payment_no", "customer_id", "card_holder"]
    if spark is not None:
        reader = spark.read.format("hudi")
        df = (reader.option("as.of.instant", instant) if instant else reader).load(path)
        return [r.asDict() for r in df.select(*[c for c in columns if c in df.columns]).collect()]
    table = open_table(path)
    rows = pa_rows(table.read(HudiReadOptions().with_as_of_timestamp(instant)) if instant else table.read(), table)
    return [{c: r[c] for c in columns if c in r} for r in rows]


def pa_rows(batches: list, table: Any) -> list[dict[str, Any]]:
    import pyarrow as pa

    schema = table.get_schema_with_meta_fields()
    return (pa.Table.from_batches(batches, schema=schema) if batches else schema.empty_table()).to_pylist()


def test_erasure_covers_a_declared_table_with_a_composite_key(spark: SparkSession, broker, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    declaration = tmp_path / "tables.toml"
    declaration.write_text(DECLARATION)
    root = str(tmp_path / "lake")
    for k, v in {"LAKEHOUSE_TABLES": str(declaration), "LAKEHOUSE_ROOT": root,
                 "LAKEHOUSE_ERASURE_KEY_FILE": str(tmp_path / "erasure.key"),
                 "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap}.items():
        monkeypatch.setenv(k, v)
    assert erasure_uncovered(Lake.at(root).declaration) == []
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    admin.create_topics([NewTopic(t, 1, 1) for t in (*(topic(t) for t in TABLES), PAYMENTS.topic)])
    admin.close()

    # The shop, small, and payments. The victim has orders; `other` is another customer.
    shop = ShopSource(31)
    cfg = WorkloadConfig(seed=31, customers=8, orders=20, changes=0, malformed_fraction=0.0, delete_fraction=0.0,
                         orphan_fraction=0.0)
    shop_sent = shop.snapshot(cfg)
    state = fold_with_lsn(shop_sent)[0]
    victim = next(c for c in sorted(state["customers"]) if any(o["customer_id"] == c for o in state["orders"].values()))
    other = next(c for c in sorted(state["customers"]) if c != victim)
    mine = sorted(o for o, row in state["orders"].items() if row["customer_id"] == victim)
    pay = DeclaredSource([PAYMENTS], seed=31)
    vera, otto = "Vera Cardholder-Victim", "Otto Cardholder"
    first = [*put(pay, ("eu", 1), customer_id=victim, card_holder=vera, amount=10),
             *put(pay, ("us", 1), customer_id=other, card_holder=otto, amount=11),  # shares payment_no 1
             *put(pay, ("eu", 2), customer_id=victim, card_holder=vera, amount=12),  # moves to `other` later
             *put(pay, ("eu", 3), customer_id=victim, card_holder="Vera Second-Card", amount=13),  # deleted later
             *put(pay, ("eu", 5), customer_id=other, card_holder=otto, amount=15),  # moves to the victim later
             *put(pay, ("sa", mine[0]), customer_id=other, card_holder=otto, amount=16),  # numbered like an order
             *put(pay, ("ap", 3), customer_id=ONLY_PAYMENTS, card_holder="Zeno Onlypayments", amount=14),
             *put(pay, ("ap", 4), customer_id=other, card_holder=otto, amount=-1)]  # in quarantine
    produce(shop_sent + first, broker.bootstrap)
    run_ingest(Lake.at(root, spark), once=True, bootstrap=broker.bootstrap)
    run_etl(Lake.at(root, spark))
    # A second batch: versions of every kind, after the lake has seen the first.
    second = [*put(pay, ("eu", 2), "u", customer_id=other, card_holder=otto, amount=12),
              *pay.delete(PAYMENTS, ("eu", 3)),
              *put(pay, ("eu", 1), "u", customer_id=victim, card_holder=vera, amount=20),
              *put(pay, ("eu", 5), "u", customer_id=victim, card_holder="Vera Third-Card", amount=15)]
    moved_order = shop.update("orders", mine[0], {"customer_id": other})
    shop_sent += moved_order
    produce(moved_order + second, broker.bootstrap)
    run_ingest(Lake.at(root, spark), once=True, bootstrap=broker.bootstrap)
    run_etl(Lake.at(root, spark))

    victims = {victim, ONLY_PAYMENTS}
    erased_payments = {("eu", 1), ("eu", 3), ("eu", 5), ("ap", 3)}
    orders, moved = theirs_and_moved(shop_sent, {victim})
    texts = texts_of(shop_sent, {victim}) | set(VICTIM_TEXTS)
    assert mine[0] in moved and orders
    before = {name: [dict(r) for r in rows] for name, rows in snapshot(spark, root).items()}
    assert any(of_subject("bronze/_changelog/payments", r, victims, orders, erased_payments, texts)
               for r in before["bronze/_changelog/payments"])

    # The file scan the verification relies on finds their rows by key alone, in bronze, its change log and silver.
    rows_only = Subject(frozenset(), frozenset(), frozenset(),
                        {"payments": frozenset((r, str(n)) for r, n in erased_payments)})
    held = {f.table for f in scan_lake(Lake.at(root, spark), rows_only).findings
            if f.what.startswith("erased row's key")}
    assert {"bronze/payments", "bronze/_changelog/payments", "silver/payments"} <= held, held

    certificates = erase_all(Lake.at(root, spark),
                             [parse_request([victim], "REQ-DECL-1", "dpo@shop.example"),
                              parse_request([ONLY_PAYMENTS], "REQ-DECL-2", "dpo@shop.example")],
                             bootstrap=broker.bootstrap)
    for done in certificates:
        assert done.verified, done.verification.failures
        assert done.status == "erased", done.reference  # the payments-only customer's request too
    run = certificates[0].run
    assert run.rows_of_theirs["payments"] == len(erased_payments)
    assert run.rows_moved_to_other_customers["payments"] == 1
    assert not certificates[0].further_sweeps, "the targeted purge left something behind"

    # Every other row of every table is as before (the moved payment's current row included).
    after = snapshot(spark, root)
    for name, rows in before.items():
        kept = {tuple(r.items()) for r in rows if not of_subject(name, r, victims, orders, erased_payments, texts)}
        assert after.get(name, set()) == kept, f"{name}: rows of other customers changed"
    assert any(dict(r)["region"] == "eu" and dict(r)["payment_no"] == 2 for r in after["silver/payments"])

    # Neither reader finds them in any table, at any retained instant.
    for table in lake_tables(root, Lake.at(root).declaration):
        if not has_completed_commit(table.path):
            continue
        rows = read_table(table.path).to_pylist()
        assert not [r for r in rows if of_subject(table.name, r, victims, orders, erased_payments, texts)], \
            f"hudi-rs finds the subject in {table.name}"
        if "payments" in table.name:
            for instant in retained_instants(spark, table.path):
                for reader in (spark, None):
                    found = [r for r in payments_rows(reader, table.path, instant)
                             if of_subject(table.name, r, victims, orders, erased_payments, texts)]
                    assert not found, f"{table.name} as of {instant} ({'spark' if reader else 'hudi-rs'})"
    # No file holds their ids, rows or card holders, decoded or as raw bytes.
    subject = Subject(frozenset(victims), frozenset(orders), frozenset(texts), rows_only.rows)
    report = scan_lake(Lake.at(root, spark), subject)
    assert report.clean, report.findings[:5]
    for path in Path(root).rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert not [t for t in VICTIM_TEXTS if t.encode() in data], path

    # Bronze and silver equal the sources without them, for both readers.
    def expected_payments() -> dict[tuple, dict[str, Any]]:
        return {k: row for k, row in pay.state[PAYMENTS.name].items() if k not in erased_payments}

    def assert_payments() -> None:
        want = expected_payments()
        for reader in (spark, None):
            got = {(r["region"], r["payment_no"]): r for r in payments_rows(reader, main_path("payments", root))}
            assert got.keys() == want.keys() and all(got[k]["customer_id"] == want[k]["customer_id"] for k in want)
        silver = {(r["region"], r["payment_no"]) for r in payments_rows(spark, silver_path("payments", root))}
        assert silver == {k for k, row in want.items() if row["amount"] >= 0}

    assert_payments()
    expected, lsns = erased_model(shop_sent, {victim}, orders)
    assert_bronze_equals_model(spark, root, expected, lsns)

    # Old events replayed (a connector restart from an early offset): nothing comes back.
    produce(first + second + [m for m in shop_sent if m.topic == topic("customers")], broker.bootstrap)
    run_ingest(Lake.at(root, spark), once=True, bootstrap=broker.bootstrap)
    run_etl(Lake.at(root, spark))
    assert_payments()
    assert_bronze_equals_model(spark, root, expected, lsns)
    assert_lake_equals_model(spark, root, expected)
    assert scan_lake(Lake.at(root, spark), subject).clean

    # The certificates say what was done, without their ids, keys or card holders.
    for done in certificates:
        text = Path(str(done.path)).read_text() + (Path(root) / "_gdpr" / "audit.jsonl").read_text()
        assert not [t for t in texts if t.lower() in text.lower()]
        assert not re.search(r'"(id|customer_id|region|payment_no|card_holder)"', text)
        assert not re.search(rf"\b{ONLY_PAYMENTS}\b", text)
        assert json.loads(Path(str(done.path)).read_text())["run"]["references"] == ["REQ-DECL-1", "REQ-DECL-2"]
