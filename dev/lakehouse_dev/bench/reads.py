"""Read amplification: a bronze snapshot query over many log files, before and after compaction.

Ingest runs with table services external (no inline compaction) in many small batches,
so every file group of bronze main collects a log file per batch. The same snapshot
query (count, and an aggregate touching every column, so nothing is pruned) is timed
with Spark and with hudi-rs, then `lakehouse services --only compact` merges the logs
into base files and the query is timed again. Reference: the compacted table, same process.
"""

from __future__ import annotations

import shutil
import statistics
import time
from typing import Any

from lakehouse_dev.bench.common import bench_dir, broker, lakehouse, produce_backlog, save, say, table
from lakehouse_dev.bench.plots import grouped_bars
from pipelines.lake import contract
from pipelines.lake.table_stats import read_table, table_stats

REPEATS = 3


def _query(spark, path: str) -> float:
    from pyspark.sql import functions as F

    df = spark.read.format("hudi").load(path)
    started = time.monotonic()
    df.agg(F.count("*"), F.max("_lsn"), *[F.max(F.col(c).cast("string")) for c in df.columns[5:]]).collect()
    return time.monotonic() - started


def _timed(spark, path: str) -> dict[str, Any]:
    _query(spark, path)  # warm-up: class loading, file listing caches
    spark_s = statistics.median(_query(spark, path) for _ in range(REPEATS))
    rs = []
    for _ in range(REPEATS):
        started = time.monotonic()
        read_table(path)
        rs.append(time.monotonic() - started)
    stats = table_stats(path)
    return {"spark_s": round(spark_s, 3), "hudi_rs_s": round(statistics.median(rs), 3), "rows": stats.rows,
            "file_groups": stats.file_groups, "log_files": stats.log_files}


def run(events: int, batches: int, seed: int) -> dict[str, Any]:
    from pipelines.runtime.spark import get_spark

    work = bench_dir() / "reads"
    shutil.rmtree(work, ignore_errors=True)
    root = work / "lake"
    with broker("reads") as node:
        env = {"LAKEHOUSE_ROOT": str(root), "KAFKA_BOOTSTRAP_SERVERS": node.bootstrap,
               "LAKEHOUSE_TABLE_SERVICES": "external"}
        backlog = produce_backlog(node.bootstrap, events, seed)
        per_batch = max(1, backlog.records // batches)
        say(f"ingest in batches of {per_batch:,} records, no inline compaction")
        lakehouse("ingest", "--once", "--max-offsets-per-trigger", str(per_batch), env=env, log=work / "ingest.log")
    spark = get_spark("lakehouse-bench-reads")
    results = {}
    for t in contract.TABLES:
        path = str(root / "bronze" / t)
        before = _timed(spark, path)
        say(f"bronze/{t}: {before['log_files']} log files: spark {before['spark_s']}s, hudi-rs {before['hudi_rs_s']}s")
        results[t] = {"before": before}
    lakehouse("services", "--only", "compact", *[a for t in contract.TABLES for a in ("--table", f"bronze/{t}")],
              env={"LAKEHOUSE_ROOT": str(root)}, log=work / "compact.log")
    for t in contract.TABLES:
        after = _timed(spark, str(root / "bronze" / t))
        results[t]["after"] = after
        results[t]["spark_ratio"] = round(results[t]["before"]["spark_s"] / after["spark_s"], 2)
        results[t]["hudi_rs_ratio"] = round(results[t]["before"]["hudi_rs_s"] / after["hudi_rs_s"], 2)
        say(f"bronze/{t} compacted: spark {after['spark_s']}s, hudi-rs {after['hudi_rs_s']}s")
    figures = {"backlog": backlog.as_dict(), "batches": batches, "tables": results}
    save("reads", figures)
    labels = [f"{t} {engine}" for t in contract.TABLES for engine in ("spark", "hudi-rs")]
    grouped_bars(bench_dir() / "reads.png", "bronze snapshot query: many log files vs compacted", labels,
                 {when: [results[t][when][f"{e}_s"] for t in contract.TABLES for e in ("spark", "hudi_rs")]
                  for when in ("before", "after")}, "seconds (median of 3)")
    return figures


def report(figures: dict[str, Any]) -> str:
    rows = []
    for t, r in figures["tables"].items():
        for when in ("before", "after"):
            x = r[when]
            rows.append({"table": f"bronze/{t}", "state": "log files" if when == "before" else "compacted",
                         "rows": f"{x['rows']:,}", "log files": x["log_files"], "spark s": x["spark_s"],
                         "hudi-rs s": x["hudi_rs_s"]})
        rows.append({"table": "", "state": "ratio", "spark s": r["spark_ratio"], "hudi-rs s": r["hudi_rs_ratio"]})
    return table(rows, ["table", "state", "rows", "log files", "spark s", "hudi-rs s"])
