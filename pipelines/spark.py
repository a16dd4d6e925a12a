"""One way to get a SparkSession with Hudi, for every command and test.

The target (`LAKEHOUSE_TARGET`: local | emr) decides where the jars come from: the
project's resolved `.jvm/spark` folder locally, the cluster's own Hudi bundle on EMR.
"""

from __future__ import annotations

import logging
import os
import time

from pyspark import SparkContext
from pyspark.sql import SparkSession

from pipelines import console
from pipelines.jobs import spark_conf

log = logging.getLogger(__name__)


def get_spark(app_name: str = "lakehouse", conf: dict[str, str] | None = None) -> SparkSession:
    """The process's SparkSession (created on first call with the target's options, then `conf`)."""
    started = time.monotonic()
    builder = SparkSession.builder.appName(app_name)
    for key, value in {**spark_conf(), **(conf or {})}.items():
        builder = builder.config(key, value)
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
    if (path := console.log_file()) is not None:
        log.info("Spark started in %.1f s; Spark, Hudi and library logs: %s", time.monotonic() - started, path)
    return spark
