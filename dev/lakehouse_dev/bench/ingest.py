"""Ingest throughput: one backlog, four writers, in one run on the same broker.

- `lakehouse`: `lakehouse ingest --once`, the project's job (per batch: each table's change
  log and main, and the dead letters).
- `lakehouse_before_tuning`: the same job without its writer options' tuning
  (`hudi_configs/bench_before_tuning.toml`): before/after in every run.
- `hudi_sink`: plain Hudi, Hudi's own Structured Streaming sink (`writeStream.format("hudi")`)
  writing MERGE_ON_READ tables configured like bronze main, without the job's ordering
  guarantees and bookkeeping (`lakehouse_dev.bench.hudi_sink`). The reference asked for
  is HoodieStreamer, but Maven Central as reachable here serves no hudi-utilities(-slim)-bundle
  for Hudi 1.0.x and the Spark bundle lacks it, so the sink in that bundle is the plain-Hudi
  reference.
- `lakehouse_cluster`: the project's job again, on a Spark standalone cluster of its own (a master
  and two one-core workers, dev/lakehouse_dev/spark_cluster.py) instead of `local[2]`: the cost
  of separate executor JVMs on the same two cores, with where the tasks' time went (event logs).
- `parquet`: the same Spark read and parse appending plain Parquet: the upper bound of any
  table format on this machine (`lakehouse_dev.bench.parquet_sink`).

Each runs in its own process, as in production, so JVM start-up is in every figure.
Rows are counted afterwards with hudi-rs and compared with the generator's own state:
a fast writer that gets the rows wrong is no contender.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds

import hudi_configs
from lakehouse_dev.bench.common import (
    Backlog,
    bench_dir,
    broker,
    cluster_tasks,
    lakehouse,
    produce_backlog,
    save,
    say,
    spark_cluster,
    table,
)
from lakehouse_dev.bench.plots import bar_chart
from pipelines.ingest.batch import BatchReport
from pipelines.lake import contract
from pipelines.lake.table_stats import table_stats

CONTENDERS = ("lakehouse", "lakehouse_before_tuning", "lakehouse_cluster", "hudi_sink", "parquet")


def _live_rows(path: str) -> int:
    return table_stats(path).rows


BEFORE_TUNING = Path(hudi_configs.__file__).parent / "bench_before_tuning.toml"


def _phases(log: Path) -> dict[str, float]:
    """Seconds per phase, summed over the batches of the job's log (BatchReport lines)."""
    total: dict[str, float] = {}
    for report in filter(None, map(BatchReport.parse, log.read_text(errors="replace").splitlines())):
        for name, seconds in report.phases.items():
            total[name] = round(total.get(name, 0.0) + seconds, 1)
    return total


def _lakehouse(work: Path, bootstrap: str, env: dict[str, str], name: str = "lakehouse") -> dict[str, Any]:
    root, log = work / name, work / f"{name}.log"
    seconds = lakehouse("ingest", "--once", env={**env, "LAKEHOUSE_ROOT": str(root),
                                                  "KAFKA_BOOTSTRAP_SERVERS": bootstrap}, log=log)
    return {"seconds": seconds, "rows": {t: _live_rows(f"{root}/bronze/{t}") for t in contract.TABLES},
            "phases_s": _phases(log)}


def _lakehouse_before(work: Path, bootstrap: str, env: dict[str, str]) -> dict[str, Any]:
    return _lakehouse(work, bootstrap, {**env, "LAKEHOUSE_HUDI_OVERRIDES": str(BEFORE_TUNING)},
                      "lakehouse_before_tuning")


def _lakehouse_cluster(work: Path, bootstrap: str, env: dict[str, str]) -> dict[str, Any]:
    with spark_cluster(work) as on_cluster:
        result = _lakehouse(work, bootstrap, {**env, **on_cluster}, "lakehouse_cluster")
        return {**result, "cluster_tasks": cluster_tasks(on_cluster)}


def _reference(work: Path, command: str, name: str, bootstrap: str, env: dict[str, str]) -> tuple[Path, float]:
    """Run a reference writer (`lakehouse dev bench COMMAND`) in its own process, as the job runs: its root and
    wall time."""
    root = work / name
    return root, lakehouse("dev", "bench", command, "--root", str(root), "--bootstrap", bootstrap, env=env,
                           log=work / f"{name}.log")


def _parquet(work: Path, bootstrap: str, env: dict[str, str]) -> dict[str, Any]:
    root, seconds = _reference(work, "parquet-sink", "parquet", bootstrap, env)
    # Appends, so every change is a row: not comparable to live rows, shown for completeness.
    return {"seconds": seconds, "appended": {t: ds.dataset(str(root / t)).count_rows() for t in contract.TABLES}}


def _hudi_sink(work: Path, bootstrap: str, env: dict[str, str]) -> dict[str, Any]:
    root, seconds = _reference(work, "hudi-sink", "hudi_sink", bootstrap, env)
    # Live rows, like bronze main's. One batch (a catch-up) gets them right; across batches plain
    # Hudi can bring back deleted rows (lakehouse_dev.bench.hudi_sink).
    return {"seconds": seconds, "rows": {t: _live_rows(str(root / t)) for t in contract.TABLES}}


RUNNERS = {"lakehouse": _lakehouse, "lakehouse_before_tuning": _lakehouse_before,
           "lakehouse_cluster": _lakehouse_cluster, "hudi_sink": _hudi_sink, "parquet": _parquet}


def run(events: int, seed: int, contenders: tuple[str, ...] = CONTENDERS,
        overrides: Path | None = None) -> dict[str, Any]:
    """Produce the backlog once, let each contender consume all of it, report records/s and ratios."""
    work = bench_dir() / "ingest"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = {"LAKEHOUSE_HUDI_OVERRIDES": str(overrides)} if overrides else {}
    with broker("ingest") as node:
        backlog: Backlog = produce_backlog(node.bootstrap, events, seed)
        say(f"backlog: {backlog.records:,} Kafka records ({backlog.events:,} row events) "
            f"in {backlog.seconds:.0f}s")
        expected = {t: len(backlog.source.state[t]) for t in contract.TABLES}
        results: dict[str, dict[str, Any]] = {}
        for name in contenders:
            say(f"{name}: consuming the backlog")
            result = RUNNERS[name](work, node.bootstrap, env)
            result["records_per_second"] = round(backlog.records / result["seconds"])
            if "rows" in result:
                result["rows_match_source"] = result["rows"] == expected
            results[name] = result
            say(f"{name}: {result['seconds']:.1f}s, {result['records_per_second']:,} records/s")
    ratios = {}
    if "lakehouse" in results:
        for other in ("lakehouse_before_tuning", "lakehouse_cluster", "hudi_sink", "parquet"):
            if other in results:
                ratios[f"lakehouse_vs_{other}"] = round(
                    results["lakehouse"]["records_per_second"] / results[other]["records_per_second"], 2)
    figures = {"backlog": backlog.as_dict(), "expected_live_rows": expected, "contenders": results,
               "ratios": ratios, "overrides": str(overrides) if overrides else None}
    save("ingest", figures)
    bar_chart(bench_dir() / "ingest.png", f"Catch-up of {backlog.records:,} Kafka records",
              {n: r["records_per_second"] for n, r in results.items()}, "records/s")
    return figures


def report(figures: dict[str, Any]) -> str:
    rows = [{"writer": n, "seconds": f"{r['seconds']:.1f}", "records/s": f"{r['records_per_second']:,}",
             "live rows match source": {True: "yes", False: "NO", None: "n/a"}[r.get("rows_match_source")]}
            for n, r in figures["contenders"].items()]
    ratios = ", ".join(f"{k} = {v}" for k, v in figures["ratios"].items())
    return table(rows, ["writer", "seconds", "records/s", "live rows match source"]) + f"\n{ratios}" + \
        _where_the_cluster_spends(figures["contenders"])


def _where_the_cluster_spends(contenders: dict[str, Any]) -> str:
    """The phases of a batch in local mode and on the cluster side by side, and the cluster's task time."""
    if "lakehouse_cluster" not in contenders:
        return ""
    on, tasks = contenders["lakehouse_cluster"], contenders["lakehouse_cluster"]["cluster_tasks"]
    local = contenders.get("lakehouse", {}).get("phases_s", {})
    phases = " ".join(f"{k}={local.get(k, '-')}/{v}" for k, v in on["phases_s"].items())
    spent = " ".join(f"{k}={v}" for k, v in tasks["task_seconds"].items())
    return (f"\nphases, local[2]/cluster (s, summed over batches): {phases}"
            f"\ncluster tasks: {tasks['tasks']} ({tasks['failed_tasks']} failed), per executor "
            f"{tasks['tasks_per_executor']}; task seconds: {spent}; shuffle read {tasks['shuffle_mb']} MB")
