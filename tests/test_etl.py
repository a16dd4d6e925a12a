"""bronze -> silver -> gold by Hudi incremental reads, against the contract's rules applied to the model's state.

One lake goes through every kind of cycle, checked after each: interleaved ingest and etl,
two ingests before one cycle, a cycle with nothing new, and a cycle SIGKILLed between its
commits then run again. Beside it, an incremental-ETL consumer of `read_changes` keeps a
replica of every change-feed table, which must equal the table after each round.

One of the cycles runs as `lakehouse etl` with OpenLineage's listener on (the suite's profile turns it off
for its cost: hudi_configs/test_profile.toml) and the file transport in the test's folder. What its events
must say is taken from what the cycle did, read back from the tables: which tables got a commit, what each
silver commit's checkpoint says it consumed, the columns each written table has now. What the listener gets
wrong or misses for Hudi (docs/deploying.md, "Lineage") is not asserted here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from pyspark.sql import SparkSession

from pipelines.cli.lake import lake_status
from pipelines.ingest.bronze import run_ingest
from pipelines.lake.catalog import change_feed_tables, hudi_table_name, lake_catalog
from pipelines.lake.contract import TABLES
from pipelines.lake.hudi_timeline import checkpoint
from pipelines.lake.layout import quarantine_path, silver_path
from pipelines.lake.table_stats import has_completed_commit, table_stats
from pipelines.monitoring import lineage
from pipelines.monitoring.layer_freshness import LayerFreshnessCollector, layer_freshness, target_seconds
from pipelines.monitoring.metric_names import LAYER_FRESHNESS, LAYER_FRESHNESS_TARGET
from pipelines.runtime.declared import read_declaration
from pipelines.runtime.lake import Lake
from pipelines.transform.changes import read_changes
from pipelines.transform.etl import run_etl
from tests.kill import inflight, run_until
from tests.lake import LINEAGE_ON, LakeCopy, assert_lake_equals_model, run_cli, with_overrides

pytestmark = pytest.mark.integration

FEEDS = tuple(change_feed_tables(read_declaration()))


def _key(table: str, row: dict) -> tuple:
    return tuple(row[k] for k in change_feed_tables(read_declaration())[table])


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
            change_set = read_changes(Lake.at(root, spark), table, self.checkpoints[table])
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
            again = read_changes(Lake.at(root, spark), table, change_set.checkpoint)
            assert again.rows.count() == 0, f"{table}: reading from the new checkpoint returned rows again"


def _etl_with_lineage(spark: SparkSession, root: str, tmp_path: Path) -> None:
    """One cycle as `lakehouse etl` with the listener on: every table it committed to is reported as a write
    named after the table, with the table's columns; silver's inputs are what its checkpoint says it consumed."""
    tables = {t.name: t.path(root) for t in lake_catalog(read_declaration()) if t.layer in ("silver", "gold")}
    commits = {name: table_stats(path).commits for name, path in tables.items() if has_completed_commit(path)}
    events = tmp_path / "lineage"
    env = {**os.environ, "LAKEHOUSE_ROOT": root, "LAKEHOUSE_LINEAGE_DIR": str(events),
           "LAKEHOUSE_HUDI_OVERRIDES": with_overrides(tmp_path / "lineage-on.toml", LINEAGE_ON),
           "LAKEHOUSE_LOG_FILE": str(tmp_path / "etl.log")}
    done = subprocess.run([sys.executable, "-m", "pipelines.cli", "etl"], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]

    wrote = {name for name, path in tables.items() if table_stats(path).commits > commits.get(name, 0)}
    assert {"silver/customers", "silver/orders", "gold/customer_ltv", "gold/daily_revenue"} <= wrote, wrote
    runs = lineage.fold(lineage.read_events([events / "spark.jsonl"]))
    (app,) = lineage.applications(runs, "lakehouse_etl")
    assert app.events == ["START", "COMPLETE"], app.events
    writes = {lineage.dataset_name(d): run for run in lineage.children(runs, app) for d in run.outputs}
    # Every table the cycle committed to is reported as an output, and nothing else is.
    assert writes.keys() == wrote, (writes.keys(), wrote)
    for name, run in writes.items():
        assert run.events[0] == "START" and run.state == "COMPLETE", (name, run.events)
        assert len(run.outputs) == 1, (name, run.outputs)
        # Each write's job is named after its table (lineage.JOB_NAME_OPTION), not after some option.
        assert run.job == f"lakehouse_etl.execute_save_into_data_source_command.{hudi_table_name(name)}", run.job
        # The output's schema facet: the columns the table has after the commit, Hudi's meta columns included
        # (a partitioned table's partition column last, as a file-based relation orders them).
        (fields,) = run.outputs.values()
        assert sorted(fields) == sorted(spark.read.format("hudi").load(tables[name]).columns), (name, fields)
    # A silver table's inputs are what its commit's checkpoint says it consumed: bronze's change log, read by a
    # Hudi incremental query, named as bronze's table.
    for name in sorted(n for n in wrote if n.startswith("silver/")):
        consumed = set(checkpoint(spark, tables[name]))
        assert consumed == {f"bronze/_changelog/{name.rsplit('/', 1)[1]}"}, (name, consumed)
        assert {lineage.dataset_name(d) for d in writes[name].inputs} == consumed, (name, writes[name].inputs)

    printed = run_cli("lineage", "--file", str(events / "spark.jsonl")).output
    assert printed.startswith(f"run {app.run_id}  lakehouse/lakehouse_etl  COMPLETE"), printed
    for name, run in writes.items():
        assert f"  -> {run.job}\n  -> {name}\n" in printed + "\n", (name, printed)


def test_etl_cycles_and_a_consumer_stay_exact(spark, lake: LakeCopy, tmp_path: Path) -> None:
    root, source = lake.root, lake.source
    consumer = Consumer()

    def ingest() -> None:
        lake.produce(source.changes(lake.cfg))
        run_ingest(Lake.at(root, spark), once=True, bootstrap=lake.bootstrap)

    def check() -> None:
        assert_lake_equals_model(spark, root, source.state)
        consumer.catch_up(spark, root)

    # The shared lake: one ingest of a snapshot and changes, one (first, full) cycle.
    check()
    ingest()
    run_etl(Lake.at(root, spark))
    check()
    # Two ingests before one cycle, the cycle as `lakehouse etl` with OpenLineage's listener on: its events.
    ingest()
    ingest()
    # Silver and gold wait for both ingests, from the first one's commit on (gold through silver), then for nothing.
    waiting = layer_freshness(root, Lake.at(root).declaration)
    first = max(waiting[f"silver/{t}"].waiting_seconds for t in TABLES)
    assert all(waiting[f"silver/{t}"].waiting_commits >= 2 for t in TABLES), waiting
    assert all(waiting[f"gold/{t}"].waiting_seconds >= first > 0 for t in ("customer_ltv", "daily_revenue")), waiting
    _etl_with_lineage(spark, root, tmp_path)
    check()
    caught_up = layer_freshness(root, Lake.at(root).declaration)
    assert set(caught_up) == set(waiting)
    assert not any(f.waiting_commits or f.waiting_seconds for f in caught_up.values()), caught_up
    rows = {r["table"]: r for r in lake_status(Lake.at(root)).get("tables", [])}
    assert rows["gold/customer_ltv"]["freshness"] == caught_up["gold/customer_ltv"].as_dict()
    # As the stream's exporter serves them: a series per table, and its target.
    registry = CollectorRegistry()
    registry.register(LayerFreshnessCollector(root, Lake.at(root).declaration))
    for table in caught_up:
        assert registry.get_sample_value(LAYER_FRESHNESS.name, {"table": table}) == 0.0, table
        assert registry.get_sample_value(LAYER_FRESHNESS_TARGET.name, {"table": table}) == target_seconds(), table
    # A cycle with nothing new must not even commit.
    commits = {t: table_stats(silver_path(t, root)).commits for t in TABLES}
    assert not any(run_etl(Lake.at(root, spark)).values())
    assert {t: table_stats(silver_path(t, root)).commits for t in TABLES} == commits
    assert all(has_completed_commit(quarantine_path(t, root)) for t in TABLES)

    # SIGKILL `lakehouse etl` while a quarantine commit is inflight (silver already committed), run again.
    ingest()
    env = {**os.environ, "LAKEHOUSE_ROOT": root, "KAFKA_BOOTSTRAP_SERVERS": lake.bootstrap}
    killed = run_until([sys.executable, "-m", "pipelines.cli", "etl"], env, tmp_path / "etl-killed.log",
                       inflight(Path(root), "silver/_quarantine/*", "commit"))
    assert killed, "the cycle finished before its quarantine commit could be caught"
    # Silver of the first table moved on, its quarantine did not: the checkpoints now differ.
    run_etl(Lake.at(root, spark))
    check()
    assert all(consumer.deletes_seen[t] > 0 for t in FEEDS), f"deletes seen by the consumer: {consumer.deletes_seen}"
