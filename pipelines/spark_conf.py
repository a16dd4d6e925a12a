"""The Spark session options of each target (pure Python: Airflow's environment, without pyspark,
renders jobs' spark-submit lines from them, and every local session starts with them).

The local target puts the jars `make setup` resolved on the driver's class path and maps the
driver JVM's class archive (pipelines/deploy/jvm_archive.py writes it) when it exists.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from urllib.parse import urlparse

import hudi_configs
from pipelines.settings import jvm_dir, log_dir

MASTER_VARIABLE = "LAKEHOUSE_SPARK_MASTER"
# What executors must see of the driver's environment: S3A resolves the store's endpoint, region
# and credentials (spark.toml [local]: ${env.AWS_...}) in the JVM that opens the file, and on a
# cluster that is the executor's, started by a worker that knows none of them. TZ: timestamps are
# turned into and from wall-clock values in the executors' zone as in the driver's. Spark redacts
# the secret from its UI and event log (spark.redaction.regex).
EXECUTOR_ENV = ("AWS_ENDPOINT_URL", "AWS_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "TZ")

# Unified-logging tags the JDK warns under when an archive cannot be mapped.
QUIET_CDS = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def archive_path() -> Path:
    """Where `make setup` writes the archive (beside the jars it was made for)."""
    return jvm_dir() / "spark.jsa"


def archive_java_options() -> str:
    """Driver JVM options that map the archive; empty when there is none (before `make setup`)."""
    path = archive_path()
    return f"-XX:SharedArchiveFile={path} {QUIET_CDS}" if path.is_file() else ""


def cluster_master() -> str | None:
    """`LAKEHOUSE_SPARK_MASTER`: a standalone master (spark://host:port) every local job runs on; None: local[2]."""
    master = os.environ.get(MASTER_VARIABLE) or None
    if master is not None and not master.startswith("spark://"):
        raise ValueError(f"{MASTER_VARIABLE}={master!r}: expected a standalone master, spark://host:port")
    return master


def event_log_dir() -> Path:
    """Where applications on the cluster keep their event logs: `spark-events/` in the log folder."""
    return log_dir() / "spark-events"


def spark_conf(for_target: str | None = None) -> dict[str, str]:
    """The session options of a target: [common] then [<target>] of hudi_configs/spark.toml.

    The local target on a cluster (LAKEHOUSE_SPARK_MASTER) adds [cluster] and `cluster_conf`.
    """
    name = for_target or hudi_configs.target()
    conf = {**hudi_configs.section("spark", "common"), **hudi_configs.section("spark", name)}
    master = cluster_master() if name == "local" else None
    if master is not None:
        conf |= hudi_configs.section("spark", "cluster")
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
        if master is not None:
            conf |= cluster_conf(master, jars)
    return conf


def cluster_conf(master: str, jars: list[Path]) -> dict[str, str]:
    """What the executors of a standalone cluster need of this machine's files and environment.

    The jars go on the executors' JVM class path, as on the driver's and for the same reason
    (Avro's class loader, above); they are read where `make setup` put them, which on one
    machine is where every worker finds them, as EMR's nodes find the cluster's Hudi bundle in
    /usr/lib/hudi. The project's code reaches the executors' Python as the bundle of `lakehouse
    package` (pipelines/spark.py ships it), run by the interpreter pinned here: the driver's own,
    so both sides import the same versions of everything.
    """
    conf = {"spark.master": master,
            "spark.executor.extraClassPath": os.pathsep.join(str(j) for j in jars),
            "spark.pyspark.python": sys.executable,
            "spark.eventLog.dir": event_log_dir().as_uri()}
    # Executors call the driver (its block manager, Hudi's timeline server): on a master of this
    # machine they are here too, and the host name may resolve to an address nothing listens on.
    if urlparse(master).hostname in ("127.0.0.1", "localhost"):
        conf |= {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
    for key in EXECUTOR_ENV:
        if key in os.environ:
            conf[f"spark.executorEnv.{key}"] = os.environ[key]
    return conf
