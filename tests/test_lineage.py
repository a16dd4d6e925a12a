"""OpenLineage events of a real etl cycle, from the listener every session runs (hudi_configs/spark.toml [lineage]).

The cycle is an incremental one on a copy of the shared lake (new changes ingested first), in the suite's own
session, whose listener appends to the file transport's file of this process (tests/conftest.py). What the
events must say is taken from what the cycle did, read back from the tables: which tables got a commit, what
each silver commit's checkpoint says it consumed, and the columns each written table has now. What the listener
does not report for Hudi (README.md, "Lineage") is not asserted here.
"""

from __future__ import annotations

import time
from pathlib import Path

from pyspark.sql import SparkSession

from pipelines import lineage
from pipelines.catalog import hudi_table_name, lake_catalog
from pipelines.devtools.generator import WorkloadConfig
from pipelines.hudi_timeline import checkpoint
from pipelines.ingest.bronze import run_ingest
from pipelines.table_stats import has_completed_commit, table_stats
from pipelines.transform.etl import run_etl
from tests.lake import LakeCopy


def _events_after(spark: SparkSession, events: Path, offset: int) -> dict[str, lineage.Run]:
    """The runs of the events appended to `events` after byte `offset`, once every one of them has ended.

    The listener writes from Spark's listener bus, after the query has returned: wait for the bus to drain,
    then for the COMPLETE of every run that started (a few seconds at most).
    """
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty(60_000)
    deadline = time.monotonic() + 30
    while True:
        with events.open(encoding="utf-8") as fh:
            fh.seek(offset)
            runs = lineage.fold(lineage.read_events_from_lines(fh))
        if all(r.state in ("COMPLETE", "FAIL", "ABORT") for r in runs.values()) or time.monotonic() > deadline:
            return runs
        time.sleep(0.5)


def test_an_etl_cycle_reports_its_bronze_reads_and_silver_and_gold_writes(spark: SparkSession, lake: LakeCopy) -> None:
    root = lake.root
    lake.produce(lake.source.changes(WorkloadConfig(seed=31, changes=150, replay_runs=1)))
    run_ingest(once=True, root=root, bootstrap=lake.bootstrap, spark=spark)
    tables = {t.name: t.path(root) for t in lake_catalog() if t.layer in ("silver", "gold")}
    commits = {name: table_stats(path).commits for name, path in tables.items() if has_completed_commit(path)}
    events = Path(spark.conf.get("spark.openlineage.transport.location"))
    offset = events.stat().st_size if events.exists() else 0

    run_etl(spark, root)

    wrote = {name for name, path in tables.items() if table_stats(path).commits > commits.get(name, 0)}
    assert {"silver/customers", "silver/orders", "gold/customer_ltv", "gold/daily_revenue"} <= wrote, wrote
    writes = {lineage.dataset_name(d): run for run in _events_after(spark, events, offset).values()
              for d in run.outputs}
    # Every table the cycle committed to is reported as an output, and nothing else is.
    assert writes.keys() == wrote, (writes.keys(), wrote)
    for name, run in writes.items():
        assert run.events[0] == "START" and run.state == "COMPLETE", (name, run.events)
        assert len(run.outputs) == 1, (name, run.outputs)
        # Each write's job is named after its table (pipelines.lineage.JOB_NAME_OPTION), not after some option.
        assert run.job.endswith(f".{hudi_table_name(name)}"), (name, run.job)
        # The output's schema facet: the columns the table has after the commit, Hudi's meta columns included.
        (fields,) = run.outputs.values()
        assert fields == spark.read.format("hudi").load(tables[name]).columns, (name, fields)
    # A silver table's inputs are what its commit's checkpoint says it consumed: bronze's change log, read by
    # a Hudi incremental query, named as bronze's table.
    for name in wrote:
        if name.startswith("silver/"):
            consumed = set(checkpoint(spark, tables[name]))
            assert consumed == {f"bronze/_changelog/{name.rsplit('/', 1)[1]}"}, (name, consumed)
            assert {lineage.dataset_name(d) for d in writes[name].inputs} == consumed, (name, writes[name].inputs)
