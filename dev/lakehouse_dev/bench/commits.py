"""What one Hudi commit of a bronze batch costs, and which writer options change it.

A bronze batch is a handful of commits, and at a freshness of seconds their fixed cost is
most of the batch. This measures, in one process and one JVM, the wall time of a commit of
`--rows` rows to a table configured as bronze main (merge-on-read, bucket index) and as the
change log (copy-on-write, bulk insert), with the project's options and with one option
changed at a time:

- `timeline_server_off`: no embedded timeline server (each write client starts one, and
  the executors ask it for the file system view and markers);
- `timeline_server_markers`: markers batched into files by the timeline server, as on an object
  store (on a local disk the project writes direct markers, one empty file per data file:
  hudi_configs/storage.toml);
- `no_auto_clean` / `no_auto_archive`: the clean and archival checks every commit runs;
- `clean_every_10_commits`: the clean planned every 10th commit instead of every commit;
- `metadata_table`: with a metadata table (files partition only), which bronze goes without
  (hudi_configs/bronze.toml): its own delta commit inside every commit.

Each variant writes its own table: `--warm-up` commits, then `--commits` measured ones;
the median is the figure. Run: `lakehouse dev bench commits --help`.
"""

from __future__ import annotations

import shutil
import statistics
import time
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import hudi_configs
from lakehouse_dev.bench.common import bench_dir, save, say, table
from lakehouse_dev.bench.plots import grouped_bars

VARIANTS: dict[str, dict[str, str]] = {
    "project": {},
    "timeline_server_off": {"hoodie.embed.timeline.server": "false"},
    "timeline_server_markers": {"hoodie.write.markers.type": "TIMELINE_SERVER_BASED"},
    "no_auto_clean": {"hoodie.clean.automatic": "false"},
    "clean_every_10_commits": {"hoodie.clean.max.commits": "10"},
    "no_auto_archive": {"hoodie.archive.automatic": "false"},
    "metadata_table": {"hoodie.metadata.enable": "true"},
}
PARTS = {"main": ("table", "bronze_bench_main"), "changelog": ("changelog", "bronze_bench_changelog")}


def _rows(spark: SparkSession, rows: int, commit: int) -> DataFrame:
    """Order-shaped bronze rows; every commit updates the same keys with a newer `_lsn` (main) or adds rows (log)."""
    return spark.range(rows).select(
        F.col("id"), (F.col("id") % 5000).alias("customer_id"), F.lit("paid").alias("status"),
        F.lit("12.50").alias("amount"), F.lit("EUR").alias("currency"),
        F.lit("2026-03-01T10:15:30.123456Z").alias("created_at"),
        F.lit("2026-03-01T10:15:30.123456Z").alias("updated_at"),
        F.lit("u").alias("_op"), (F.col("id") + commit * rows).alias("_lsn"), F.current_timestamp().alias("_source_ts"),
        F.lit(1).cast("long").alias("_tx_id"), F.lit(0).alias("_kafka_partition"),
        (F.col("id") + commit * rows).alias("_kafka_offset"), F.current_timestamp().alias("_kafka_ts"),
        F.current_timestamp().alias("_ingested_at"), F.lit(False).alias("_hoodie_is_deleted"),
        F.date_format(F.current_timestamp(), "yyyy-MM-dd").alias("_ingest_date"),
    )


def _options(part: str, variant: str) -> dict[str, str]:
    section, name = PARTS[part]
    return {**hudi_configs.writer("bronze", section), "hoodie.table.name": name,
            "hoodie.datasource.write.recordkey.field": hudi_configs.section("bronze", section).get(
                "hoodie.datasource.write.recordkey.field", "id"), **VARIANTS[variant]}


def run(rows: int, warm_up: int, commits: int, variants: tuple[str, ...]) -> dict[str, Any]:
    """Median commit time per table kind and variant, measured in this process.

    The variants take turns, commit by commit, so that none gains from a JVM the others warmed up.
    """
    from pipelines.runtime.spark import get_spark

    spark = get_spark("lakehouse-bench-commits")
    shutil.rmtree(bench_dir() / "commits", ignore_errors=True)
    times: dict[tuple[str, str], list[float]] = {(p, v): [] for p in PARTS for v in variants}
    for i in range(warm_up + commits):
        say(f"round {i + 1} of {warm_up + commits} ({'warm-up' if i < warm_up else 'measured'}): "
            f"one commit of {rows:,} rows per table kind and variant")
        for part in PARTS:
            frame = _rows(spark, rows, i)
            if part == "changelog":
                frame = frame.drop("_hoodie_is_deleted")
            for variant in variants:
                path = str(bench_dir() / "commits" / f"{part}-{variant}")
                started = time.monotonic()
                frame.write.format("hudi").options(**_options(part, variant)).mode("append").save(path)
                if i >= warm_up:
                    times[part, variant].append(time.monotonic() - started)
    results: dict[str, dict[str, Any]] = {}
    for (part, variant), seconds in times.items():
        results.setdefault(part, {})[variant] = {
            "median_s": round(statistics.median(seconds), 3), "min_s": round(min(seconds), 3),
            "max_s": round(max(seconds), 3)}
    figures = {"rows_per_commit": rows, "warm_up": warm_up, "commits": commits, "results": results}
    save("commits", figures)
    grouped_bars(bench_dir() / "commits.png", f"One commit of {rows:,} rows (median)", list(variants),
                 {part: [results[part][v]["median_s"] for v in variants] for part in PARTS}, "seconds")
    return figures


def report(figures: dict[str, Any]) -> str:
    results = figures["results"]
    variants = list(next(iter(results.values())))
    rows = []
    for variant in variants:
        row = {"variant": variant}
        for part, by_variant in results.items():
            base = by_variant["project"]["median_s"] if "project" in by_variant else None
            cell = by_variant[variant]
            ratio = f" ({cell['median_s'] / base:.2f}x)" if base else ""
            row[f"{part} median s"] = f"{cell['median_s']:.2f}{ratio}"
        rows.append(row)
    return table(rows, ["variant", *[f"{p} median s" for p in results]])
