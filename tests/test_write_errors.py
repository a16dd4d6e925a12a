"""A Hudi commit that failed some of its records is rolled back and fails its writer (pipelines/lake/write_errors.py).

Hudi's bulk insert through its row writer commits the records it could write and counts the others only in the
commit's metadata (`totalWriteErrors`). The integration test makes records fail for real: a `_source_ts` before
1582 under Spark's EXCEPTION rebase mode, which the row writer's Parquet writer refuses record by record.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from lakehouse_dev.generator import Message, ShopSource, WorkloadConfig, ensure_topics, produce
from pipelines.errors import WriteFailed
from pipelines.lake.timeline_files import Instant
from pipelines.lake.write_errors import check_commit, failed_files

# The write stats of a commit as Hudi 1.0.2 wrote them for a bulk insert of three records, one of which its row
# writer failed (a pre-1582 timestamp under Spark's EXCEPTION rebase mode); trimmed to the fields read here.
SAMPLE_METADATA = json.loads("""{
  "partitionToWriteStats": {
    "": [
      {"fileId": "00000000-7c1b-4f0e-9d3e-0e0d7a2b9c11", "path": "00000000-7c1b-4f0e-9d3e-0e0d7a2b9c11_0-9-0_2.parquet",
       "prevCommit": "null", "numWrites": 1, "numDeletes": 0, "totalWriteBytes": 434881, "totalWriteErrors": 0,
       "partitionPath": ""},
      {"fileId": "00000001-f7ec-4945-9558-19bc270a4f58", "path": "00000001-f7ec-4945-9558-19bc270a4f58_1-9-0_2.parquet",
       "prevCommit": "null", "numWrites": 1, "numDeletes": 0, "totalWriteBytes": 432582, "totalWriteErrors": 1,
       "partitionPath": ""}
    ],
    "_ingest_date=2024-01-02": [
      {"fileId": "00000002-aaaa", "path": "_ingest_date=2024-01-02/00000002-aaaa_0-9-0_2.parquet",
       "numWrites": 3, "totalWriteErrors": 2, "partitionPath": "_ingest_date=2024-01-02"}
    ]
  },
  "compacted": false,
  "extraMetadata": {"_lakehouse.write": "token"},
  "operationType": "BULK_INSERT"
}""")
INSTANT = Instant("20240102030405678", "deltacommit", "20240102030406789", "deltacommit")


@pytest.mark.unit
def test_the_failed_records_are_summed_over_the_commits_write_stats() -> None:
    files = failed_files(SAMPLE_METADATA)
    assert [(f.partition, f.file, f.errors, f.writes) for f in files] == [
        ("", "00000001-f7ec-4945-9558-19bc270a4f58_1-9-0_2.parquet", 1, 1),
        ("_ingest_date=2024-01-02", "00000002-aaaa_0-9-0_2.parquet", 2, 3)]
    assert failed_files({"partitionToWriteStats": {"": [{"totalWriteErrors": 0}]}}) == []
    assert failed_files({}) == [], "a metadata without write stats (a clean's) has no errors"


@pytest.mark.unit
def test_a_commit_with_errors_is_rolled_back_and_named_in_the_error() -> None:
    rolled: list[str] = []
    with pytest.raises(WriteFailed) as raised:
        check_commit("/lake/bronze/_changelog/orders", INSTANT, SAMPLE_METADATA, "bronze_changelog_orders",
                     rolled.append)
    assert rolled == [INSTANT.requested]
    failed = raised.value
    assert (failed.table, failed.instant, failed.errors) == (
        "bronze/_changelog/orders (bronze_changelog_orders)", INSTANT.requested, 3)
    assert "bronze/_changelog/orders" in str(failed) and "3 record(s)" in str(failed)
    assert "rolled back" in str(failed) and "_ingest_date=2024-01-02/00000002-aaaa_0-9-0_2.parquet: 2" in str(failed)

    def refused(requested: str) -> None:
        raise RuntimeError("lock not acquired")

    with pytest.raises(WriteFailed, match=r"Rolling the commit back failed \(lock not acquired\): it is still visible"):
        check_commit("/lake/bronze/orders", INSTANT, SAMPLE_METADATA, None, refused)
    check_commit("/lake/bronze/orders", INSTANT, {"partitionToWriteStats": {"": [{"totalWriteErrors": 0}]}}, None,
                 refused)  # no errors: nothing rolled back, nothing raised


# Milliseconds since the epoch of a day in 1494: before 1582, which Spark's EXCEPTION mode refuses to write.
ANCIENT_MS = -15_000_000_000_000
REBASE = "spark.sql.parquet.datetimeRebaseModeInWrite"


def _ancient(message: Message) -> Message:
    """`message` with its source's `ts_ms` (bronze's `_source_ts`) before 1582, in either converter format."""
    value = json.loads(message.value or b"")
    envelope = value.get("payload", value) if "schema" in value else value
    envelope["source"]["ts_ms"] = ANCIENT_MS
    return Message(message.topic, message.key, json.dumps(value).encode())


@pytest.mark.integration
def test_a_batch_whose_records_hudi_failed_to_write_commits_nothing_and_runs_again(spark, broker, tmp_path) -> None:
    """The first batch of a new lake, one record of each table unwritable: the stream fails with WriteFailed naming
    the table and the count; no table keeps a commit of the batch (main's merge-on-read delta commits and the
    change logs' commits rolled back); with the cause gone, the next run is exact against the model."""
    from pipelines.ingest.bronze import run_ingest
    from pipelines.lake.contract import TABLES, topic
    from pipelines.lake.layout import changelog_path, main_path
    from pipelines.lake.table_stats import has_completed_commit, read_table
    from pipelines.lake.timeline_files import timeline
    from pipelines.runtime.lake import Lake
    from tests.lake import assert_bronze_equals_model
    from tests.model import fold_with_lsn

    root = str(tmp_path / "lake")
    source = ShopSource(13)
    sent = source.snapshot(WorkloadConfig(seed=13, customers=30, orders=60, changes=0, malformed_fraction=0.0,
                                                replay_runs=0))
    for table in TABLES:  # one record of each table, its last one: the others are written before it
        at = max(i for i, m in enumerate(sent) if m.topic == topic(table) and m.value)
        sent[at] = _ancient(sent[at])
    ensure_topics(broker.bootstrap, partitions=1)
    produce(sent, broker.bootstrap)
    was = spark.conf.get(REBASE)
    spark.conf.set(REBASE, "EXCEPTION")
    try:
        with pytest.raises(Exception) as raised:
            run_ingest(Lake.at(root, spark), once=True, bootstrap=broker.bootstrap)
    finally:
        spark.conf.set(REBASE, was)
    failed = raised.value if isinstance(raised.value, WriteFailed) else raised.value.__cause__
    assert isinstance(failed, WriteFailed), f"not a WriteFailed: {raised.value!r}"
    assert failed.errors == 1 and failed.table.startswith("bronze/"), failed.table
    assert failed.table.split()[0] in str(failed) and "1 record(s)" in str(failed)
    for table in TABLES:
        for path in (main_path(table, root), changelog_path(table, root)):
            instants = [(i.action, i.completed_as) for i in timeline(path)]
            assert instants == [("rollback", "rollback")] and not has_completed_commit(path), (path, instants)
            assert not [f for f in Path(path).rglob("*.parquet") if ".hoodie" not in f.parts], path

    run_ingest(Lake.at(root, spark), once=True, bootstrap=broker.bootstrap)
    expected, lsns = fold_with_lsn(sent)
    assert_bronze_equals_model(spark, root, expected, lsns)
    for table in TABLES:
        logged = Counter(r["_kafka_offset"] for r in read_table(changelog_path(table, root), ["_kafka_offset"])
                         .to_pylist())
        assert set(logged.values()) == {1} and len(logged) == len(expected[table]), table
        old = spark.read.format("hudi").load(main_path(table, root)).filter("year(_source_ts) < 1582").count()
        assert old == 1, f"bronze/{table}: the record that failed before is written as it is"
