"""`lakehouse source check`'s findings from the facts PostgreSQL and Kafka Connect give, without either: each
reason a declared table's changes would not reach its topic, with its fix and severity; the sync's refusal;
Debezium's include lists; the REST client's credentials and the PostgreSQL client's messages.

The same checks on a real PostgreSQL and Connect: tests/test_source_sync.py.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest
from click.testing import CliRunner

from pipelines.cli import main
from pipelines.errors import ConnectError, DeclarationMismatch, SourceSyncError, SourceUnavailable
from pipelines.lake.declaration import Declaration, parse
from pipelines.runtime.config import ConnectSettings, Secret, SourceSettings
from pipelines.source import check as source_check
from pipelines.source import postgres
from pipelines.source.catalog import (
    DEBEZIUM_POSTGRES,
    ConnectorFacts,
    Publication,
    Slot,
    SourceFacts,
    SourceTable,
    captured_by,
    include_list,
)
from pipelines.source.check import Finding, Target, errors, findings
from pipelines.source.connect_rest import ConnectClient
from pipelines.source.sync import refuse

pytestmark = pytest.mark.unit

SETTINGS = SourceSettings()
TARGET = Target(SETTINGS, ConnectSettings())
SIGNAL = SETTINGS.signal_table


def declaration(**tables: dict[str, Any]) -> Declaration:
    return parse({"source": {"topic_prefix": "shop"}, "tables": tables}, "decl.toml")


DECL = declaration(payments={"source": "public.payments", "key": ["id"], "subject": "customer_id"},
                   ledger={"source": "Sales.OrderLines", "key": ["region", "entry_no"]})
PAYMENTS = SourceTable(("id", "customer_id", "amount"), ("id",), "d")
LEDGER = SourceTable(("region", "entry_no", "amount"), ("region", "entry_no"), "d")


def healthy_facts(**changes: Any) -> SourceFacts:
    published = frozenset({"public.payments", "Sales.OrderLines", SIGNAL})
    facts = SourceFacts("logical", 4096, Publication(published, published), Slot(True, "reserved", 1024),
                        {"public.payments": PAYMENTS, "Sales.OrderLines": LEDGER})
    for key, value in changes.items():
        setattr(facts, key, value)
    return facts


def healthy_connector(**config: str | None) -> ConnectorFacts:
    base = {"name": "shop-source", "connector.class": DEBEZIUM_POSTGRES, "database.dbname": "shop",
            "publication.name": SETTINGS.publication, "slot.name": SETTINGS.slot, "signal.data.collection": SIGNAL,
            "table.include.list": include_list(["public.payments", "Sales.OrderLines"])}
    merged = {k: v for k, v in (base | config).items() if v is not None}
    status = {"connector": {"state": "RUNNING"}, "tasks": [{"id": 0, "state": "RUNNING"}]}
    return ConnectorFacts("http://connect:8083", "shop-source", merged, status)


def judged(facts: SourceFacts | None = None, connector: ConnectorFacts | None = None) -> list[Finding]:
    return findings(facts or healthy_facts(), connector or healthy_connector(), DECL, TARGET)


def by_check(found: list[Finding], check: str) -> list[Finding]:
    return [f for f in found if f.check == check]


def test_a_healthy_source_has_no_finding() -> None:
    assert judged() == []


def test_the_server_settings() -> None:
    found = judged(healthy_facts(wal_level="replica", max_slot_wal_keep_mb=-1))
    wal = by_check(found, "wal_level")[0]
    assert wal.severity == "error" and "wal_level is replica" in wal.problem and "rds.logical_replication" in wal.fix
    keep = by_check(found, "max_slot_wal_keep_size")[0]
    assert keep.severity == "warning" and "fill the server's disk" in keep.problem
    small = by_check(judged(healthy_facts(max_slot_wal_keep_mb=64)), "max_slot_wal_keep_size")[0]
    assert small.severity == "warning" and "64 MB" in small.problem and "invalidated" in small.problem


def test_the_publication_must_publish_each_declared_table_and_the_signal_table() -> None:
    assert [(f.check, f.fixable) for f in judged(healthy_facts(publication=None))] == [("publication", True)]
    pub = Publication(frozenset({"public.payments"}), frozenset({"public.payments"}))
    found = judged(healthy_facts(publication=pub))
    assert [(f.table, f.check) for f in found] == [(None, "publication"), ("ledger", "publication")]
    assert "Sales.OrderLines is not in publication shop_publication" in found[1].problem
    assert found[1].fixable and "lakehouse source sync" in found[1].fix
    everything = Publication(frozenset({"public.payments", "Sales.OrderLines", SIGNAL}), frozenset(), all_tables=True)
    assert judged(healthy_facts(publication=everything)) == []


def test_a_partitioned_table_needs_publish_via_partition_root() -> None:
    parted = SourceTable(PAYMENTS.columns, ("id",), "d", partitioned=True,
                         leaves={"public.payments_2026": "d", "public.payments_2027": "n"})
    published = frozenset({"public.payments_2026", "public.payments_2027", "Sales.OrderLines", SIGNAL})
    facts = healthy_facts(publication=Publication(published, frozenset({"public.payments"})),
                          tables={"public.payments": parted, "Sales.OrderLines": LEDGER})
    found = judged(facts)
    root = by_check(found, "publish_via_partition_root")[0]
    assert root.table == "payments" and root.severity == "error" and not root.fixable
    assert "SET (publish_via_partition_root = true)" in root.fix
    leaf = by_check(found, "replica_identity")[0]
    assert "public.payments_2027 has REPLICA IDENTITY NOTHING" in leaf.problem
    via_root = Publication(frozenset({"public.payments", "Sales.OrderLines", SIGNAL}), frozenset(), via_root=True)
    partition = SourceTable(LEDGER.columns, LEDGER.primary_key, "d", partition_of="Sales.lines")
    found = judged(healthy_facts(publication=via_root, tables={"public.payments": PAYMENTS,
                                                               "Sales.OrderLines": partition}))
    assert [(f.check, f.fix) for f in found] == [("partition", "declare Sales.lines instead")]


def test_the_slot_missing_inactive_or_invalidated() -> None:
    assert "does not exist" in by_check(judged(healthy_facts(slot=None)), "slot")[0].problem
    lost = by_check(judged(healthy_facts(slot=Slot(False, "lost", None))), "slot")
    assert len(lost) == 1 and "invalidated (wal_status lost)" in lost[0].problem
    assert "pg_drop_replication_slot('shop_debezium')" in lost[0].fix
    idle = by_check(judged(healthy_facts(slot=Slot(False, "extended", 5_000_000, 600.0))), "slot")[0]
    assert "no consumer for 600 s or more, holding 5,000,000 bytes of WAL" in idle.problem
    unreserved = by_check(judged(healthy_facts(slot=Slot(True, "unreserved", 1))), "slot")[0]
    assert unreserved.severity == "warning"


def test_each_declared_table_against_the_catalog() -> None:
    facts = healthy_facts(tables={"public.payments": SourceTable(("id", "amount"), ("amount", "id"), "n"),
                                  "Sales.OrderLines": None})
    found = judged(facts)
    key = by_check(found, "primary_key")[0]
    assert key.problem == ("decl.toml: tables.payments.key: ['id'] is not the primary key of public.payments (its "
                           "primary key: (amount, id); same columns in the same order)") and key.declaration
    assert "tables.payments.subject: column 'customer_id' does not exist" in by_check(found, "columns")[0].problem
    nothing = by_check(found, "replica_identity")[0]
    assert nothing.severity == "error" and nothing.fixable and "REPLICA IDENTITY NOTHING" in nothing.problem
    assert nothing.line().endswith('fix: `lakehouse source sync` sets it, or ALTER TABLE "public"."payments" '
                                   'REPLICA IDENTITY DEFAULT')
    missing = by_check(found, "exists")[0]
    assert missing.table == "ledger" and "table Sales.OrderLines does not exist" in missing.problem
    full = SourceTable(PAYMENTS.columns, ("id",), "f")
    warned = judged(healthy_facts(tables={"public.payments": full, "Sales.OrderLines": LEDGER}))
    assert [(f.check, f.severity) for f in warned] == [("replica_identity", "warning")]


def test_the_connector_against_the_declaration_and_the_section() -> None:
    found = judged(connector=healthy_connector(**{"table.include.list": r"public\.payments", "slot.name": None}))
    assert [(f.table, f.check) for f in found] == [(None, "connector"), ("ledger", "table.include.list")]
    assert found[0].problem == "connector shop-source's slot.name is 'debezium', [source] slot is 'shop_debezium'"
    wrong = judged(connector=healthy_connector(**{"connector.class": "io.confluent.JdbcSourceConnector"}))
    assert len(wrong) == 1 and "not io.debezium.connector.postgresql.PostgresConnector" in wrong[0].problem
    failed = healthy_connector()
    failed.status = {"connector": {"state": "RUNNING"},
                     "tasks": [{"id": 0, "state": "FAILED", "trace": "org.postgresql.util.PSQLException: gone\n..."}]}
    state = judged(connector=failed)[0]
    assert state.problem == "connector shop-source is RUNNING, task 0 FAILED (org.postgresql.util.PSQLException: gone)"
    assert "lakehouse connector ensure" in state.fix
    absent = judged(connector=ConnectorFacts("http://connect:8083", "shop-source"))[0]
    assert "does not exist in Kafka Connect at http://connect:8083" in absent.problem
    unreachable = judged(connector=ConnectorFacts("u", "shop-source", error="Kafka Connect refused GET u (HTTP 401)"))
    assert unreachable[0].check == "connect" and "username/password" in unreachable[0].fix


def test_a_shared_publication_and_debezium_s_filtered_mode() -> None:
    published = frozenset({"public.payments", "Sales.OrderLines", SIGNAL, "public.audit"})
    facts = healthy_facts(publication=Publication(published, published))
    assert judged(facts) == []  # all_tables, Debezium's default, leaves an existing publication alone
    shared = judged(facts, healthy_connector(**{"publication.autocreate.mode": "filtered"}))
    assert [(f.check, f.severity) for f in shared] == [("publication", "warning")]
    assert "also publishes public.audit" in shared[0].problem and "autocreate.mode=disabled" in shared[0].fix


def test_include_lists_are_debezium_s_anchored_case_insensitive_regular_expressions() -> None:
    listed = include_list(["public.orders", "Sales.OrderLines", "odd.t$1"])
    assert listed == r"public\.orders,Sales\.OrderLines,odd\.t\$1"
    assert captured_by(listed, "sales.orderlines") and captured_by(listed, "odd.t$1")
    assert not captured_by(listed, "public.orders_archive") and not captured_by(listed, "xpublic.orders")
    assert captured_by(r"public\..*", "public.anything") and captured_by(None, "any.table")


def test_sync_refuses_naming_each_finding_it_cannot_repair() -> None:
    found = judged(healthy_facts(tables={"public.payments": None, "Sales.OrderLines": LEDGER}, publication=None))
    with pytest.raises(DeclarationMismatch) as refused:
        refuse(found)
    assert "nothing was changed" in str(refused.value)
    assert "decl.toml: tables.payments.source: table public.payments does not exist" in str(refused.value)
    assert "publication shop_publication does not exist" not in str(refused.value)  # the sync creates it
    with pytest.raises(SourceSyncError, match="wal_level is minimal"):
        refuse(judged(healthy_facts(wal_level="minimal")))
    refuse(judged(healthy_facts(publication=None, max_slot_wal_keep_mb=-1)))  # fixable, or a warning: no refusal
    assert errors(judged(healthy_facts(max_slot_wal_keep_mb=-1))) == []


def test_a_table_that_left_the_publication_and_came_back_is_a_gap_until_reconciled(tmp_path: Any) -> None:
    from pipelines.source.check import gap_findings
    from pipelines.source.membership import remember, remembered

    root = str(tmp_path / "lake")
    published = frozenset({"public.payments", "Sales.OrderLines"})
    then = Publication(published, published, memberships={"public.payments": "7:11", "Sales.OrderLines": "7:12"})
    assert remembered(root) == {}
    remember(root, {"payments": "7:11", "ledger": "7:12"})
    # Re-added: a new pg_publication_rel row. Out of the publication just now: no membership, no gap (the
    # "not in publication" finding says it). A table the lake never knew whole: nothing to compare.
    now = Publication(published, published, memberships={"public.payments": "7:31"})
    [gap] = gap_findings(now, DECL, SETTINGS, remembered(root))
    assert (gap.table, gap.check, gap.severity) == ("payments", "publication_gap", "error")
    assert "7:11, now 7:31" in gap.problem and "reconcile --table payments --heal" in gap.fix
    assert gap_findings(then, DECL, SETTINGS, remembered(root)) == []
    assert gap_findings(None, DECL, SETTINGS, remembered(root)) == []
    remember(root, {"payments": "7:31"})  # reconcile found it exact
    assert remembered(root) == {"payments": "7:31", "ledger": "7:12"}
    assert gap_findings(now, DECL, SETTINGS, remembered(root)) == []


def test_check_prints_one_line_per_finding_or_json_and_exits_1_on_an_error(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Any) -> None:
    found = [Finding("payments", "replica_identity", "public.payments has REPLICA IDENTITY NOTHING", "sync it"),
             Finding(None, "max_slot_wal_keep_size", "no limit", "set it", "warning")]
    monkeypatch.setattr(source_check, "run_check", lambda target, decl, tables, root: found)
    env = {"LAKEHOUSE_ROOT": str(tmp_path / "lake")}
    text = CliRunner().invoke(main, ["source", "check"], env=env)
    assert text.exit_code == 1 and text.stdout.splitlines() == [
        "error: public.payments has REPLICA IDENTITY NOTHING; fix: sync it", "warning: no limit; fix: set it"]
    as_json = CliRunner().invoke(main, ["source", "check", "--json"], env=env)
    assert json.loads(as_json.stdout)[0] == {"table": "payments", "check": "replica_identity", "severity": "error",
                                             "problem": "public.payments has REPLICA IDENTITY NOTHING",
                                             "fix": "sync it", "fixable": False}
    monkeypatch.setattr(source_check, "run_check", lambda target, decl, tables, root: found[1:])
    assert CliRunner().invoke(main, ["source", "check"], env=env).exit_code == 0
    unknown = CliRunner().invoke(main, ["source", "check", "--table", "nope"], env=env)
    assert unknown.exit_code == 2 and "'nope' is not declared" in unknown.output


# --------------------------------------------------------------------------- the clients

class _Connect(BaseHTTPRequestHandler):
    """Connect's REST API: 401 without the right basic credentials, else the connector's config."""

    def do_GET(self) -> None:
        header = self.headers.get("Authorization")
        good = "Basic " + base64.b64encode(b"lake:s3cret").decode()
        body = json.dumps({"name": "shop-source"} if header == good else {"error_code": 401}).encode()
        self.send_response(200 if header == good else 401)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture()
def connect_url() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _Connect)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()


def test_the_rest_client_sends_basic_credentials_and_names_a_refusal(connect_url: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONNECT_PASSWORD", "s3cret")
    client = ConnectClient.from_settings(ConnectSettings(url=connect_url, username="lake",
                                                         password=Secret(env="CONNECT_PASSWORD")))
    assert client.config("shop-source") == {"name": "shop-source"}
    assert "s3cret" not in repr(client)
    monkeypatch.setenv("CONNECT_PASSWORD", "wrong")
    with pytest.raises(ConnectError) as refused:
        client.config("shop-source")
    message = str(refused.value)
    assert f"refused GET {connect_url}/connectors/shop-source/config as 'lake' (HTTP 401)" in message
    assert "check [connect] username/password" in message and "wrong" not in message and "Basic" not in message
    with pytest.raises(ConnectError, match="without credentials"):
        ConnectClient(connect_url).status("shop-source")


def test_the_postgres_client_reveals_the_password_only_into_the_connect_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PG_PASSWORD", "hunter2")
    settings = SourceSettings(port=1, user="lake", password=Secret(env="PG_PASSWORD"), sslmode="disable")
    options = postgres.connect_options(settings, timeout=3)
    assert options["password"] == "hunter2" and "hunter2" not in repr(settings)
    assert not any("hunter2" in str(v) for k, v in options.items() if k != "password")
    with pytest.raises(SourceUnavailable) as failed:
        postgres.connect(settings, timeout=2)
    message = str(failed.value)
    assert message.startswith("PostgreSQL lake@127.0.0.1:1/shop (sslmode disable): connection refused")
    assert "hunter2" not in message
    assert postgres.reason('FATAL:  password authentication failed for user "lake"').startswith("wrong password")
    assert "sslrootcert" in postgres.reason("SSL error: certificate verify failed")
    assert postgres.reason('FATAL:  database "nope" does not exist').startswith("no such database")


# --------------------------------------------------------------------------- the sync's statements

class _Recorder:
    """A connection that records each statement as PostgreSQL would receive it."""

    def __init__(self) -> None:
        self.statements: list[str] = []

    def execute(self, query: Any, params: Any = None) -> None:
        self.statements.append(query if isinstance(query, str) else query.as_string(None))


def test_the_sync_adds_and_drops_only_the_tables_it_manages(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipelines.source import sync as source_sync

    shared = Publication(frozenset({"public.payments", "public.audit", "public.old", SIGNAL}),
                         frozenset({"public.payments", "public.audit", "public.old", SIGNAL}))
    monkeypatch.setattr(source_sync, "read_publication", lambda conn, name: shared)
    conn = _Recorder()
    changed = source_sync.update_publication(conn, SETTINGS, healthy_facts(), ["public.payments", "Sales.OrderLines"],
                                             ["public.old"])
    assert changed and conn.statements == ['ALTER PUBLICATION "shop_publication" ADD TABLE "Sales"."OrderLines"',
                                           'ALTER PUBLICATION "shop_publication" DROP TABLE "public"."old"']
    # The tables the connector captured before: those its include list matches; none listed, none dropped.
    connector = healthy_connector(**{"table.include.list": r"public\.payments,public\.old"})
    facts = healthy_facts(publication=shared)
    before = source_sync.captured_before(connector, facts, source_sync.SyncOptions(), ["public.payments"])
    assert before == {"public.payments", "public.old"}
    open_list = healthy_connector(**{"table.include.list": None})
    assert source_sync.captured_before(open_list, facts, source_sync.SyncOptions(), ["public.payments"]) is None
    monkeypatch.setattr(source_sync, "read_publication", lambda conn, name: None)
    parted = SourceTable(PAYMENTS.columns, ("id",), "d", partitioned=True)
    created = _Recorder()
    source_sync.update_publication(created, SETTINGS, healthy_facts(tables={"public.payments": parted}),
                                   ["public.payments"], [])
    assert created.statements == ['CREATE PUBLICATION "shop_publication" FOR TABLE "public"."payments", '
                                  '"public"."debezium_signal" WITH (publish_via_partition_root = true)']


def test_a_refused_statement_names_its_step_and_the_privileges() -> None:
    import psycopg

    with pytest.raises(SourceSyncError) as refused, postgres.answering(SETTINGS, "a change of publication p"):
        raise psycopg.errors.InsufficientPrivilege("must be owner of publication p")
    assert str(refused.value) == ("PostgreSQL postgres@127.0.0.1:5433/shop refused a change of publication p: must "
                                  "be owner of publication p; the [source] user postgres lacks a privilege "
                                  '(docs/tables.md, "The privileges it needs")')
