"""The session options of a job on a standalone cluster (LAKEHOUSE_SPARK_MASTER), as rendered: no JVM.

tests/test_cluster.py runs them on a real cluster; this checks what a local spark-submit (the DAGs'
local target) and an EMR step are given, which that test cannot see.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hudi_configs import test_profile as overrides_profile
from pipelines.deploy.jobs import SparkJob
from pipelines.errors import SettingError
from pipelines.runtime.settings import PROJECT_ROOT
from pipelines.runtime.spark_conf import PARENT_VARIABLE, ROOT_PARENT_VARIABLE, spark_conf
from tests.lake import LINEAGE_ON, with_overrides

pytestmark = pytest.mark.unit

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
    with pytest.raises(SettingError, match="LAKEHOUSE_SPARK_MASTER='yarn': expected a standalone master"):
        spark_conf()


def test_emr_steps_ignore_the_local_master(jars, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAKEHOUSE_SPARK_MASTER", MASTER)
    args = SparkJob("etl", ("etl",), {"LAKEHOUSE_SPARK_MASTER": MASTER}).emr_step("s3://code/x")["HadoopJarStep"]["Args"]
    assert MASTER not in " ".join(args) and "--master" not in args
    assert "spark.pyspark.python=/usr/bin/python3.11" in args and "s3://code/x/lakehouse.zip" in args
    # Kept frames survive a lost executor there as on the local cluster: reliable checkpoints on HDFS.
    assert "spark.checkpoint.dir=hdfs:///tmp/lakehouse-spark-checkpoints" in args


def test_lineage_options_follow_the_target_the_airflow_task_and_the_overrides(jars, tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """hudi_configs/spark.toml [lineage] as each job gets it: the listener everywhere, the file transport locally
    (in LAKEHOUSE_LINEAGE_DIR), the console and the jar by package on EMR, an Airflow task's run as the parent;
    on in the project's options, off in the suite's profile unless a test turns it on (tests/lake.py)."""
    monkeypatch.delenv("LAKEHOUSE_SPARK_MASTER", raising=False)
    monkeypatch.setenv("LAKEHOUSE_LINEAGE_DIR", str(tmp_path / "lineage"))
    monkeypatch.setenv(PARENT_VARIABLE, "lakehouse/lakehouse_incremental_etl.etl/01a2255d-f733-7897-8355-06829862620f")
    monkeypatch.setenv(ROOT_PARENT_VARIABLE, "lakehouse/lakehouse_incremental_etl/01a2255d-f733-7077-86e7-672a6ae97af9")
    monkeypatch.delenv("LAKEHOUSE_HUDI_OVERRIDES")
    local, emr = spark_conf(), spark_conf("emr")
    for conf in (local, emr):
        assert conf["spark.extraListeners"] == "io.openlineage.spark.agent.OpenLineageSparkListener"
        assert conf["spark.openlineage.parentJobNamespace"] == conf["spark.openlineage.rootParentJobNamespace"] \
            == "lakehouse"
        assert conf["spark.openlineage.parentJobName"] == "lakehouse_incremental_etl.etl"
        assert conf["spark.openlineage.parentRunId"] == "01a2255d-f733-7897-8355-06829862620f"
        assert conf["spark.openlineage.rootParentJobName"] == "lakehouse_incremental_etl"
        assert conf["spark.openlineage.rootParentRunId"] == "01a2255d-f733-7077-86e7-672a6ae97af9"
    assert local["spark.openlineage.transport.type"] == "file"
    assert local["spark.openlineage.transport.location"] == str(tmp_path / "lineage" / "spark.jsonl")
    assert emr["spark.openlineage.transport.type"] == "console" and "spark.openlineage.transport.location" not in emr
    assert emr["spark.jars.packages"].split(",") == ["org.apache.spark:spark-sql-kafka-0-10_2.12:3.5.6",
                                                     "io.openlineage:openlineage-spark_2.12:1.53.0"]

    # An Airflow without the provider configured renders the variables empty: no parent, the listener still on.
    monkeypatch.setenv(PARENT_VARIABLE, "")
    monkeypatch.setenv(ROOT_PARENT_VARIABLE, "")
    conf = spark_conf()
    assert "spark.extraListeners" in conf
    assert not any(k.startswith(("spark.openlineage.parent", "spark.openlineage.rootParent")) for k in conf)
    monkeypatch.setenv(PARENT_VARIABLE, "lakehouse/no-run-id")
    with pytest.raises(SettingError, match="expected namespace/job name/run id"):
        spark_conf()
    monkeypatch.delenv(PARENT_VARIABLE)

    # The suite's profile turns it off (its cost), entirely; a test's overrides after it turn it on again.
    monkeypatch.setenv("LAKEHOUSE_HUDI_OVERRIDES", str(overrides_profile()))
    assert not [k for k in spark_conf() if "openlineage" in k or k == "spark.extraListeners"]
    assert spark_conf("emr")["spark.jars.packages"] == "org.apache.spark:spark-sql-kafka-0-10_2.12:3.5.6"
    monkeypatch.setenv("LAKEHOUSE_HUDI_OVERRIDES", with_overrides(tmp_path / "on.toml", LINEAGE_ON))
    assert spark_conf()["spark.extraListeners"] == "io.openlineage.spark.agent.OpenLineageSparkListener"
