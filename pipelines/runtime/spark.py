"""One way to get a SparkSession with Hudi, for every command and test.

The target (`LAKEHOUSE_TARGET`: local | emr) decides where the jars come from: the
project's resolved `.jvm/spark` folder locally, the cluster's own Hudi bundle on EMR.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

from pyspark import SparkContext
from pyspark.sql import SparkSession

from pipelines.lake.declaration import Declaration
from pipelines.lake.jvm import jvm_of
from pipelines.runtime import console
from pipelines.runtime.code_archive import write_archive
from pipelines.runtime.declared import read_declaration
from pipelines.runtime.local_process import process_started
from pipelines.runtime.spark_conf import cluster_master, event_log_dir, spark_conf

log = logging.getLogger(__name__)


def get_spark(app_name: str = "lakehouse", conf: dict[str, str] | None = None,
              declaration: Declaration | None = None) -> SparkSession:
    """The process's SparkSession (created on first call with the target's options, then `conf`).

    On a local standalone cluster the executors get the project's code with `declaration` (pipelines.runtime.lake
    passes its own; None: the configuration's, `read_declaration`).
    """
    started = time.monotonic()
    on_cluster = cluster_master() is not None and SparkContext._active_spark_context is None
    if on_cluster:
        event_log_dir().mkdir(parents=True, exist_ok=True)  # Spark refuses to start without it
    builder = SparkSession.builder.appName(app_name)
    options = {**spark_conf(), **(conf or {})}
    if lineage_file := options.get("spark.openlineage.transport.location"):
        # OpenLineage's file transport appends to the file but does not make its folder.
        Path(lineage_file).parent.mkdir(parents=True, exist_ok=True)
    for key, value in options.items():
        builder = builder.config(key, value)
    if on_cluster:
        # PySpark tells executors which interpreter to run from PYSPARK_PYTHON, not from
        # spark.pyspark.python (spark-submit turns one into the other; a session started from Python
        # does not): without it the executors run the workers' `python3`, not the driver's.
        os.environ["PYSPARK_PYTHON"] = options["spark.pyspark.python"]
    if SparkContext._active_spark_context is not None:  # the session exists: `conf` is set on it
        return builder.getOrCreate()
    if "PYSPARK_GATEWAY_PORT" in os.environ:
        # Under spark-submit the JVM is already up (our parent): its output is redirected before
        # the SparkContext starts, so that the context's own start-up logs go to the file too.
        SparkContext._ensure_initialized()
        console.redirect_submitted_jvm(SparkContext._jvm)
        spark = builder.getOrCreate()
    else:
        with console.jvm_output():
            spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    no_local_checksums(spark)
    if on_cluster:
        ship_code(spark, declaration or read_declaration())
    if folder := spark.conf.get("spark.checkpoint.dir", None):
        use_checkpoint_dir(spark, folder)
    if (path := console.log_file()) is not None:
        log.info("Spark started in %.1f s; Spark, Hudi and library logs: %s", time.monotonic() - started, path)
    return spark


def ship_code(spark: SparkSession, declaration: Declaration) -> Path:
    """Send the executors the project's code as the EMR target does: the bundle of `lakehouse package`.

    Spark copies it into each executor's folder and puts it first on its Python path. No job of
    the pipeline runs Python on an executor today (every transformation is Spark SQL), so this is
    what keeps a Python function that one ships importable there, from the same code as the driver.
    """
    folder = Path(tempfile.mkdtemp(prefix="lakehouse-code-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    archive = write_archive(folder / "lakehouse.zip", declaration)
    spark.sparkContext.addPyFile(str(archive))
    return archive


def use_checkpoint_dir(spark: SparkSession, folder: str) -> None:
    """Give the session a checkpoint folder of its own below `folder` (spark.toml [cluster], [emr]).

    A local folder (one machine's cluster) is named by this process, removed when it exits, and
    those of processes no longer running are removed now: a SIGKILLed job leaves its checkpoints,
    rows of the lake's tables, behind. Elsewhere (HDFS on EMR) Spark names the folder and its
    ContextCleaner removes what the job no longer references.
    """
    if "://" in folder and not folder.startswith("file:"):
        spark.sparkContext.setCheckpointDir(folder)
        return
    base = Path(folder.removeprefix("file://").removeprefix("file:"))
    base.mkdir(parents=True, exist_ok=True)
    for other in base.iterdir():
        pid, _, started = other.name.partition("-")
        if pid.isdigit() and str(process_started(int(pid))) != started:
            shutil.rmtree(other, ignore_errors=True)
    mine = base / f"{os.getpid()}-{process_started(os.getpid())}"
    atexit.register(shutil.rmtree, mine, ignore_errors=True)
    spark.sparkContext.setCheckpointDir(str(mine))


def no_local_checksums(spark: SparkSession) -> None:
    """Turn off Hadoop's `.crc` side files on the local file system, for writing and for reading.

    Hadoop writes a file on a local disk and its checksum file as two streams flushed apart, and
    refuses to read a file whose checksum file disagrees with it. A SIGKILL between the two
    flushes can leave a whole Hudi commit file beside a short `.crc`, and the table is then
    unreadable for good: a short `.crc` of one completed bronze commit makes every read fail
    ("Failed to fetch HoodieCommitMetadata"), which no repair of cut timeline files can see.
    Nothing of the lake relies on these checksums (an object store has none; Hudi's files carry
    their own). Set on the JVM's cached local file system, which Hudi, Spark's writers and the
    local-mode tasks all share (checked: no `.crc` file in a lake after ingest and etl).
    """
    jvm = jvm_of(spark.sparkContext)
    local = jvm.org.apache.hadoop.fs.FileSystem.getLocal(spark.sparkContext._jsc.hadoopConfiguration())
    local.setWriteChecksum(False)
    local.setVerifyChecksum(False)
