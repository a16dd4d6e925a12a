"""OpenLineage events of a real etl cycle, from openlineage-spark's listener (hudi_configs/spark.toml [lineage]).

The cycle is an incremental one on a copy of the shared lake (new changes ingested first), run as `lakehouse
etl` with the listener on (the suite's profile turns it off for its cost: hudi_configs/test_profile.toml) and
the file transport in the test's folder. What the events must say is taken from what the cycle did, read back
from the tables: which tables got a commit, what each silver commit's checkpoint says it consumed, the columns
each written table has now. What the listener gets wrong or misses for Hudi (README.md, "Lineage") is not
asserted here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from pipelines import lineage
from pipelines.catalog import hudi_table_name, lake_catalog
from pipelines.devtools.generator import WorkloadConfig
from pipelines.hudi_timeline import checkpoint
from pipelines.ingest.bronze import run_ingest
from pipelines.table_stats import has_completed_commit, table_stats
from tests.lake import LINEAGE_ON, LakeCopy, run_cli, with_overrides


def test_an_etl_cycle_reports_its_bronze_reads_and_silver_and_gold_writes(spark: SparkSession, lake: LakeCopy,
                                                                           tmp_path: Path) -> None:
    root = lake.root
    lake.produce(lake.source.changes(WorkloadConfig(seed=31, changes=150, replay_runs=1)))
    run_ingest(once=True, root=root, bootstrap=lake.bootstrap, spark=spark)
    tables = {t.name: t.path(root) for t in lake_catalog() if t.layer in ("silver", "gold")}
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
        # Each write's job is named after its table (pipelines.lineage.JOB_NAME_OPTION), not after some option.
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
