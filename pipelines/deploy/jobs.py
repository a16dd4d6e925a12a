"""Spark jobs as data: one description, submitted locally or as an Amazon EMR step.

Pure Python (no pyspark): Airflow's environment imports it to build its tasks. A job is
a `lakehouse` CLI command; the target decides only how it is submitted:

- local: `spark-submit` of the project's CLI in the project's environment (.venv), with
  the jars `make setup` resolved and the options of hudi_configs/spark.toml;
- emr: a `command-runner.jar` step running `spark-submit --deploy-mode cluster` of the
  same CLI on the cluster, with the cluster's own Hudi bundle (spark.toml [emr]).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from pipelines.runtime.settings import PROJECT_ROOT, spark_home
from pipelines.runtime.spark_conf import spark_conf

MSK_IAM_JAR = "aws-msk-iam-auth.jar"  # in the EMR bundle (pipelines/deploy/package.py)

# Environment variables every job receives (on EMR as YARN application-master and executor env).
# The erasure key travels as a file path or a secret's name only, never itself: step arguments
# are visible in the EMR console.
# LAKEHOUSE_TABLES names a file of this machine: EMR jobs read the declaration the bundle carries instead
# (pipelines/deploy/package.py).
# LAKEHOUSE_SPARK_MASTER is a standalone master of the local target: on EMR, YARN is the master.
# LAKEHOUSE_METASTORE_URI is the local target's Hive Metastore: on EMR, the writers sync to Glue.
# LAKEHOUSE_PUSHGATEWAY: where the jobs (and Hudi's reporter in their writers) push their metrics.
JOB_ENV = ("LAKEHOUSE_ROOT", "KAFKA_BOOTSTRAP_SERVERS", "LAKEHOUSE_TABLE_SERVICES", "LAKEHOUSE_HUDI_OVERRIDES",
           "LAKEHOUSE_ERASURE_KEY_FILE", "LAKEHOUSE_ERASURE_KEY_SECRET", "LAKEHOUSE_GDPR_INBOX", "LAKEHOUSE_LOG_DIR",
           "LAKEHOUSE_TABLES", "LAKEHOUSE_SPARK_MASTER", "LAKEHOUSE_METASTORE_URI", "LAKEHOUSE_PUSHGATEWAY",
           "LAKEHOUSE_LINEAGE_DIR", "LAKEHOUSE_CONFIG", "LAKEHOUSE_PROFILE")
# LAKEHOUSE_CONFIG names the configuration file of this machine (pipelines/runtime/config.py), as LAKEHOUSE_TABLES.
# LAKEHOUSE_LINEAGE_DIR is where the local OpenLineage file transport appends: EMR's jobs report to the console.
# LAKEHOUSE_PROFILE too: the bundle's configuration is the chosen profile's, written out without profiles.
LOCAL_ONLY_ENV = ("LAKEHOUSE_TABLES", "LAKEHOUSE_SPARK_MASTER", "LAKEHOUSE_METASTORE_URI", "LAKEHOUSE_LINEAGE_DIR",
                  "LAKEHOUSE_CONFIG", "LAKEHOUSE_PROFILE")


@dataclass(frozen=True)
class SparkJob:
    name: str  # the task id, and the EMR step's name
    args: tuple[str, ...]  # the `lakehouse` command line, e.g. ("services", "--table", "bronze/orders")
    env: dict[str, str] = field(default_factory=dict)

    def _conf(self, target: str, jars: tuple[str, ...] = ()) -> list[str]:
        conf = spark_conf(target)
        if jars:  # beside the cluster's own (spark.toml [emr] spark.jars): `--jars` would replace them
            conf["spark.jars"] = ",".join([*filter(None, [conf.get("spark.jars")]), *jars])
        if target == "local":
            python = str(PROJECT_ROOT / ".venv" / "bin" / "python")
            conf |= {"spark.pyspark.python": python, "spark.pyspark.driver.python": python}
        else:
            env = {k: v for k, v in self.env.items() if k not in LOCAL_ONLY_ENV}
            for key, value in {**env, "LAKEHOUSE_TARGET": "emr"}.items():
                conf[f"spark.yarn.appMasterEnv.{key}"] = value
                conf[f"spark.executorEnv.{key}"] = value
        master = conf.pop("spark.master", None)
        args = ["--master", master] if master else []
        for key, value in conf.items():
            args += ["--conf", f"{key}={value}"]
        return args

    def local_command(self) -> list[str]:
        """The command line that runs this job on the local target."""
        submit = PROJECT_ROOT / ".venv" / "bin" / "spark-submit"
        return [str(submit), "--name", f"lakehouse-{self.name}", *self._conf("local"),
                str(PROJECT_ROOT / "pipelines" / "cli" / "__main__.py"), *self.args]

    def local_env(self) -> dict[str, str]:
        """The job's environment on the local target: its own, plus where .venv's Spark is.

        spark-submit finds SPARK_HOME with whatever `python3` is first on PATH, which in an
        Airflow worker is Airflow's environment, without pyspark.
        """
        return {**self.env, "SPARK_HOME": str(spark_home()), "LAKEHOUSE_TARGET": "local"}

    def local_bash(self) -> str:
        return shlex.join(self.local_command())

    def emr_step(self, code_uri: str) -> dict:
        """The EMR step of this job; `code_uri` holds lakehouse.zip (the project's packages) and cli.py."""
        code = code_uri.rstrip("/")
        args = ["spark-submit", "--deploy-mode", "cluster", "--name", f"lakehouse-{self.name}",
                *self._conf("emr", jars=(f"{code}/{MSK_IAM_JAR}",)), "--py-files", f"{code}/lakehouse.zip",
                f"{code}/cli.py", *self.args]
        return {"Name": f"lakehouse {self.name}", "ActionOnFailure": "CONTINUE",
                "HadoopJarStep": {"Jar": "command-runner.jar", "Args": args}}
