"""Shared fixtures: one real Spark session per test run, a real Kafka broker per test, and a lake
built once per run (ingest and etl of a generated workload) that tests copy, broker data included.

A Hudi commit costs seconds of CPU on this machine whatever its size, so building the same
lake again in every test that starts from "a lake with some history" was most of the suite's
time; `lake` hands each such test its own copy instead (see tests/lake.py, LakeCopy).
"""

from __future__ import annotations

import copy
import os
import shutil
import time
from collections.abc import Iterator
from importlib.util import find_spec
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from hudi_configs import test_profile
from pipelines.kafka_local import KafkaBroker, free_port
from tests.lake import BASE_WORKLOAD, LakeCopy, build_base_lake

# tests/dags run in Airflow's environment (`make test` runs them there, apart from these).
collect_ignore = ["dags"] if find_spec("airflow") is None else []

# PySpark turns timestamps into naive datetimes in the process's zone: make that UTC, as the data is.
os.environ["TZ"] = "UTC"
time.tzset()
# Spark and Hudi sized for test data, in this process and every job a test starts (a test that
# adds its own overrides puts them after the profile: tests/lake.py, with_overrides).
os.environ["LAKEHOUSE_HUDI_OVERRIDES"] = str(test_profile())


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    from pipelines.spark import get_spark

    # This JVM runs the whole suite, so C2's faster code repays its compile time here (with the
    # profile's C1-only flag, the erasure tests ran 19-40% longer); that flag is for the
    # short-lived JVMs of the jobs the tests start.
    session = get_spark("lakehouse-tests", {"spark.driver.defaultJavaOptions": ""})
    yield session
    session.stop()


@pytest.fixture
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A fresh broker (about 3 s to start), so that every test owns the contract's topic names."""
    b = KafkaBroker(tmp_path_factory.mktemp("kafka"), port=free_port())
    b.start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture(scope="session")
def base_lake(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> LakeCopy:
    """The run's one generated lake (BASE_WORKLOAD ingested once, one etl cycle), its broker stopped."""
    return build_base_lake(spark, tmp_path_factory.mktemp("base-lake"))


@pytest.fixture
def lake(base_lake: LakeCopy, tmp_path: Path) -> Iterator[LakeCopy]:
    """A private copy of `base_lake`: lake, broker data (served on new ports), source and sent records."""
    shutil.copytree(base_lake.dir, tmp_path, dirs_exist_ok=True)
    broker = KafkaBroker(tmp_path / "kafka", port=free_port(), controller_port=free_port())
    broker.start()
    try:
        yield LakeCopy(tmp_path, broker, copy.deepcopy(base_lake.source), list(base_lake.sent), BASE_WORKLOAD)
    finally:
        broker.stop()
