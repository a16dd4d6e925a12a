"""Source schema changes on the generator's stream (contract section 6), on copies of the shared lake.

- Shapes mixed in one micro-batch: records of the contract's shape, then columns added (typed by
  the Connect schema of wrapped records, inferred for bare ones), updates setting them, a TOASTed
  text column and updates that leave it unchanged (the placeholder), replays of old-shape records
  after new-shape ones; a second batch widens an added column's type, drops an added column and
  replays again. Bronze must equal the model column by column, silver and gold the contract's rules.
- An incompatible change (a contract column renamed): only that table held, with the reason, in the
  dead-letter store and in `lakehouse status`; the other table goes on; accepted and replayed, the
  held events all apply.
"""

from __future__ import annotations

import random
import re
import string
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from lakehouse_dev.generator import Message, WorkloadConfig
from pipelines.ingest.bronze import run_ingest
from pipelines.ingest.schema import COLUMNS_META, Shape
from pipelines.lake.contract import COLUMNS, topic
from pipelines.lake.declaration import SHOP
from pipelines.lake.hudi_timeline import latest_meta
from pipelines.lake.layout import main_path, quarantine_path, silver_path
from pipelines.lake.table_stats import read_table
from pipelines.runtime.declared import read_declaration
from pipelines.runtime.lake import Lake
from pipelines.transform.changes import read_changes
from pipelines.transform.etl import run_etl
from tests.lake import (
    LakeCopy,
    assert_bronze_equals_model,
    assert_lake_equals_model,
    bronze_hudi_rs,
    dead_letters,
    run_cli,
)
from tests.model import expected_silver, fold_with_lsn, row_event, unwrap

ADDED = ("loyalty_tier", "points", "notes")


def _text(rng: random.Random, size: int) -> str:
    """Text that does not compress (PostgreSQL would TOAST it out of line)."""
    return "".join(rng.choice(string.ascii_letters) for _ in range(size))


def _bronze_extras(spark: SparkSession, root: str, table: str, columns: tuple[str, ...]) -> dict[str, dict]:
    spark_rows = {r["id"]: r.asDict() for r in spark.read.format("hudi").load(main_path(table, root))
                  .select("id", *columns).collect()}
    rs_rows = {r["id"]: r for r in read_table(main_path(table, root), ["id", *columns]).to_pylist()}
    return {"spark": spark_rows, "hudi-rs": rs_rows}


def _declare_silver_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: tuple[str, ...]) -> None:
    """LAKEHOUSE_TABLES: a copy of the shop's declaration whose customers carry `extra` into silver."""
    shop = (Path(__file__).parents[1] / "pipelines" / "lake" / SHOP).read_text()
    columns = re.search(r"^\[tables\.customers\]\n(?:.*\n)*?columns = .*\n", shop, re.MULTILINE)
    assert columns, "the shop's declaration declares customers' columns"
    path = tmp_path / f"tables-{len(extra)}.toml"
    path.write_text(shop[:columns.end()] + f"silver_extra = {list(extra)!r}\n".replace("'", '"')
                    + shop[columns.end():])
    monkeypatch.setenv("LAKEHOUSE_TABLES", str(path))


@pytest.mark.integration
def test_mixed_shapes_in_one_batch_and_old_shape_replays(spark: SparkSession, lake: LakeCopy, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # The declaration's line: silver carries one added column from the start.
    _declare_silver_extra(tmp_path, monkeypatch, ("points",))
    src, rng = lake.source, random.Random(231)
    cfg = WorkloadConfig(seed=231, changes=120, replay_runs=0, malformed_fraction=0.0, other_ops=False,
                         schema_fraction=0.5)
    old_shape = [m for m in lake.sent if m.topic == topic("customers") and row_event(unwrap(m)[1])][-80:]
    first: list[Message] = src.changes(cfg)[:60]
    src.alter("customers", add={"loyalty_tier": "string", "points": "int32", "notes": "string"})
    ids = sorted(src.state["customers"])[:16]
    for i in ids:
        first += src.update("customers", i, {"loyalty_tier": rng.choice(["gold", "silver"]), "points": i * 10,
                                             "notes": _text(rng, 6000)}, cfg)
    first += src.changes(cfg)
    for i in [i for i in ids[:8] if i in src.state["customers"]]:  # the value was set earlier in the same batch
        first += src.update("customers", i, {"full_name": f"Renamed {i}"}, cfg, unchanged=("notes",))
    first += old_shape[:40]
    lake.produce(first)
    run_ingest(Lake.at(lake.root, spark), once=True, bootstrap=lake.bootstrap)
    run_etl(Lake.at(lake.root, spark))
    # Then every added column, and one the source never adds: silver lacks two that bronze has, for rows
    # that will not change again, so the next cycle reads bronze whole.
    _declare_silver_extra(tmp_path, monkeypatch, (*ADDED, "vip_since"))

    src.alter("customers", retype={"points": "int64"})
    second: list[Message] = []
    for i in [i for i in ids[8:] if i in src.state["customers"]]:  # the value is only in bronze now
        second += src.update("customers", i, {"points": 2**40 + i}, cfg, unchanged=("notes",))
    src.alter("customers", drop=["loyalty_tier"])
    second += src.changes(cfg) + old_shape[40:] + first[:50]
    for i in [i for i in ids[:4] if i in src.state["customers"]]:
        second += src.update("customers", i, {"full_name": f"Again {i}"}, cfg, unchanged=("notes",))
    lake.produce(second)
    run_ingest(Lake.at(lake.root, spark), once=True, bootstrap=lake.bootstrap)
    run_etl(Lake.at(lake.root, spark))

    # What the test claims happened on the topics.
    envelopes = [unwrap(m) for m in first + second]
    assert any(s is not None and "points" in (e["after"] or {}) for s, e in envelopes if e), "no wrapped new shape"
    assert any(s is None and "points" in (e["after"] or {}) for s, e in envelopes if e), "no bare new shape"
    assert any(e and "__debezium_unavailable_value" in (e["after"] or {}).values() for _, e in envelopes)

    expected, lsns = fold_with_lsn(lake.sent)
    shaped = {t: {k: {c: r.get(c) for c in COLUMNS[t]} for k, r in rows.items()} for t, rows in expected.items()}
    assert_bronze_equals_model(spark, lake.root, shaped, lsns)
    for reader, rows in _bronze_extras(spark, lake.root, "customers", ADDED).items():
        want = {k: {c: r.get(c) for c in ADDED} for k, r in expected["customers"].items()}
        got = {k: {c: r[c] for c in ADDED} for k, r in rows.items()}
        wrong = [(k, got[k], want[k]) for k in want if got[k] != want[k]]
        assert not wrong, f"{reader}: {len(wrong)} rows differ in the added columns, e.g. {wrong[:1]!r:.600}"
    assert any(r["notes"] for r in expected["customers"].values())
    shape = Shape.from_meta(read_declaration().table("customers"),
                            latest_meta(spark, main_path("customers", lake.root), COLUMNS_META))
    assert {c: shape.columns[c].type for c in ADDED} == {"loyalty_tier": "string", "points": "bigint",
                                                         "notes": "string"}
    assert shape.columns["points"].widened and shape.columns["points"].widened[0][0] == "int"
    assert not [d for d in dead_letters(lake.root) if d["reason"].startswith("schema")]
    assert_lake_equals_model(spark, lake.root, shaped)
    _assert_silver_carries_extras(spark, lake.root, expected["customers"])


def _assert_silver_carries_extras(spark: SparkSession, root: str, expected: dict[int, dict[str, Any]]) -> None:
    """silver/customers holds the declaration's extra columns as bronze does (widened, null once dropped);
    `lakehouse changes bronze/customers` serves every added column."""
    silver = spark.read.format("hudi").load(silver_path("customers", root))
    assert dict(silver.dtypes)["points"] == "bigint" and "vip_since" not in silver.columns, silver.dtypes
    assert set(ADDED) <= set(spark.read.format("hudi").load(quarantine_path("customers", root)).columns)
    valid, _ = expected_silver({"customers": expected, "orders": {}})
    want = {k: {c: expected[k].get(c) for c in ADDED} for k in valid["customers"]}
    assert any(w["loyalty_tier"] for w in want.values()) and any(w["points"] for w in want.values())
    readers = {"spark": [r.asDict() for r in silver.select("id", *ADDED).collect()],
               "hudi-rs": read_table(silver_path("customers", root), ["id", *ADDED]).to_pylist()}
    for reader, rows in readers.items():
        got = {r["id"]: {c: r[c] for c in ADDED} for r in rows}
        wrong = [(k, got.get(k), want[k]) for k in want if got.get(k) != want[k]]
        assert got.keys() == want.keys() and not wrong, f"silver, {reader}: {wrong[:1]!r:.600}"
    served = read_changes(Lake.at(root, spark), "bronze/customers", None).rows
    assert set(ADDED) <= set(served.columns), served.columns


def _orders_rows(messages: list[Message]) -> int:
    """Orders' row events of the new shape: all but bare deletes (a key-only image shows no shape, and applies)."""
    return sum(1 for m in messages if m.topic == topic("orders") and (event := row_event(unwrap(m)[1]))
               and not (event[0] == "d" and unwrap(m)[0] is None))


@pytest.mark.integration
def test_incompatible_change_holds_only_that_table(spark: SparkSession, lake: LakeCopy) -> None:
    src = lake.source
    cfg = WorkloadConfig(seed=232, changes=120, replay_runs=0, malformed_fraction=0.0, other_ops=False,
                         schema_fraction=0.5)
    env = {"LAKEHOUSE_ROOT": lake.root, "KAFKA_BOOTSTRAP_SERVERS": lake.bootstrap}
    _, before_lsns = fold_with_lsn(lake.sent)
    src.alter("orders", add={"total": "string"}, drop=["amount"])  # amount renamed to total
    changes = src.changes(cfg)
    lake.produce(changes)
    run_ingest(Lake.at(lake.root, spark), once=True, bootstrap=lake.bootstrap)

    held = [d for d in dead_letters(lake.root) if d["reason"].startswith("schema: orders.amount")]
    assert len(held) == _orders_rows(changes) > 0
    assert all(d["kafka_topic"] == topic("orders") for d in held)
    now, lsns = fold_with_lsn(lake.sent)
    # customers went on; orders still as before the change
    got = bronze_hudi_rs(lake.root, "customers")
    assert {k: {c: r[c] for c in COLUMNS["customers"]} for k, r in got.items()} == now["customers"]
    # orders as before the change, but for bare deletes of the new shape (they apply: no shape to hold)
    bare_deleted = {e[1] for m in changes if m.topic == topic("orders") and unwrap(m)[0] is None
                    and (e := row_event(unwrap(m)[1])) and e[0] == "d"}
    assert {k: r["_lsn"] for k, r in bronze_hudi_rs(lake.root, "orders").items()} == {
        k: lsn for k, lsn in before_lsns["orders"].items() if k not in bare_deleted}
    status = run_cli("status", env=env)
    assert status.exit_code == 0, status.output
    assert "held: orders" in status.output and "orders.amount" in status.output, status.output

    accepted = run_cli("schema", "accept", "orders", "amount", env=env)
    assert accepted.exit_code == 0, accepted.output
    replayed = run_cli("dead-letters", "replay", "--reason", "schema", env=env)
    assert replayed.exit_code == 0, replayed.output
    run_ingest(Lake.at(lake.root, spark), once=True, bootstrap=lake.bootstrap)
    run_etl(Lake.at(lake.root, spark))

    shaped: dict[str, dict[int, dict[str, Any]]] = {
        t: {k: {c: r.get(c) for c in COLUMNS[t]} for k, r in rows.items()} for t, rows in now.items()}
    assert_bronze_equals_model(spark, lake.root, shaped, lsns)
    assert "held: orders" not in run_cli("status", env=env).output
    assert_lake_equals_model(spark, lake.root, shaped)


@pytest.mark.unit
def test_shape_decisions() -> None:
    """The rules of pipelines.ingest.schema without Spark: add, widen, narrow, contract column gone, accept."""
    from pipelines.ingest.connect_types import bronze_column
    from pipelines.ingest.schema import decide, infer_type

    def fields(connect: list[tuple[str, str]]) -> list[tuple[str, str, str]]:
        """Fields of a wrapped message's `after` schema as the survey hands them to `decide` (the shop: wire form)."""
        return [(name, *bronze_column({"type": kind}, typed=False)) for name, kind in connect]

    contract_shape = [(c, "int64" if c in ("id", "customer_id") else "string") for c in COLUMNS["orders"]]
    orders = read_declaration().table("orders")
    start = Shape.initial(orders)
    added = decide(start, [fields([*contract_shape, ("points", "int32")])], [], {"note": "string"}, set(), 7)
    assert added.changed and not added.held_declared
    assert [(c.name, c.type, c.declared, c.batch) for c in added.shape.columns.values()][-2:] == [
        ("points", "int", True, 7), ("note", "string", False, 7)]
    widened = decide(added.shape, [fields([*contract_shape, ("points", "int64")])], [], {}, set(), 8)
    assert widened.shape.columns["points"].type == "bigint" and widened.shape.columns["points"].widened[0][:2] == (
        "int", 8)
    narrowed = decide(widened.shape, [fields([*contract_shape, ("points", "int32")])], [], {}, set(), 9)
    assert not narrowed.changed and "points" in next(iter(narrowed.held_declared.values()))
    renamed = [(c, t) for c, t in contract_shape if c != "amount"] + [("total", "string")]
    held = decide(start, [fields(renamed)], [["amount"]], {}, set(), 10)
    assert len(held.held_declared) == 1 and held.held_missing == {("amount",): next(iter(held.held_missing.values()))}
    assert all(r.startswith("schema: orders.amount") for r in [*held.held_declared.values(),
                                                               *held.held_missing.values()])
    accepted = decide(start, [fields(renamed)], [["amount"]], {}, {"orders.amount"}, 11)
    assert not accepted.held_declared and not accepted.held_missing and "total" in accepted.shape.columns
    assert Shape.from_meta(orders, accepted.shape.to_meta()) == accepted.shape
    assert (infer_type([None, 3]), infer_type([1.5, 2]), infer_type([True]), infer_type(["a", 1]),
            infer_type([None])) == ("bigint", "double", "boolean", "string", None)
