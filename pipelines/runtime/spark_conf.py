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
from pipelines.errors import SettingError, SetupError
from pipelines.runtime.settings import jvm_dir, lineage_dir, log_dir

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
        raise SettingError(f"{MASTER_VARIABLE}={master!r}: expected a standalone master, spark://host:port")
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
    conf = _with_lineage(conf, name)
    if name == "local":
        jars = sorted((jvm_dir() / "spark").glob("*.jar"))
        if not jars:
            raise SetupError(f"no Spark jars in {jvm_dir() / 'spark'}: run `make setup` to resolve jvm/pom.xml")
        # On the JVM's own class path, not `spark.jars`: Avro resolves Hudi's generated record
        # classes through the application class loader, and with the bundle in Spark's child
        # loader reading a metadata-table log with a delete block fails with a
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
    package` (pipelines/runtime/spark.py ships it), run by the interpreter pinned here: the driver's own,
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


# What an Airflow task tells the job it starts (dags/lakehouse_common.py renders them from the OpenLineage
# provider's macros): the task's run as the parent of the Spark application's run, and the DAG run's as
# its root, each `namespace/job name/run id`.
PARENT_VARIABLE = "LAKEHOUSE_LINEAGE_PARENT"
ROOT_PARENT_VARIABLE = "LAKEHOUSE_LINEAGE_ROOT_PARENT"


def _with_lineage(conf: dict[str, str], target: str) -> dict[str, str]:
    """`conf` with the OpenLineage listener and its options (spark.toml [lineage], [lineage_emr]) when enabled.

    Added here and not in [common] because three things depend on where the job runs: the jars to
    fetch on EMR (appended to the target's own `spark.jars.packages`), the file the local transport
    appends to (under the log folder, unless the options name one), and the parent run an Airflow
    task hands its job through the environment.
    """
    options = hudi_configs.section("spark", "lineage")
    if options.pop("enabled", "true") != "true":
        return conf
    if target == "emr":
        emr = hudi_configs.section("spark", "lineage_emr")
        packages = [p for p in (conf.get("spark.jars.packages"), emr.pop("spark.jars.packages", None)) if p]
        options |= emr | {"spark.jars.packages": ",".join(packages)}
    if options.get("spark.openlineage.transport.type") == "file":
        options.setdefault("spark.openlineage.transport.location", str(lineage_dir() / "spark.jsonl"))
    for variable, prefix in ((PARENT_VARIABLE, "parent"), (ROOT_PARENT_VARIABLE, "rootParent")):
        if parent := os.environ.get(variable):
            options |= _parent_options(variable, parent, prefix)
    return conf | options


def _parent_options(variable: str, value: str, prefix: str) -> dict[str, str]:
    """`namespace/job/run id` (the provider's `lineage_parent_id` macro) as the listener's parent options.

    The job name may hold slashes of its own (`dag.task` does not, a namespace may not): split at the
    first and the last.
    """
    namespace, _, rest = value.partition("/")
    job, _, run_id = rest.rpartition("/")
    if not (namespace and job and run_id):
        raise SettingError(f"{variable}={value!r}: expected namespace/job name/run id")
    return {f"spark.openlineage.{prefix}JobNamespace": namespace, f"spark.openlineage.{prefix}JobName": job,
            f"spark.openlineage.{prefix}RunId": run_id}
