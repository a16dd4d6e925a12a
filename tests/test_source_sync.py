"""`lakehouse dev source sync` on the real source (PostgreSQL 15 + Debezium 2.7.3 in Kafka Connect + Kafka): the
publication and the connector follow the declaration (contract section 7).

One source for the whole run (its start is most of the cost): started on the shop, with a
`payments` table that already holds rows but is not declared. Then, with `LAKEHOUSE_TABLES` naming
a TOML in tmp_path:
- declarations the source does not match (a missing table, a missing column, a key that is not
  the primary key or not in its order): sync exits non-zero naming the file, the table and the
  field, and the publication and the connector's config are unchanged;
- `payments` declared: its existing rows arrive (an incremental snapshot), its new changes too,
  the shop's topics go on and are not snapshotted again;
- `payments` no longer declared: its changes are not captured any more.

The product's `lakehouse source check` and `lakehouse source sync` on the same source, reached through the
configuration alone (`[source]` and `[connect]` from the environment): the check names a declared table missing
from the publication and a REPLICA IDENTITY NOTHING table, each with its fix; the sync fixes them, a table of
another schema with a mixed-case name included, and the check then finds no error.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from lakehouse_dev.connect_config import CONNECTOR, PUBLICATION, SIGNAL_DDL, SIGNAL_TABLE
from lakehouse_dev.kafka_local import KafkaBroker, free_port
from lakehouse_dev.pg_source import RealSource
from lakehouse_dev.pg_source_cli import source
from lakehouse_dev.source_target import dev_environment
from pipelines.cli import main
from pipelines.lake.declaration import DECLARATION_VARIABLE, SHOP
from pipelines.runtime.settings import PROJECT_ROOT
from pipelines.source.connect_rest import ConnectClient
from tests.declared_capture import payload, topic_records, wait_records

CUSTOMERS, PAYMENTS = "shop.public.customers", "shop.public.payments"
SETUP_SQL = """
INSERT INTO customers VALUES
  (1, 'a@example.com', 'A', 'DE', '2026-03-01T00:00:00Z', '2026-03-01T00:00:00Z'),
  (2, 'b@example.com', 'B', 'FR', '2026-03-01T00:00:00Z', '2026-03-01T00:00:00Z');
CREATE TABLE payments (id bigint PRIMARY KEY, customer_id bigint NOT NULL, method text, amount numeric(12,2));
INSERT INTO payments SELECT g, g % 2 + 1, 'card', g * 10.25 FROM generate_series(1, 5) g;
ALTER TABLE payments REPLICA IDENTITY FULL;
CREATE TABLE ledger (region text, entry_no bigint, PRIMARY KEY (region, entry_no));
CREATE TABLE notes (id bigint PRIMARY KEY, body text);
INSERT INTO notes VALUES (1, 'first');
ALTER TABLE notes REPLICA IDENTITY NOTHING;
CREATE SCHEMA "Sales";
CREATE TABLE "Sales"."OrderLines" (id bigint PRIMARY KEY, sku text);
"""
PAYMENTS_TOML = """
[tables.payments]
source = "public.payments"
key = ["id"]
subject = "customer_id"
pii = ["method"]
"""
# A table whose replica identity is NOTHING, and one of another schema whose names need quoting.
MORE_TOML = """
[tables.notes]
source = "public.notes"
key = ["id"]

[tables.order_lines]
source = "Sales.OrderLines"
key = ["id"]
"""
NOTES, ORDER_LINES = "shop.public.notes", "shop.Sales.OrderLines"


def shop_toml() -> str:
    return (PROJECT_ROOT / "pipelines" / "lake" / SHOP).read_text()


@pytest.fixture(scope="module")
def real() -> Iterator[RealSource]:
    work = Path(tempfile.mkdtemp(prefix="lakehouse-sync-"))  # PostgreSQL runs as `postgres`: not under pytest's tmp
    work.chmod(0o755)
    broker = KafkaBroker(work / "kafka").start()
    real = RealSource(work / "source", free_port(), free_port(), broker.bootstrap, schemas_enable=True)
    try:
        with real.postgres.start().connect() as conn:
            conn.execute(SETUP_SQL)
        real.up()
        yield real
    finally:
        try:
            real.down()
        finally:
            broker.stop()
            shutil.rmtree(work, ignore_errors=True)


def sync(real: RealSource, declaration: Path) -> Any:
    return CliRunner().invoke(source, ["sync", "--home", str(real.home)],
                              env={DECLARATION_VARIABLE: str(declaration)})


def product(real: RealSource, declaration: Path, *args: str) -> Any:
    """`lakehouse ARGS` with the dev source as the configuration's [source] and [connect]."""
    env = dev_environment(real.pg_port, real.connect.url) | {
        DECLARATION_VARIABLE: str(declaration), "LAKEHOUSE_ROOT": str(declaration.parent / "lake"),
        "LAKEHOUSE_RUN_DIR": str(declaration.parent / "run")}
    return CliRunner().invoke(main, list(args), env=env)


def state(real: RealSource) -> tuple[list[tuple[str, str]], dict[str, str], str]:
    """The publication's tables, the connector's config and payments' replica identity: what a refused
    sync must leave alone."""
    with real.postgres.connect() as conn:
        tables = conn.execute("SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s "
                              "ORDER BY 1, 2", (PUBLICATION,)).fetchall()
        identity = conn.execute("SELECT relreplident FROM pg_class WHERE relname = 'payments'").fetchone()[0]
    return tables, ConnectClient(real.connect.url).config(CONNECTOR), identity


def ops(records: list[dict[str, Any]], topic: str) -> list[tuple[str, Any, str]]:
    """(op, the row's id, source.snapshot) of a topic's events."""
    out = []
    for r in records:
        env = payload(r)
        if r["topic"] == topic and env:
            out.append((env["op"], (env["after"] or env["before"])["id"], env["source"]["snapshot"]))
    return out


@pytest.mark.integration
@pytest.mark.slow
def test_sync_follows_the_declaration(real: RealSource, tmp_path: Path) -> None:
    bootstrap = real.bootstrap
    shop = shop_toml()
    initial = wait_records(bootstrap, [CUSTOMERS], lambda rs: len(ops(rs, CUSTOMERS)) == 2)
    assert sorted((op, i) for op, i, _ in ops(initial, CUSTOMERS)) == [("r", 1), ("r", 2)]
    before = state(real)
    assert ("public", "payments") not in before[0] and ("public", "debezium_signal") in before[0]
    assert before[1]["table.include.list"] == r"public\.customers,public\.orders" and before[2] == "f"

    # Declarations the source does not match: refused, nothing changed.
    wrong = {
        "missing_table": (PAYMENTS_TOML.replace("public.payments", "public.refunds"),
                          r"tables\.payments\.source: table public\.refunds does not exist"),
        "missing_column": (PAYMENTS_TOML + '[[tables.payments.rules]]\ncolumn = "status"\none_of = ["ok"]\n',
                           r"tables\.payments\.rules\[0\]\.column: column 'status' does not exist in public\.payments"),
        "wrong_key": (PAYMENTS_TOML.replace('key = ["id"]', 'key = ["customer_id"]'),
                      r"tables\.payments\.key: \['customer_id'\] is not the primary key of public\.payments "
                      r"\(its primary key: \(id\)"),
        "key_order": ('[tables.ledger]\nsource = "public.ledger"\nkey = ["entry_no", "region"]\n',
                      r"tables\.ledger\.key: \['entry_no', 'region'\] is not the primary key of public\.ledger "
                      r"\(its primary key: \(region, entry_no\)"),
    }
    for name, (toml, message) in wrong.items():
        path = tmp_path / f"{name}.toml"
        path.write_text(shop + toml)
        result = sync(real, path)
        assert result.exit_code != 0, f"{name}: {result.output}"
        assert re.search(re.escape(str(path)) + ": " + message, result.output), f"{name}: {result.output}"
        assert "nothing was changed" in result.output
        assert state(real) == before, f"{name}: a refused sync changed the source"

    # The product's check: each reason a declared table's changes would not arrive, with its fix.
    everything = tmp_path / "everything.toml"
    everything.write_text(shop + PAYMENTS_TOML + MORE_TOML)
    checked = product(real, everything, "source", "check")
    assert checked.exit_code == 1, checked.output
    lines = checked.stdout.splitlines()
    assert ("error: public.payments is not in publication shop_publication: its changes are not decoded; fix: "
            "`lakehouse source sync` adds it (ALTER PUBLICATION shop_publication ADD TABLE ...)") in lines, lines
    assert ("error: public.notes has REPLICA IDENTITY NOTHING: PostgreSQL refuses its UPDATEs and DELETEs once it "
            "is published, and a delete would carry no key; fix: `lakehouse source sync` sets it, or ALTER TABLE "
            '"public"."notes" REPLICA IDENTITY DEFAULT') in lines, lines
    as_json = json.loads(product(real, everything, "source", "check", "--json", "--table", "notes").stdout)
    assert {(f["table"], f["check"], f["severity"]) for f in as_json} >= {
        ("notes", "replica_identity", "error"), ("notes", "publication", "error"),
        ("notes", "table.include.list", "error"), (None, "max_slot_wal_keep_size", "warning")}, as_json
    assert {f["table"] for f in as_json} == {"notes", None}
    assert state(real) == before, "a check changed the source"

    # A table that already holds rows, declared: its rows arrive, the stream goes on.
    with_payments = tmp_path / "with_payments.toml"
    with_payments.write_text(shop + PAYMENTS_TOML)
    result = sync(real, with_payments)
    assert result.exit_code == 0, result.output
    assert "captured from now on: public.payments" in result.output
    assert "incremental snapshot requested for public.payments" in result.output
    assert "public.payments: replica identity set to DEFAULT" in result.output
    tables, config, identity = state(real)
    assert identity == "d"
    assert ("public", "payments") in tables and (SIGNAL_TABLE.split(".")[0], SIGNAL_TABLE.split(".")[1]) in tables
    assert config["table.include.list"] == r"public\.customers,public\.orders,public\.payments"
    assert json.loads((real.home / "connect" / "connector.json").read_text()) == config  # a restart keeps it
    with real.postgres.connect() as conn:
        conn.execute("INSERT INTO payments VALUES (6, 1, 'sepa', 1.00)")
        conn.execute("UPDATE payments SET method = 'paypal' WHERE id = 1")
        conn.execute("UPDATE customers SET full_name = 'A2' WHERE id = 1")
    got = wait_records(bootstrap, [PAYMENTS, CUSTOMERS], lambda rs: {
        ("r", i, "incremental") for i in range(1, 6)} | {("c", 6, "false"), ("u", 1, "false")} <= set(
        ops(rs, PAYMENTS)) and ("u", 1, "false") in ops(rs, CUSTOMERS))
    # The shop's topics: the initial snapshot once, then only changes (none re-snapshotted).
    assert sorted(ops(got, CUSTOMERS)) == sorted([*ops(initial, CUSTOMERS), ("u", 1, "false")])
    assert all(op != "r" for op, *_ in ops(topic_records(bootstrap, ["shop.public.orders"]), "shop.public.orders"))
    # The snapshot reads each row as it is when its chunk is read: a row inserted after the sync may
    # be read too, besides its own insert event.
    assert {1, 2, 3, 4, 5} <= {i for op, i, _ in ops(got, PAYMENTS) if op == "r"} <= {1, 2, 3, 4, 5, 6}
    # A read has no LSN; its `source.sequence` (where the stream was when its chunk was emitted) is
    # past every change of its row delivered before it on the partition: it orders as an LSN would.
    seen: dict[int, int] = {}
    for r in got:
        env = payload(r)
        if r["topic"] != PAYMENTS or not env:
            continue
        if env["op"] == "r":
            assert env["source"]["lsn"] is None
            assert int(json.loads(env["source"]["sequence"])[-1]) > seen.get(env["after"]["id"], 0)
        else:
            seen[env["after"]["id"]] = env["source"]["lsn"]

    # Declared again unchanged: nothing to do, no restart.
    again = sync(real, with_payments)
    assert again.exit_code == 0 and "nothing to change" in again.output, again.output

    # No longer declared: its changes are not captured.
    shop_only = tmp_path / "shop.toml"
    shop_only.write_text(shop)
    result = sync(real, shop_only)
    assert result.exit_code == 0, result.output
    assert "no longer captured: public.payments" in result.output
    tables, config, _ = state(real)
    assert ("public", "payments") not in tables and config["table.include.list"] == before[1]["table.include.list"]
    with real.postgres.connect() as conn:
        conn.execute("INSERT INTO payments VALUES (7, 2, 'card', 2.00)")
        conn.execute("UPDATE payments SET method = 'cash' WHERE id = 2")
        conn.execute("UPDATE customers SET full_name = 'B2' WHERE id = 2")  # after them in the WAL
    wait_records(bootstrap, [CUSTOMERS], lambda rs: ("u", 2, "false") in ops(rs, CUSTOMERS))
    time.sleep(2)
    late = ops(topic_records(bootstrap, [PAYMENTS]), PAYMENTS)
    assert ("c", 7, "false") not in late and ("u", 2, "false") not in late, late

    # The product's sync fixes what the check found, then the check finds no error.
    synced = product(real, everything, "source", "sync")
    assert synced.exit_code == 0, synced.output
    assert "captured from now on: public.payments, public.notes, Sales.OrderLines" in synced.output
    assert "public.notes: replica identity set to DEFAULT (was 'n'" in synced.output
    tables, config, _ = state(real)
    assert {("public", "payments"), ("public", "notes"), ("Sales", "OrderLines")} <= set(tables)
    assert config["table.include.list"] == r"public\.customers,public\.orders,public\.payments,public\.notes," \
        r"Sales\.OrderLines"
    clean = product(real, everything, "source", "check", "--json")
    assert clean.exit_code == 0 and all(f["severity"] == "warning" for f in json.loads(clean.stdout)), clean.output
    with real.postgres.connect() as conn:
        conn.execute("UPDATE notes SET body = 'second' WHERE id = 1")
        conn.execute('''INSERT INTO "Sales"."OrderLines" VALUES (1, 'sku-1')''')
    wait_records(bootstrap, [NOTES, ORDER_LINES], lambda rs: ("u", 1, "false") in ops(rs, NOTES)
                 and ("c", 1, "false") in ops(rs, ORDER_LINES))


@pytest.mark.unit
def test_compose_creates_the_signal_table_as_source_up_does() -> None:
    services = yaml.safe_load((PROJECT_ROOT / "docker" / "compose.yaml").read_text())["services"]
    assert services["signal-table"]["command"][-1] == SIGNAL_DDL
    assert "signal-table" in services["connector-init"]["depends_on"]
    registered = json.loads((PROJECT_ROOT / "docker" / "connector.json").read_text())
    assert registered["name"] == CONNECTOR and registered["config"]["signal.data.collection"] == SIGNAL_TABLE
