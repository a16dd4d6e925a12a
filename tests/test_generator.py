"""The simulated source must be right, because every pipeline test trusts `ShopSource.state`.

The fold below reads only the Kafka records, the way the contract tells a consumer to (newest LSN per
key wins, anything that is not an envelope is skipped), and must land exactly on ``state``; if the
generator and this independent reading disagree, one of them misunderstands the contract.
"""

from __future__ import annotations

import base64
import json
import re
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from kafka.errors import KafkaTimeoutError

from lakehouse_dev import generator
from lakehouse_dev.generator import Message, ShopSource, WorkloadConfig
from lakehouse_dev.generator import cli as generator_cli
from lakehouse_dev.generator import kafka as generator_kafka
from pipelines.lake.contract import (
    BIGINT_COLUMNS,
    COLUMNS,
    COUNTRY_PATTERN,
    CURRENCIES,
    EMAIL_PATTERN,
    ORDER_STATUSES,
    OTHER_OPS,
    ROW_OPS,
    table_of_topic,
    topic,
)
from tests.model import fold, is_malformed, row_event, unwrap

pytestmark = pytest.mark.unit

SEEDS = (1, 7, 42, 2026)
ENVELOPE_KEYS = {"before", "after", "source", "op", "ts_ms", "transaction"}
SOURCE_KEYS = {
    "version", "connector", "name", "ts_ms", "snapshot", "db",
    "sequence", "schema", "table", "txId", "lsn", "xmin",
}
TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")
AMOUNT = re.compile(r"^-?\d+\.\d{2}$")

Rows = dict[str, dict[int, dict[str, Any]]]


def run(seed: int, cfg: WorkloadConfig | None = None) -> tuple[ShopSource, list[Message], list[Message]]:
    cfg = cfg or WorkloadConfig(seed=seed)
    source = ShopSource(seed)
    snapshot = source.snapshot(cfg)
    return source, snapshot, source.changes(cfg)


@pytest.fixture(scope="module")
def runs() -> dict[int, tuple[ShopSource, list[Message], list[Message]]]:
    return {seed: run(seed) for seed in SEEDS}


@pytest.mark.parametrize("seed", SEEDS)
def test_fold_of_the_stream_equals_state(runs, seed: int) -> None:
    source, snapshot, changes = runs[seed]
    assert fold(snapshot + changes) == source.state
    assert all(source.state.values())


def test_fold_equals_state_under_heavy_churn() -> None:
    cfg = WorkloadConfig(customers=5, orders=5, changes=1500, delete_fraction=0.3, reinsert_fraction=0.8,
                         malformed_fraction=0.1, replay_runs=6)
    source, snapshot, changes = run(3, cfg)
    more = source.changes(cfg)
    assert fold(snapshot + changes + more) == source.state


def test_same_seed_gives_the_same_bytes(runs) -> None:
    _, snapshot, changes = run(7)
    assert snapshot + changes == runs[7][1] + runs[7][2]
    assert snapshot + changes != runs[1][1] + runs[1][2]


@pytest.mark.parametrize("seed", SEEDS)
def test_replays_deliver_older_events_after_newer_ones(runs, seed: int) -> None:
    source, snapshot, changes = runs[seed]
    delivered: dict[tuple[str, int], list[tuple[str, int]]] = {}
    stale_delete_after_reinsert = stale_update_after_update = 0
    for message in snapshot + changes:
        event = row_event(unwrap(message)[1])
        if event is None:
            continue
        op, key, lsn, _ = event
        earlier = delivered.setdefault((message.topic, key), [])
        newer = [earlier_op for earlier_op, earlier_lsn in earlier if earlier_lsn > lsn]
        stale_delete_after_reinsert += op == "d" and "c" in newer
        stale_update_after_update += op == "u" and "u" in newer
        earlier.append((op, lsn))
    assert source.stats["replayed"] > 0
    assert stale_delete_after_reinsert > 0
    assert stale_update_after_update > 0


@pytest.mark.parametrize("seed", SEEDS)
def test_lsns_order_the_changes(runs, seed: int) -> None:
    source, snapshot, changes = runs[seed]
    snapshot_envelopes = [unwrap(message)[1] for message in snapshot]
    assert {envelope["op"] for envelope in snapshot_envelopes} == {"r"}
    snapshot_lsns = {envelope["source"]["lsn"] for envelope in snapshot_envelopes}
    assert len(snapshot_lsns) == 1
    assert snapshot_envelopes[0]["source"]["snapshot"] == "first"
    assert snapshot_envelopes[-1]["source"]["snapshot"] == "last"
    assert {envelope["source"]["snapshot"] for envelope in snapshot_envelopes[1:-1]} <= {
        "true", "first_in_data_collection", "last_in_data_collection",
    }
    (snapshot_lsn,) = snapshot_lsns

    first_seen: list[dict[str, Any]] = []
    known = {snapshot_lsn}  # replays may re-deliver snapshot records too
    for message in changes:
        envelope = unwrap(message)[1]
        if envelope is None or envelope["op"] not in ROW_OPS | OTHER_OPS or is_malformed(message):
            continue
        if envelope["source"]["lsn"] not in known:
            known.add(envelope["source"]["lsn"])
            first_seen.append(envelope)
    previous = snapshot_lsn
    for envelope in first_seen:
        src = envelope["source"]
        assert src["lsn"] > previous
        assert src["sequence"] == json.dumps([str(previous), str(src["lsn"])], separators=(",", ":"))
        assert src["snapshot"] == "false"
        assert envelope["ts_ms"] >= src["ts_ms"]
        previous = src["lsn"]
    assert previous == source.lsn


@pytest.mark.parametrize("seed", SEEDS)
def test_records_have_the_contract_shape(runs, seed: int) -> None:
    _, snapshot, changes = runs[seed]
    formats: Counter[str] = Counter()
    for message in snapshot + changes:
        assert message.key is None or json.loads(message.key)
        schema, envelope = unwrap(message)
        event = row_event(envelope)
        if event is None or is_malformed(message):
            continue
        table = table_of_topic(message.topic)
        formats["schema" if schema else "bare"] += 1
        if schema:
            assert schema["type"] == "struct"
            assert schema["name"] == f"{topic(table)}.Envelope"
            assert [field["field"] for field in schema["fields"]] == [
                "before", "after", "source", "op", "ts_ms", "transaction",
            ]
        assert set(envelope) == ENVELOPE_KEYS
        assert envelope["transaction"] is None
        src = envelope["source"]
        assert set(src) == SOURCE_KEYS
        assert (src["version"], src["connector"], src["name"], src["db"], src["schema"], src["table"]) == (
            "2.7.3.Final", "postgresql", "shop", "shop", "public", table,
        )
        assert src["xmin"] is None
        assert isinstance(src["txId"], int)
        op, key, _, image = event
        assert json.loads(message.key) == {"id": key}
        assert list(image) == list(COLUMNS[table])
        if op == "d":
            continue
        assert envelope["before"] is None
        for column, value in image.items():
            assert isinstance(value, int if column in BIGINT_COLUMNS[table] else str), (column, value)
        assert TIMESTAMP.match(image["created_at"])
        assert TIMESTAMP.match(image["updated_at"])
        if table == "orders":
            assert AMOUNT.match(image["amount"])
            assert len(image["currency"]) == 3
    assert formats["schema"] > 0.3 * sum(formats.values())
    assert formats["bare"] > 0.3 * sum(formats.values())


@pytest.mark.parametrize("seed", SEEDS)
def test_deletes_carry_the_key_only_and_are_followed_by_a_tombstone(runs, seed: int) -> None:
    _, snapshot, changes = runs[seed]
    messages = snapshot + changes
    deletes = 0
    for i, message in enumerate(messages):
        event = row_event(unwrap(message)[1])
        if event is None or event[0] != "d":
            continue
        deletes += 1
        _, key, _, before = event
        assert unwrap(message)[1]["after"] is None
        assert before == dict.fromkeys(COLUMNS[table_of_topic(message.topic)]) | {"id": key}
        assert messages[i + 1] == Message(message.topic, message.key, None)
    assert deletes > 0


@pytest.mark.parametrize("seed", SEEDS)
def test_created_at_stays_and_updated_at_moves(runs, seed: int) -> None:
    _, snapshot, changes = runs[seed]
    current: dict[tuple[str, int], dict[str, Any]] = {}
    newest: dict[tuple[str, int], int] = {}
    updates = 0
    for message in snapshot + changes:
        event = row_event(unwrap(message)[1])
        if event is None:
            continue
        op, key, lsn, image = event
        if lsn <= newest.get((message.topic, key), -1):
            continue  # a replay
        newest[(message.topic, key)] = lsn
        if op == "d":
            del current[(message.topic, key)]
            continue
        if op == "u":
            updates += 1
            old = current[(message.topic, key)]
            assert image["created_at"] == old["created_at"]
            assert image["updated_at"] > old["updated_at"]
        current[(message.topic, key)] = image
    assert updates > 0


def test_dirty_invalid_and_orphan_rows_occur(runs) -> None:
    source, snapshot, changes = runs[7]
    assert source.stats["invalid_values"] > 0
    assert source.stats["dirty_values"] > 0
    assert source.stats["orphan_orders"] > 0
    customer_ids = {
        event[1]
        for message in snapshot + changes
        if message.topic == topic("customers") and (event := row_event(unwrap(message)[1]))
    }
    orders = source.state["orders"].values()
    orphans = [order for order in orders if order["customer_id"] not in customer_ids]
    assert orphans
    assert all(order["customer_id"] >= generator.ORPHAN_CUSTOMER_BASE for order in orphans)
    customers = source.state["customers"].values()
    emails = [customer["email"] for customer in customers]
    countries = [customer["country"] for customer in customers]
    assert any(email != email.strip().lower() for email in emails)  # dirty but cleanable
    assert any(country != country.strip().upper() for country in countries)
    assert any(not re.match(EMAIL_PATTERN, email.strip().lower()) for email in emails)  # rejected
    assert any(not re.match(COUNTRY_PATTERN, country.strip().upper()) for country in countries)
    assert any(order["status"] not in ORDER_STATUSES for order in orders)
    assert any(order["currency"] not in CURRENCIES for order in orders)
    assert any(order["amount"].startswith("-") for order in orders)


def test_malformed_records_are_counted_and_varied() -> None:
    cfg = WorkloadConfig(malformed_fraction=0.1)
    source, snapshot, changes = run(8, cfg)
    malformed = [message for message in snapshot + changes if is_malformed(message)]
    assert len(malformed) == source.stats["malformed"] > 0
    kinds: Counter[str] = Counter()
    for message in malformed:
        if unwrap(message)[1] is not None:
            kinds["envelope"] += 1
        elif message.value.startswith((b"[", b'"', b'{"hello')):
            kinds["json, not an envelope"] += 1
        else:
            kinds["not json"] += 1
    assert len(kinds) == 3
    assert any(message.key is None for message in malformed)
    assert fold(snapshot + changes) == source.state


def test_logical_messages_change_nothing(runs) -> None:
    source, snapshot, changes = runs[42]
    logical = [env for message in changes if (env := unwrap(message)[1]) is not None and env["op"] == "m"]
    assert len({envelope["source"]["lsn"] for envelope in logical}) == source.stats["m"] > 0
    for envelope in logical:
        assert envelope["message"]["prefix"] == "audit"
        assert json.loads(base64.b64decode(envelope["message"]["content"]))
    assert fold(snapshot + changes) == source.state


def test_truncate_empties_the_table() -> None:
    cfg = WorkloadConfig(changes=500)
    source, snapshot, changes = run(4, cfg)
    truncate = source.truncate("orders", cfg)
    assert source.state["orders"] == {}
    assert [unwrap(message)[1]["op"] for message in truncate] == ["t"]
    assert truncate[0].key is None
    assert truncate[0].topic == topic("orders")
    assert fold(snapshot + changes + truncate) == source.state
    after = source.changes(cfg)
    assert fold(snapshot + changes + truncate + after) == source.state
    assert source.state["orders"]


def test_snapshot_needs_an_empty_source() -> None:
    source, _, _ = run(1, WorkloadConfig(changes=10))
    with pytest.raises(RuntimeError):
        source.snapshot(WorkloadConfig())


def test_saved_state_continues_like_an_uninterrupted_run() -> None:
    cfg = WorkloadConfig(changes=800)
    whole, snapshot, first = run(21, cfg)
    second = whole.changes(cfg)

    interrupted, _, _ = run(21, cfg)
    saved = interrupted.to_json()
    restored = ShopSource.from_json(saved)
    assert restored.to_json() == saved
    assert restored.changes(cfg) == second
    assert restored.state == whole.state
    assert restored.lsn == whole.lsn
    assert restored.stats == whole.stats
    assert fold(snapshot + first + second) == restored.state


class FakeFuture:
    def __init__(self, error: Exception | None) -> None:
        self.error = error

    def add_errback(self, callback: Callable[[Exception], None]) -> FakeFuture:
        if self.error:
            callback(self.error)
        return self


class FakeProducer:
    """Stands in for KafkaProducer; the test decides whether sends fail."""

    def __init__(self, fail_with: Exception | None, **config: Any) -> None:
        self.fail_with = fail_with
        self.config = config
        self.sent: list[tuple[str, bytes | None, bytes | None]] = []
        self.flushed = False
        self.closed = False

    def send(self, topic: str, key: bytes | None, value: bytes | None) -> FakeFuture:
        self.sent.append((topic, key, value))
        return FakeFuture(self.fail_with)

    def flush(self) -> None:
        self.flushed = True

    def close(self, timeout: float | None = None) -> None:
        self.closed = True


class FakeProducers(list):
    """Every producer `produce` created; a test sets `fail_with` to make their sends fail, and `compacted` to the
    topics the fake brokers compact."""

    fail_with: Exception | None = None
    compacted: frozenset[str] = frozenset()


@pytest.fixture
def producers(monkeypatch) -> FakeProducers:
    created = FakeProducers()

    def factory(**config: Any) -> FakeProducer:
        created.append(FakeProducer(created.fail_with, **config))
        return created[-1]

    monkeypatch.setattr(generator_kafka, "KafkaProducer", factory)
    monkeypatch.setattr(generator_kafka, "_compacted", lambda topics, bootstrap: topics & created.compacted)
    return created


def test_produce_sends_in_order_and_reports_progress(producers) -> None:
    _, snapshot, changes = run(2, WorkloadConfig(changes=1500))
    messages = snapshot + changes
    calls: list[tuple[int, int]] = []
    sent = generator.produce(iter(messages), "broker:9092", progress=lambda *args: calls.append(args))
    assert sent == len(messages)
    (producer,) = producers
    assert producer.sent == [(m.topic, m.key, m.value) for m in messages]
    assert producer.flushed
    assert producer.closed
    assert producer.config["acks"] == "all"
    assert producer.config["bootstrap_servers"] == "broker:9092"
    assert calls[0] == (1000, len(messages))
    assert calls[-1] == (len(messages), len(messages))


def test_a_keyless_record_gets_an_empty_key_on_a_compacted_topic_only(producers) -> None:
    # The source topics after an erasure compact, and a broker refuses a record without a key there.
    producers.compacted = frozenset({topic("orders")})
    messages = [Message(topic("orders"), None, b"[1]"), Message(topic("customers"), None, b"[2]"),
                Message(topic("orders"), b'{"id":1}', b"{}")]
    generator.produce(messages, "broker:9092")
    (producer,) = producers
    assert producer.sent == [(topic("orders"), b"", b"[1]"), (topic("customers"), None, b"[2]"),
                             (topic("orders"), b'{"id":1}', b"{}")]


def test_produce_honours_the_rate(producers) -> None:
    started = time.monotonic()
    generator.produce([Message(topic("orders"), b'{"id":1}', b"{}")] * 20, "b:1", rate=200)
    assert time.monotonic() - started >= 0.09


def test_produce_names_the_brokers_it_cannot_reach(monkeypatch, producers) -> None:
    producers.fail_with = KafkaTimeoutError("no ack")
    with pytest.raises(generator.KafkaUnavailableError, match="nowhere:9092"):
        generator.produce([Message(topic("orders"), b'{"id":1}', None)], "nowhere:9092")

    def unreachable(**config: Any) -> None:
        raise KafkaTimeoutError("Unable to bootstrap")

    monkeypatch.setattr(generator_kafka, "KafkaProducer", unreachable)
    with pytest.raises(generator.KafkaUnavailableError, match="nowhere:9092"):
        generator.produce([], "nowhere:9092")


def test_cli_snapshots_once_then_continues(monkeypatch, tmp_path: Path) -> None:
    produced: list[list[Message]] = []
    monkeypatch.setattr(generator_cli, "ensure_topics", lambda bootstrap, partitions: None)
    monkeypatch.setattr(
        generator_cli, "produce", lambda messages, bootstrap, **_: produced.append(messages) or len(messages)
    )
    state = tmp_path / "source" / "state.json"
    args = ["--state-file", str(state), "--bootstrap", "k:1"]
    args += ["--customers", "20", "--orders", "30", "--changes", "100"]
    runner = CliRunner()

    dry = runner.invoke(generator_cli.generate, [*args, "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "dry run" in dry.output
    assert not produced
    assert not state.exists()

    first = runner.invoke(generator_cli.generate, args)
    assert first.exit_code == 0, first.output
    lsn_after_first = ShopSource.from_json(state.read_text()).lsn
    second = runner.invoke(generator_cli.generate, args)
    assert second.exit_code == 0, second.output
    assert re.search(r"\br=50\b", first.output)
    assert not re.search(r"\br=", second.output)  # no second snapshot
    assert ShopSource.from_json(state.read_text()).lsn > lsn_after_first
    assert len(produced) == 2
