"""The Spark session options of each target (pure Python: Airflow's environment, without pyspark,
renders jobs' spark-submit lines from them, and every local session starts with them).

The local target puts the jars `make setup` resolved on the driver's class path and maps the
driver JVM's class archive (pipelines/deploy/jvm_archive.py writes it) when it exists.
"""

from __future__ import annotations

import os
from pathlib import Path

import hudi_configs
from pipelines.settings import jvm_dir

# Unified-logging tags the JDK warns under when an archive cannot be mapped.
QUIET_CDS = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def archive_path() -> Path:
    """Where `make setup` writes the archive (beside the jars it was made for)."""
    return jvm_dir() / "spark.jsa"


def archive_java_options() -> str:
    """Driver JVM options that map the archive; empty when there is none (before `make setup`)."""
    path = archive_path()
    return f"-XX:SharedArchiveFile={path} {QUIET_CDS}" if path.is_file() else ""


def spark_conf(for_target: str | None = None) -> dict[str, str]:
    """The session options of a target: [common] then [<target>] of hudi_configs/spark.toml."""
    name = for_target or hudi_configs.target()
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
        conf["spark.driver.extraJavaOptions"] = " ".join(filter(None, (
            conf.get("spark.driver.extraJavaOptions"), f"-Dlog4j2.configurationFile={log_config}",
            archive_java_options())))
    return conf
