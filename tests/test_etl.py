"""bronze -> silver -> gold by Hudi incremental reads, against the contract's rules applied to the model's state."""

from __future__ import annotations

from pipelines.bronze import run_ingest
from pipelines.contract import TABLES
from pipelines.etl import run_etl
from pipelines.generator import ShopSource, WorkloadConfig, ensure_topics, produce
from pipelines.settings import quarantine_path, silver_path
from pipelines.table_stats import exists, table_stats
from tests.lake import assert_lake_equals_model


def test_silver_follows_bronze_through_interleaved_cycles(spark, broker, tmp_path) -> None:
    root = str(tmp_path / "lake")
    source = ShopSource(21)
    cfg = WorkloadConfig(seed=21, customers=120, orders=360, changes=1000, invalid_fraction=0.1)
    ensure_topics(broker.bootstrap)

    def step(messages, cycles: int = 1) -> None:
        produce(messages, broker.bootstrap)
        run_ingest(once=True, root=root, bootstrap=broker.bootstrap, spark=spark)
        for _ in range(cycles):
            run_etl(spark, root)

    step(source.snapshot(cfg) + source.changes(cfg))
    assert_lake_equals_model(spark, root, source.state)
    step(source.changes(cfg))
    assert_lake_equals_model(spark, root, source.state)
    # Two ingests before one cycle, then a cycle with nothing new: it must not even commit.
    produce(source.changes(cfg), broker.bootstrap)
    run_ingest(once=True, root=root, bootstrap=broker.bootstrap, spark=spark)
    step(source.changes(cfg))
    assert_lake_equals_model(spark, root, source.state)
    commits = {t: table_stats(silver_path(t, root)).commits for t in TABLES}
    assert not any(run_etl(spark, root).values())
    assert {t: table_stats(silver_path(t, root)).commits for t in TABLES} == commits
    assert all(exists(quarantine_path(t, root)) for t in TABLES)


def test_a_cycle_killed_between_its_commits_and_rerun_is_exact(spark, broker, tmp_path) -> None:
    """SIGKILL `lakehouse etl` while a quarantine commit is inflight (silver already committed), then run again."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tests.kill import inflight, run_until

    root = str(tmp_path / "lake")
    source = ShopSource(33)
    cfg = WorkloadConfig(seed=33, customers=100, orders=300, changes=800, invalid_fraction=0.1)
    ensure_topics(broker.bootstrap)
    produce(source.snapshot(cfg) + source.changes(cfg), broker.bootstrap)
    run_ingest(once=True, root=root, bootstrap=broker.bootstrap, spark=spark)
    run_etl(spark, root)
    produce(source.changes(cfg), broker.bootstrap)
    run_ingest(once=True, root=root, bootstrap=broker.bootstrap, spark=spark)

    env = {**os.environ, "LAKEHOUSE_ROOT": root, "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap}
    cmd = [sys.executable, "-m", "pipelines.cli", "etl"]
    killed = run_until(cmd, env, tmp_path / "etl-killed.log", inflight(Path(root), "silver/_quarantine/*", "commit"))
    assert killed, "the cycle finished before its quarantine commit could be caught"
    # Silver of the first table moved on, its quarantine did not: the checkpoints now differ.
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert_lake_equals_model(spark, root, source.state)
