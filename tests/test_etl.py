"""bronze -> silver -> gold by Hudi incremental reads, against the contract's rules applied to the model's state.

One lake goes through every kind of cycle, checked after each: interleaved ingest and etl,
two ingests before one cycle, a cycle with nothing new, and a cycle SIGKILLed between its
commits then run again. Beside it, an incremental-ETL consumer of `read_changes` keeps a
replica of every change-feed table, which must equal the table after each round.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from pipelines.catalog import change_feed_tables
from pipelines.contract import TABLES
from pipelines.ingest.bronze import run_ingest
from pipelines.settings import quarantine_path, silver_path
from pipelines.table_stats import has_completed_commit, table_stats
from pipelines.transform.changes import read_changes
from pipelines.transform.etl import run_etl
from tests.kill import inflight, run_until
from tests.lake import LakeCopy, assert_lake_equals_model

FEEDS = tuple(change_feed_tables())


def _key(table: str, row: dict) -> tuple:
    return tuple(row[k] for k in change_feed_tables()[table])


def _snapshot(spark: SparkSession, root: str, table: str) -> dict[tuple, dict]:
    df = spark.read.format("hudi").load(f"{root}/{table}")
    return {_key(table, r): {c: r[c] for c in df.columns if not c.startswith("_hoodie")} for r in df.collect()}


class Consumer:
    """An incremental-ETL consumer: applies each change set to its replicas, keeps the checkpoints."""

    def __init__(self) -> None:
        self.replicas: dict[str, dict[tuple, dict]] = {t: {} for t in FEEDS}
        self.checkpoints: dict[str, str | None] = dict.fromkeys(FEEDS)
        self.deletes_seen = dict.fromkeys(FEEDS, 0)

    def catch_up(self, spark: SparkSession, root: str) -> None:
        """Read every table's changes since the last checkpoint; each replica must then equal its table."""
        for table in FEEDS:
            change_set = read_changes(spark, table, self.checkpoints[table], root)
            assert change_set.snapshot == (self.checkpoints[table] is None), table
            rows = [r.asDict() for r in change_set.rows.collect()]
            keys = [_key(table, r) for r in rows]
            assert len(keys) == len(set(keys)), f"{table}: a key twice in one read"
            replica = self.replicas[table]
            for key, row in zip(keys, rows, strict=True):
                if row.pop("_change") == "delete":
                    self.deletes_seen[table] += replica.pop(key, None) is not None
                else:
                    replica[key] = row
            self.checkpoints[table] = change_set.checkpoint
            want = _snapshot(spark, root, table)
            assert replica.keys() == want.keys(), f"{table}: replica keys differ from the table"
            assert {k: {c: v[c] for c in want[k]} for k, v in replica.items()} == want, \
                f"{table}: replica rows differ from the table"
            again = read_changes(spark, table, change_set.checkpoint, root)
            assert again.rows.count() == 0, f"{table}: reading from the new checkpoint returned rows again"


def test_etl_cycles_and_a_consumer_stay_exact(spark, lake: LakeCopy, tmp_path: Path) -> None:
    root, source = lake.root, lake.source
    consumer = Consumer()

    def ingest() -> None:
        lake.produce(source.changes(lake.cfg))
        run_ingest(once=True, root=root, bootstrap=lake.bootstrap, spark=spark)

    def check() -> None:
        assert_lake_equals_model(spark, root, source.state)
        consumer.catch_up(spark, root)

    # The shared lake: one ingest of a snapshot and changes, one (first, full) cycle.
    check()
    ingest()
    run_etl(spark, root)
    check()
    # Two ingests before one cycle.
    ingest()
    ingest()
    run_etl(spark, root)
    check()
    # A cycle with nothing new must not even commit.
    commits = {t: table_stats(silver_path(t, root)).commits for t in TABLES}
    assert not any(run_etl(spark, root).values())
    assert {t: table_stats(silver_path(t, root)).commits for t in TABLES} == commits
    assert all(has_completed_commit(quarantine_path(t, root)) for t in TABLES)

    # SIGKILL `lakehouse etl` while a quarantine commit is inflight (silver already committed), run again.
    ingest()
    env = {**os.environ, "LAKEHOUSE_ROOT": root, "KAFKA_BOOTSTRAP_SERVERS": lake.bootstrap}
    killed = run_until([sys.executable, "-m", "pipelines.cli", "etl"], env, tmp_path / "etl-killed.log",
                       inflight(Path(root), "silver/_quarantine/*", "commit"))
    assert killed, "the cycle finished before its quarantine commit could be caught"
    # Silver of the first table moved on, its quarantine did not: the checkpoints now differ.
    run_etl(spark, root)
    check()
    assert all(consumer.deletes_seen[t] > 0 for t in FEEDS), f"deletes seen by the consumer: {consumer.deletes_seen}"
