"""The session options of a job on a standalone cluster (LAKEHOUSE_SPARK_MASTER), as rendered: no JVM.

tests/test_cluster.py runs them on a real cluster; this checks what a local spark-submit (the DAGs'
local target) and an EMR step are given, which that test cannot see.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.deploy.jobs import SparkJob
from pipelines.settings import PROJECT_ROOT
from pipelines.spark_conf import spark_conf

MASTER = "spark://127.0.0.1:7077"


@pytest.fixture
def jars(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    names = ["hudi-spark3.5-bundle_2.12-1.0.2.jar", "spark-sql-kafka-0-10_2.12-3.5.7.jar"]
    (tmp_path / "spark").mkdir()
    for name in names:
        (tmp_path / "spark" / name).touch()
    monkeypatch.setenv("LAKEHOUSE_JVM_DIR", str(tmp_path))
    monkeypatch.setenv("LAKEHOUSE_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.delenv("LAKEHOUSE_TARGET", raising=False)
    return [str(tmp_path / "spark" / n) for n in names]


def test_without_a_master_jobs_run_in_local_mode(jars, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LAKEHOUSE_SPARK_MASTER", raising=False)
    conf = spark_conf()
    assert conf["spark.master"] == "local[2]"
    assert not {"spark.executor.extraClassPath", "spark.eventLog.enabled", "spark.checkpoint.dir"} & conf.keys()


def test_on_a_cluster_executors_get_the_drivers_jars_python_and_store(jars, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAKEHOUSE_SPARK_MASTER", MASTER)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    conf = spark_conf()
    assert conf["spark.master"] == MASTER
    assert conf["spark.executor.extraClassPath"] == conf["spark.driver.extraClassPath"] == ":".join(jars)
    assert conf["spark.driver.host"] == "127.0.0.1"
    assert conf["spark.executorEnv.AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000"
    assert conf["spark.eventLog.enabled"] == "true"
    assert conf["spark.eventLog.dir"] == (tmp_path / "logs" / "spark-events").as_uri()
    assert conf["spark.executor.cores"] == "1" and conf["spark.task.maxFailures"] == "4"
    assert conf["spark.checkpoint.dir"] == "/tmp/lakehouse-spark-checkpoints"

    # The DAGs' local target submits there, the executors' Python being .venv's like the driver's.
    command = SparkJob("etl", ("etl",)).local_command()
    assert command[command.index("--master") + 1] == MASTER
    python = str(PROJECT_ROOT / ".venv" / "bin" / "python")
    assert f"spark.pyspark.python={python}" in command
    assert f"spark.executor.extraClassPath={':'.join(jars)}" in command


def test_a_master_that_is_not_standalone_is_refused(jars, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAKEHOUSE_SPARK_MASTER", "yarn")
    with pytest.raises(ValueError, match="LAKEHOUSE_SPARK_MASTER='yarn': expected a standalone master"):
        spark_conf()


def test_emr_steps_ignore_the_local_master(jars, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAKEHOUSE_SPARK_MASTER", MASTER)
    args = SparkJob("etl", ("etl",), {"LAKEHOUSE_SPARK_MASTER": MASTER}).emr_step("s3://code/x")["HadoopJarStep"]["Args"]
    assert MASTER not in " ".join(args) and "--master" not in args
    assert "spark.pyspark.python=/usr/bin/python3.11" in args and "s3://code/x/lakehouse.zip" in args
    # Kept frames survive a lost executor there as on the local cluster: reliable checkpoints on HDFS.
    assert "spark.checkpoint.dir=hdfs:///tmp/lakehouse-spark-checkpoints" in args
