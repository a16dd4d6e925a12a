"""One way to get a SparkSession with Hudi, for every command and test.

The target (`LAKEHOUSE_TARGET`: local | emr) decides where the jars come from: the
project's resolved `.jvm/spark` folder locally, the cluster's own Hudi bundle on EMR.
"""

from __future__ import annotations

import os

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
        conf["spark.jars"] = ",".join(str(j) for j in jars)
    return conf


def get_spark(app_name: str = "lakehouse") -> SparkSession:
    """The process's SparkSession (created on first call with the target's options)."""
    builder = SparkSession.builder.appName(app_name)
    for key, value in spark_conf().items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
