"""A class-data-sharing (AppCDS) archive of the local driver JVM: every local job starts sooner.

Each `lakehouse` command, each Airflow task's spark-submit and each restart of the ingest
stream starts a JVM that loads, parses and verifies the same tens of thousands of Spark and
Hudi classes before its first commit. The JDK can keep them parsed and verified in one
memory-mapped file: `-XX:ArchiveClassesAtExit` writes it when a JVM that ran the usual work
exits, `-XX:SharedArchiveFile` maps it at the next start. `make setup` writes it once
(`python -m pipelines.deploy.jvm_archive`) from a short Hudi write and read with the project's own
options, and `pipelines.runtime.spark_conf.spark_conf` adds it to every local session once it exists.

The archive is only an optimisation. A JVM of another JDK build, or with another class
path (the jars of `.jvm/spark` changed), cannot map it and starts without it, as it would
with no archive; its warning is silenced (`-Xlog:cds=off`). `make setup` writes it again
whenever the resolved jars change.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from pipelines.errors import SetupError
from pipelines.lake.catalog import bronze_options, keyed_options, silver_options
from pipelines.lake.jvm import driver_gateway
from pipelines.runtime.spark import get_spark
from pipelines.runtime.spark_conf import QUIET_CDS, archive_path, spark_conf


def _warm_up(where: Path, dump: Path) -> None:
    """A small bronze (merge-on-read, bucket index) and silver (copy-on-write, record index, CDC) upsert and read."""
    from pyspark.sql import functions as F

    from pipelines.runtime.hudi_writes import save

    # The session every local job gets, its JVM writing the archive at exit. Quiet: the dump
    # names every class it cannot keep (generated or signed ones), by design.
    java = spark_conf()["spark.driver.extraJavaOptions"]
    spark = get_spark("lakehouse-jvm-archive",
                      {"spark.driver.extraJavaOptions": f"{java} -XX:ArchiveClassesAtExit={dump} {QUIET_CDS}"})
    rows = spark.range(200).select(F.col("id"), F.concat(F.lit("x"), F.col("id").cast("string")).alias("email"),
                                   F.col("id").alias("_lsn"), F.lit(False).alias("_hoodie_is_deleted"))
    for options, path in ((bronze_options("table", "warm_bronze", **keyed_options(("id",))), where / "bronze"),
                          (silver_options("warm_silver"), where / "silver")):
        for _ in range(2):  # a first commit, then an update of the same keys
            save(rows, str(path), options)
            rows = rows.withColumn("_lsn", F.col("_lsn") + 1)
        spark.read.format("hudi").load(str(path)).filter("id < 10").collect()
    spark.read.format("hudi").option("hoodie.datasource.query.type", "incremental") \
        .option("hoodie.datasource.read.begin.instanttime", "0") \
        .option("hoodie.datasource.query.incremental.format", "cdc").load(str(where / "silver")).count()
    spark.stop()


def build(target: Path) -> None:
    """Run the warm-up in a driver JVM that writes `target` as it exits; wait for the file."""
    target.unlink(missing_ok=True)
    partial = target.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    work = Path(tempfile.mkdtemp(prefix="jvm-archive-"))
    try:
        _warm_up(work, partial)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    # pyspark's driver JVM exits when its standard input closes, and writes the archive then.
    gateway = driver_gateway()
    gateway.shutdown()
    gateway.proc.stdin.close()
    gateway.proc.wait(timeout=600)
    if not partial.is_file():
        raise SetupError(f"the driver JVM wrote no archive at {partial}")
    partial.rename(target)


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(prog="python -m pipelines.deploy.jvm_archive", description=__doc__.splitlines()[0],
                            epilog=f"Writes {archive_path()} (LAKEHOUSE_JVM_DIR moves it).").parse_args(argv)
    try:
        build(archive_path())
    except SetupError as exc:
        raise SystemExit(str(exc)) from exc
    print(f"JVM class archive: {archive_path()}", file=sys.stderr)


if __name__ == "__main__":
    main()
