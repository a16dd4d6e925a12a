"""Shared fixtures: a real Kafka broker per test, one real Spark session per test run."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from importlib.util import find_spec

import pytest
from pyspark.sql import SparkSession

from pipelines.kafka_local import KafkaBroker, free_port

# tests/dags run in Airflow's environment (`make test` runs them there, apart from these).
collect_ignore = ["dags"] if find_spec("airflow") is None else []

# PySpark turns timestamps into naive datetimes in the process's zone: make that UTC, as the data is.
os.environ["TZ"] = "UTC"
time.tzset()


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    from pipelines.spark import get_spark

    session = get_spark("lakehouse-tests")
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
