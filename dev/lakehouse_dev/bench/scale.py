"""Scale: the same size of batch applied to bronze tables of two sizes; its time must not grow.

For each size, on a private broker and a fresh lake:

1. the generator's snapshot of about N live rows (a quarter customers), ingested by
   `lakehouse ingest --once` in its own process, as in production;
2. in this process, the bronze batch writer of the ingest stream (`BronzeBatchWriter`, the
   stream's `foreachBatch` function) is handed batches read from Kafka by offsets:
   - a warm-up batch of changes: the writer's first batch of the stream, which reads what the
     tables hold once (`<table>.load_state`);
   - the **measured batch** of `--changes` change events: a running stream's batch;
   - the same number of changes once more, handed to a *new* writer: what a batch costs when it
     has to read the tables first, as every batch did before the writer kept what it read
     across batches (and as a restarted stream's first batch still does).

The figure is the measured batch's time at the larger size over its time at the smaller
(goal: at most 1.3). Bronze's live rows are then compared with the generator's own state:
a fast batch that gets the rows wrong is no figure. Run: `lakehouse dev bench scale --help`.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from typing import Any

from kafka import KafkaConsumer

from lakehouse_dev.bench.common import (
    DELETE_FRACTION,
    PARTITIONS,
    bench_dir,
    broker,
    lakehouse,
    produce_snapshot,
    save,
    say,
    table,
)
from lakehouse_dev.bench.plots import grouped_bars
from lakehouse_dev.generator.kafka import produce
from lakehouse_dev.generator.source import ShopSource
from lakehouse_dev.generator.values import WorkloadConfig
from pipelines.ingest.batch import BatchReport
from pipelines.ingest.writer import BronzeBatchWriter
from pipelines.lake import contract
from pipelines.lake.table_stats import table_stats
from pipelines.runtime.lake import Lake
from pipelines.runtime.settings import INGEST_TRIGGER_SECONDS

SIZES = (100_000, 2_000_000)
WARM_UP = 1_000


class _Reports(logging.Handler):
    """Collects the BatchReport lines the writer logs."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.reports: list[BatchReport] = []

    def emit(self, record: logging.LogRecord) -> None:
        if found := BatchReport.parse(record.getMessage()):
            self.reports.append(found)


def _end_offsets(bootstrap: str) -> dict[str, dict[str, int]]:
    from kafka import TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        parts = [TopicPartition(contract.topic(t), p) for t in contract.TABLES for p in range(PARTITIONS)]
        ends = consumer.end_offsets(parts)
    finally:
        consumer.close()
    found: dict[str, dict[str, int]] = {}
    for tp, offset in ends.items():
        found.setdefault(tp.topic, {})[str(tp.partition)] = offset
    return found


def _changes(source: ShopSource, bootstrap: str, changes: int, seed: int) -> int:
    cfg = WorkloadConfig(seed=seed, customers=0, orders=0, changes=changes, delete_fraction=DELETE_FRACTION)
    return produce(source.changes(cfg), bootstrap)


def _batch(spark, writer: BronzeBatchWriter, bootstrap: str, start: dict, end: dict, batch_id: int,
           reports: _Reports) -> dict[str, Any]:
    """Hand the writer the records between two sets of end offsets, as the stream would; time it."""
    frame = (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", ",".join(contract.topic(t) for t in contract.TABLES))
             .option("startingOffsets", json.dumps(start)).option("endingOffsets", json.dumps(end)).load())
    started = time.monotonic()
    writer(frame, batch_id)
    seconds = time.monotonic() - started
    report = reports.reports[-1]
    return {"seconds": round(seconds, 2), "records": report.records, "phases_s": report.phases,
            "counts": report.counts}


def _writer(spark, root: str) -> BronzeBatchWriter:
    """A started writer that commits every table each batch (the batches here are the stream's, without its cadence)."""
    writer = BronzeBatchWriter(Lake.at(root, spark), trigger_seconds=INGEST_TRIGGER_SECONDS, eager=True)
    writer.start()
    return writer


def _one_size(spark, rows: int, changes: int, seed: int, reports: _Reports) -> dict[str, Any]:
    work = bench_dir() / "scale" / f"{rows}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    root = str(work / "lake")
    with broker(f"scale-{rows}", sinks=("kafka",)) as node:
        source = ShopSource(seed)
        started = time.monotonic()
        sent = produce_snapshot(source, node.bootstrap, rows, seed)
        say(f"{rows:,} rows: {sent:,} records produced in {time.monotonic() - started:.0f}s; ingesting them")
        build = lakehouse("ingest", "--once", env={"LAKEHOUSE_ROOT": root, "KAFKA_BOOTSTRAP_SERVERS": node.bootstrap},
                          log=work / "build.log", timeout=4 * 3600)
        say(f"{rows:,} rows: bronze built in {build:.0f}s")
        marks = [_end_offsets(node.bootstrap)]
        for count in (WARM_UP, changes, changes, changes):
            _changes(source, node.bootstrap, count, seed)
            marks.append(_end_offsets(node.bootstrap))
        writer = _writer(spark, root)
        warm_up = _batch(spark, writer, node.bootstrap, marks[0], marks[1], 1_000_000, reports)
        say(f"{rows:,} rows: warm-up batch {warm_up['seconds']}s (reads the tables once)")
        measured = _batch(spark, writer, node.bootstrap, marks[1], marks[2], 1_000_001, reports)
        say(f"{rows:,} rows: measured batch {measured['seconds']}s")
        writer.parallel = False
        sequential = _batch(spark, writer, node.bootstrap, marks[2], marks[3], 1_000_002, reports)
        say(f"{rows:,} rows: the same size of batch, tables one after the other {sequential['seconds']}s")
        writer.flush()  # as a stopping stream does: the new writer has no held dead letters to read again
        fresh = _batch(spark, _writer(spark, root), node.bootstrap, marks[3], marks[4],
                       1_000_003, reports)
        say(f"{rows:,} rows: the same size of batch on a new writer {fresh['seconds']}s")
        live = {t: table_stats(f"{root}/bronze/{t}").rows for t in contract.TABLES}
        expected = {t: len(source.state[t]) for t in contract.TABLES}
    return {"rows": rows, "build_seconds": round(build, 1), "warm_up": warm_up, "measured": measured,
            "tables_one_after_the_other": sequential, "new_writer": fresh, "live_rows": live,
            "live_rows_match_source": live == expected}


def run(sizes: tuple[int, ...], changes: int, seed: int) -> dict[str, Any]:
    """Build each size of lake, time the same size of batch on each; the ratio of the largest to the smallest."""
    from pipelines.runtime.spark import get_spark

    spark = get_spark("lakehouse-bench-scale")
    reports = _Reports()
    logging.getLogger("pipelines.ingest.writer").addHandler(reports)
    logging.getLogger("pipelines.ingest.writer").setLevel(logging.INFO)
    results = [_one_size(spark, rows, changes, seed, reports) for rows in sorted(sizes)]
    small, large = results[0], results[-1]
    figures = {
        "changes_per_batch": changes, "sizes": results,
        "ratio_measured": round(large["measured"]["seconds"] / small["measured"]["seconds"], 2),
        "ratio_new_writer": round(large["new_writer"]["seconds"] / small["new_writer"]["seconds"], 2),
    }
    save("scale", figures)
    grouped_bars(bench_dir() / "scale.png", f"A batch of {changes:,} changes against bronze size",
                 [f"{r['rows']:,} rows" for r in results],
                 {"running stream": [r["measured"]["seconds"] for r in results],
                  "new writer (reads the tables first)": [r["new_writer"]["seconds"] for r in results]}, "seconds")
    return figures


def report(figures: dict[str, Any]) -> str:
    rows = [{"bronze rows": f"{r['rows']:,}", "build s": r["build_seconds"],
             "batch s (running stream)": r["measured"]["seconds"],
             "batch s (tables one after the other)": r["tables_one_after_the_other"]["seconds"],
             "batch s (new writer)": r["new_writer"]["seconds"],
             "of which reading the tables": round(sum(v for k, v in r["new_writer"]["phases_s"].items()
                                                      if k.endswith("load_state")), 1),
             "rows match source": "yes" if r["live_rows_match_source"] else "NO"} for r in figures["sizes"]]
    columns = ["bronze rows", "build s", "batch s (running stream)", "batch s (tables one after the other)",
               "batch s (new writer)",
               "of which reading the tables", "rows match source"]
    return (table(rows, columns) + f"\nratio largest/smallest: running stream {figures['ratio_measured']} "
            f"(goal <= 1.3), new writer {figures['ratio_new_writer']}")
