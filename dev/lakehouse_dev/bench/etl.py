"""Incremental ETL: cycle time and what a cycle reads after 0.1%, 1% and 10% of the rows changed, and after 0.1%
once more following an erasure (whose purge leaves only the newest version of every table).

A lake is built from a backlog (ingest, first etl), then for each fraction the source
changes that share of its live rows, ingest catches up and one `etl` cycle runs, metered
(`pipelines.monitoring.metrics.ReadMeter`: rows, bytes and files Spark's scans read). The reference
is a full rebuild in the same process: the same cycle over a copy of bronze with no
silver or gold, i.e. every change from the start.
"""

from __future__ import annotations

import shutil
import time
from typing import Any

from lakehouse_dev.bench.common import bench_dir, broker, lakehouse, produce_backlog, save, say, table
from lakehouse_dev.bench.plots import grouped_bars
from pipelines.lake import contract
from pipelines.runtime.lake import Lake

FRACTIONS = (0.001, 0.01, 0.1)


def _metered_cycle(spark, root: str) -> dict[str, Any]:
    from pipelines.monitoring.metrics import ReadMeter
    from pipelines.transform.etl import run_etl

    started = time.monotonic()
    with ReadMeter(spark) as meter:
        run_etl(Lake.at(root, spark))
    return {"seconds": round(time.monotonic() - started, 2), **meter.result.as_dict()}


def run(events: int, seed: int, fractions: tuple[float, ...] = FRACTIONS) -> dict[str, Any]:
    from pipelines.runtime.spark import get_spark

    work = bench_dir() / "etl"
    shutil.rmtree(work, ignore_errors=True)
    root = work / "lake"
    steps: list[dict[str, Any]] = []
    with broker("etl") as node:
        env = {"LAKEHOUSE_ROOT": str(root), "KAFKA_BOOTSTRAP_SERVERS": node.bootstrap}
        backlog = produce_backlog(node.bootstrap, events, seed)
        source = backlog.source
        say("building the lake: ingest, first etl")
        lakehouse("ingest", "--once", env=env, log=work / "ingest.log")
        spark = get_spark("lakehouse-bench-etl")
        first = _metered_cycle(spark, str(root))
        say(f"first cycle (everything): {first['seconds']}s")
        env["LAKEHOUSE_ERASURE_KEY_FILE"] = str(work / "erasure.key")

        def changed_then_cycle(fraction: float, after_erasure: bool = False) -> None:
            live = sum(len(source.state[t]) for t in contract.TABLES)
            changes = max(1, round(live * fraction))
            say(f"{fraction:.1%} of {live:,} live rows: {changes:,} changes")
            produce_backlog(node.bootstrap, changes, seed, source=source)
            lakehouse("ingest", "--once", env=env, log=work / "ingest.log")
            cycle = _metered_cycle(spark, str(root))
            say(f"  incremental cycle: {cycle['seconds']}s, {cycle['rows_read']:,} rows, "
                f"{cycle['files_read']} files read")
            steps.append({"fraction": fraction, "changes": changes, "live_rows": live, "incremental": cycle,
                          "after_erasure": after_erasure})

        for fraction in fractions:
            changed_then_cycle(fraction)
        # An erasure purges every older version of every table: the next cycle must still read what changed only.
        victim = min(source.state["customers"])
        say(f"erasing customer {victim}, then {fractions[0]:.1%} again")
        lakehouse("gdpr", "erase", "--customer-id", str(victim), "--reference", "BENCH-ETL-1", env=env,
                  log=work / "erasure.log")
        changed_then_cycle(fractions[0], after_erasure=True)
        rebuild_root = work / "rebuild"
        shutil.copytree(root / "bronze", rebuild_root / "bronze")
        say("full rebuild: the same cycle over a copy of bronze without silver and gold")
        full = _metered_cycle(spark, str(rebuild_root))
        say(f"  full rebuild: {full['seconds']}s, {full['rows_read']:,} rows, {full['files_read']} files read")
    for step in steps:
        step["time_vs_full_rebuild"] = round(step["incremental"]["seconds"] / full["seconds"], 3)
        step["rows_read_vs_full_rebuild"] = round(step["incremental"]["rows_read"] / max(1, full["rows_read"]), 3)
    figures = {"backlog": backlog.as_dict(), "first_cycle": first, "steps": steps, "full_rebuild": full}
    save("etl", figures)
    labels = [_label(s) for s in steps] + ["full rebuild"]
    grouped_bars(bench_dir() / "etl.png", "ETL cycle after a change of x% of the rows",
                 labels, {"seconds": [s["incremental"]["seconds"] for s in steps] + [full["seconds"]],
                          "rows read / 10k": [s["incremental"]["rows_read"] / 1e4 for s in steps]
                          + [full["rows_read"] / 1e4]}, "seconds | rows read / 10,000")
    return figures


def _label(step: dict[str, Any]) -> str:
    return f"{step['fraction']:.1%}" + (" after an erasure" if step.get("after_erasure") else "")


def report(figures: dict[str, Any]) -> str:
    rows = [{"changed": f"{_label(s)} ({s['changes']:,})", "cycle s": s["incremental"]["seconds"],
             "rows read": f"{s['incremental']['rows_read']:,}", "files read": s["incremental"]["files_read"],
             "time vs rebuild": s["time_vs_full_rebuild"], "rows vs rebuild": s["rows_read_vs_full_rebuild"]}
            for s in figures["steps"]]
    full = figures["full_rebuild"]
    rows.append({"changed": "full rebuild", "cycle s": full["seconds"], "rows read": f"{full['rows_read']:,}",
                 "files read": full["files_read"], "time vs rebuild": 1.0, "rows vs rebuild": 1.0})
    return table(rows, ["changed", "cycle s", "rows read", "files read", "time vs rebuild", "rows vs rebuild"])

