"""One way to get a SparkSession with Hudi, for every command and test.

The target (`LAKEHOUSE_TARGET`: local | emr) decides where the jars come from: the
project's resolved `.jvm/spark` folder locally, the cluster's own Hudi bundle on EMR.
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

from pipelines.jobs import spark_conf


def get_spark(app_name: str = "lakehouse", conf: dict[str, str] | None = None) -> SparkSession:
    """The process's SparkSession (created on first call with the target's options, then `conf`)."""
    builder = SparkSession.builder.appName(app_name)
    for key, value in {**spark_conf(), **(conf or {})}.items():
        builder = builder.config(key, value)
    # The local driver JVM inherits this process's stdout, and libraries inside it (JOL in the
    # Hudi bundle) print there. Start it with stdout on stderr: stdout is the CLI's output.
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        spark = builder.getOrCreate()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    spark.sparkContext.setLogLevel("WARN")
    return spark
