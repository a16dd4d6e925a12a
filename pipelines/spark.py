"""One way to get a SparkSession with Hudi, for every command and test.

The target (`LAKEHOUSE_TARGET`: local | emr) decides where the jars come from: the
project's resolved `.jvm/spark` folder locally, the cluster's own Hudi bundle on EMR.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

import hudi_configs
from pipelines.settings import jvm_dir

TARGETS = ("local", "emr")


def target() -> str:
    value = os.environ.get("LAKEHOUSE_TARGET", "local")
    if value not in TARGETS:
        raise ValueError(f"LAKEHOUSE_TARGET={value!r}: expected one of {', '.join(TARGETS)}")
    return value


def spark_conf(for_target: str | None = None) -> dict[str, str]:
    """The session options of a target: [common] then [<target>] of hudi_configs/spark.toml."""
    name = for_target or target()
    conf = {**hudi_configs.section("spark", "common"), **hudi_configs.section("spark", name)}
    if name == "local":
        jars = sorted((jvm_dir() / "spark").glob("*.jar"))
        if not jars:
            raise RuntimeError(
                f"no Spark jars in {jvm_dir() / 'spark'}: run `make setup` to resolve jvm/pom.xml"
            )
        # On the JVM's own class path, not `spark.jars`: Avro resolves Hudi's generated record
        # classes through the application class loader, and with the bundle in Spark's child
        # loader reading a metadata-table log with a delete block failed with a
        # ClassCastException (GenericData$Record -> HoodieDeleteRecord). Local mode: one JVM.
        conf["spark.driver.extraClassPath"] = os.pathsep.join(str(j) for j in jars)
        log_config = Path(hudi_configs.__file__).with_name("log4j2.properties")
        conf["spark.driver.extraJavaOptions"] = (
            f"{conf.get('spark.driver.extraJavaOptions', '')} -Dlog4j2.configurationFile={log_config}").strip()
    return conf


def get_spark(app_name: str = "lakehouse") -> SparkSession:
    """The process's SparkSession (created on first call with the target's options)."""
    builder = SparkSession.builder.appName(app_name)
    for key, value in spark_conf().items():
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
