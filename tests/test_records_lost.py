"""Records Kafka deleted before the stream read them stop the stream, the lost ranges named, never silently skipped
(pipelines/ingest/lost.py).

The integration test moves a partition's log start offset past records bronze has not read, with the admin API's
delete-records (what retention does to the log start offset), and runs `ingest --once`: it exits 1 naming the
topic, the partition, the exact range and the heal command, and bronze is as it was. The unit tests read Spark's
own failOnDataLoss messages, as its Kafka source words them, into the same ranges.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lakehouse_dev.generator import WorkloadConfig
from pipelines.errors import RecordsLost
from pipelines.ingest import lost
from pipelines.lake.declaration import Declaration
from pipelines.lake.layout import changelog_path, dead_letter_path, lost_path, main_path
from pipelines.lake.table_stats import read_table
from pipelines.runtime.config import KafkaSettings
from pipelines.runtime.lake import Lake
from tests.lake import LakeCopy, run_cli


def _bronze(root: str, decl: Declaration) -> dict[str, object]:
    """Every bronze table's timeline files (a commit, or one only begun, adds one) and each main table's rows."""
    paths = [dead_letter_path(root), *(f(t, root) for t in decl.names for f in (main_path, changelog_path))]
    found: dict[str, object] = {p: sorted(f.name for f in Path(p, ".hoodie", "timeline").iterdir() if f.is_file())
                                for p in paths}
    return found | {f"{t} rows": read_table(main_path(t, root), ["id"]).num_rows for t in decl.names}


@pytest.mark.integration
def test_records_deleted_before_the_stream_read_them_stop_it_naming_the_range(spark, lake: LakeCopy, tmp_path: Path,
                                                                               monkeypatch) -> None:
    from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

    decl = Lake.at(lake.root, spark).declaration
    topic = decl.topic("orders")
    consumer = KafkaConsumer(bootstrap_servers=lake.bootstrap)
    tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
    read = consumer.end_offsets(tps)  # the base lake's ingest read every record: its positions
    lake.produce(lake.source.changes(WorkloadConfig(seed=21, changes=150)))
    now = consumer.end_offsets(tps)
    tp = max(tps, key=lambda tp: now[tp] - read[tp])
    assert now[tp] - read[tp] >= 4, (read, now)
    cut = read[tp] + (now[tp] - read[tp]) // 2  # the first half of the unread records deleted, the rest kept
    admin = KafkaAdminClient(bootstrap_servers=lake.bootstrap)
    try:
        admin.delete_records({tp: cut})
    finally:
        admin.close()
    assert consumer.beginning_offsets([tp])[tp] == cut
    consumer.close()
    before = _bronze(lake.root, decl)

    log_file = tmp_path / "ingest.log"
    done = run_cli("ingest", "--once", env={"LAKEHOUSE_ROOT": lake.root, "KAFKA_BOOTSTRAP_SERVERS": lake.bootstrap,
                                            "LAKEHOUSE_LOG_FILE": str(log_file)})
    assert done.exit_code == 1, done.output
    gone = (f"{topic}[{tp.partition}] offsets {read[tp]}..{cut - 1} ({cut - read[tp]} records) were deleted by "
            "the topic's retention before the stream read them (table orders)")
    for part in (gone, "lakehouse reconcile --table orders --heal", "nothing of them was written"):
        assert part in done.stderr, (part, done.stderr)
        assert part in log_file.read_text(), part
    assert "[STREAM_FAILED]" not in done.stderr, "stopped before a query started"
    # Only the partition whose records are gone: the others of the topic, and the other topics, are whole.
    assert done.stderr.count("were deleted by the topic's retention") == 1, done.stderr
    assert _bronze(lake.root, decl) == before, "the lake was written"

    # Without the check before the query starts (as when retention overtakes a running query), Spark's Kafka
    # source fails the query's batch for data loss: the same error, the range from Spark's message, no restart.
    monkeypatch.setattr(lost, "check", lambda brokers, decl, start, *_: start)
    again = run_cli("ingest", "--once", env={"LAKEHOUSE_ROOT": lake.root, "KAFKA_BOOTSTRAP_SERVERS": lake.bootstrap})
    assert again.exit_code == 1, again.output
    for part in (gone, "Spark's Kafka source failed the query for data loss", "--table orders --heal"):
        assert part in again.stderr, (part, again.stderr)
    assert "was failing its clients" not in again.output, "restarted as a failure of Kafka"
    assert _bronze(lake.root, decl) == before, "the lake was written"
    monkeypatch.undo()

    # A topic recreated: its offsets start again at 0, below the positions bronze has read up to. The stream
    # stops too, rather than read the new topic from a position it never had.
    customers = decl.topic("customers")
    _recreate(lake.bootstrap, customers)
    third = run_cli("ingest", "--once", env={"LAKEHOUSE_ROOT": lake.root, "KAFKA_BOOTSTRAP_SERVERS": lake.bootstrap})
    assert third.exit_code == 1, third.output
    for part in (gone, f"{customers}[0] ends at offset 0, below offset", "the topic was recreated or truncated",
                 "lakehouse reconcile --table customers --heal; lakehouse reconcile --table orders --heal"):
        assert part in third.stderr, (part, third.stderr)
    assert _bronze(lake.root, decl) == before, "the lake was written"

    # The operator's way past: both losses kept in the lake, each partition started at its log start; a later
    # start without the flag starts there too (customers' new topic is empty: no commit records a new position).
    env = {"LAKEHOUSE_ROOT": lake.root, "KAFKA_BOOTSTRAP_SERVERS": lake.bootstrap}
    past = run_cli("ingest", "--once", "--accept-lost", env=env)
    assert past.exit_code == 0, past.output
    kept = [json.loads(line) for line in Path(lost_path(lake.root)).read_text().splitlines()]
    assert [(k["partition"], k["from"], k["to"], k["recreated"]) for k in kept if k["table"] == "orders"] == \
        [(tp.partition, read[tp], cut, False)], kept
    recreated = [k for k in kept if k["table"] == "customers"]
    assert recreated and all(k["to"] == 0 and k["from"] > 0 and k["recreated"] for k in recreated), kept
    assert len(kept) == 1 + len(recreated), kept
    orders = read_table(main_path("orders", lake.root), ["id"]).num_rows
    assert orders >= before["orders rows"], "the records after the cut were applied"
    assert run_cli("ingest", "--once", env=env).exit_code == 0


def _recreate(bootstrap: str, topic: str) -> None:
    """Delete `topic` and create it again, empty, with as many partitions."""
    import time

    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        partitions = len(admin.describe_topics([topic])[0]["partitions"])
        admin.delete_topics([topic])
        deadline = time.monotonic() + 30
        while True:  # the deletion completes in the background
            try:
                admin.create_topics([NewTopic(topic, partitions, 1)])
                return
            except TopicAlreadyExistsError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    finally:
        admin.close()


def _decl() -> Declaration:
    from pipelines.runtime.declared import read_declaration

    return read_declaration()


@pytest.mark.unit
def test_a_start_at_a_position_accepted_as_lost_moves_past_each_range_from_there() -> None:
    ranges = {("t", 0): {5: 9, 9: 14}, ("t", 1): {3: 7}, ("u", 0): {8: 0}}
    # A chain of accepted ranges is followed; a position past a range (a later commit's) stays; a recreated
    # topic's range leads back to its new log start.
    assert lost.past_accepted({"t/0": 5, "t/1": 4, "u/0": 8, "v/0": 5}, ranges) == \
        {"t/0": 14, "t/1": 4, "u/0": 0, "v/0": 5}
    assert lost.past_accepted({"t/0": 5}, {("t", 0): {5: 9, 9: 5}}) == {"t/0": 5}  # a loop ends where it began


@pytest.mark.unit
def test_a_position_below_the_log_start_or_above_the_end_is_a_gap_and_one_never_read_is_not() -> None:
    found = {("t", 0): (40, 90), ("t", 1): (0, 12), ("t", 2): (5, 9), ("t", 3): (7, 7)}
    gaps = lost.gaps({"t/0": 25, "t/1": 30, "t/2": -2, "t/3": 7}, found)
    assert gaps == [lost.Gap("t", 0, 25, 40), lost.Gap("t", 1, 30, 12, recreated=True)]
    assert gaps[0].line("orders") == ("t[0] offsets 25..39 (15 records) were deleted by the topic's retention "
                                      "before the stream read them (table orders)")
    assert "the topic was recreated or truncated" in gaps[1].line("orders")


# Spark 3.5's Kafka source, as it failed queries whose records were gone (pipelines/ingest/lost.py).
FETCH = ("java.lang.IllegalStateException: Cannot fetch offset 2 (GroupId: spark-kafka-source-031a-executor, "
         "TopicPartition: shop.public.orders-1). \nSome data may have been lost because they are not available in "
         "Kafka any more; either the\n data was aged out by Kafka ... set the source option \"failOnDataLoss\"")
RANGE = ("Cannot fetch records in [12, 30) (GroupId: g, TopicPartition: shop.public.orders-0). "
         "Some data may have been lost because they are not available in Kafka any more")
CHANGED = ("Partition shop.public.orders-2's offset was changed from 25 to 10, some data may have been missed. \n"
           "Some data may have been lost because they are not available in Kafka any more")


@pytest.mark.unit
def test_spark_s_data_loss_failures_become_records_lost_with_their_ranges(monkeypatch) -> None:
    decl = _decl()
    orders = decl.topic("orders")
    monkeypatch.setattr(lost, "bounds", lambda _, tps: {tp: (9, 50) for tp in tps})
    kafka = KafkaSettings()
    for text, line in ((FETCH, f"{orders}[1] offsets 2..8 (7 records) were deleted"),
                       (RANGE, f"{orders}[0] offsets 12..29 (18 records) were deleted"),
                       (CHANGED, f"{orders}[2] ends at offset 10, below offset 25")):
        error = lost.translated(RuntimeError(text), kafka, decl, {orders: [0, 1, 2]})
        assert isinstance(error, RecordsLost) and line in error.message, (text, error)
        assert "lakehouse reconcile --table orders --heal" in error.message and error.tables == ("orders",)
    vague = lost.translated(RuntimeError(f"{lost.SPARK_DATA_LOSS}: x-0 is gone"), kafka, decl, {orders: [0, 1]})
    assert vague is not None and f"{orders}[0], {orders}[1]" in vague.message
    assert "--table orders --heal" in vague.message
    for other in ("Timeout expired while fetching topic metadata", "KafkaV2[Subscribe[t]] {failOnDataLoss=true}"):
        assert lost.translated(RuntimeError(other), kafka, decl, {}) is None
