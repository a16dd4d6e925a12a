"""Shared fixtures: one real Spark session per test run, a real Kafka broker per test, and a lake
built once per run (ingest and etl of a generated workload) that tests copy, broker data included.

A Hudi commit costs seconds of CPU on 2 cores whatever its size, so building the same
lake again in every test that starts from "a lake with some history" would be most of the suite's
time; `lake` hands each such test its own copy instead (see tests/lake.py, LakeCopy). The
pytest-xdist processes of `make test` share that one build.

The order of the tests is the schedule of `make test`'s processes: the slowest first, dealt
into each process's share, so that no long test starts last (see pytest_collection_modifyitems).
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import time
from collections.abc import Generator, Iterator
from importlib.util import find_spec
from pathlib import Path

import pytest
from filelock import FileLock
from pyspark.sql import SparkSession

from hudi_configs import test_profile
from lakehouse_dev.kafka_local import JAVA_OPTS_VARIABLE, QUICK_START, KafkaBroker
from tests.lake import BASE_WORKLOAD, LakeCopy, base_workload, build_base_lake
from tests.tiers import check_tiers

# tests/dags run in Airflow's environment (`make test` runs them there, apart from these).
collect_ignore = ["dags"] if find_spec("airflow") is None else []

# PySpark turns timestamps into naive datetimes in the process's zone: make that UTC, as the data is.
os.environ["TZ"] = "UTC"
time.tzset()
# Spark and Hudi sized for test data, in this process and every job a test starts (a test that
# adds its own overrides puts them after the profile: tests/lake.py, with_overrides).
os.environ["LAKEHOUSE_HUDI_OVERRIDES"] = str(test_profile())
# The suite's many short-lived Kafka brokers: start on less CPU (dev/lakehouse_dev/kafka_local.py).
os.environ[JAVA_OPTS_VARIABLE] = QUICK_START

# The session JVM's C2 thresholds, ten times the JDK's (5,000 calls, 40,000 loop iterations): at the
# JDK's, its C2 compiler spends a third of the session's CPU in tests/test_gdpr.py, at these half
# that, and the suite's long tests take 5 to 13% less CPU. Higher thresholds save no more; C1 alone
# (a code cache big enough not to thrash) runs their work about a quarter slower, for 4% less CPU.
SESSION_JIT = ("-XX:Tier4InvocationThreshold=50000 -XX:Tier4MinInvocationThreshold=10000 "
               "-XX:Tier4CompileThreshold=60000 -XX:Tier4BackEdgeThreshold=400000")


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    from pipelines.runtime.spark import get_spark

    # This JVM runs the whole suite, so C2's faster code repays its compile time here (with the
    # profile's C1-only flag, the erasure tests run 19-40% longer); that flag is for the
    # short-lived JVMs of the jobs the tests start. C2 only for code that stays hot, though
    # (SESSION_JIT): each query's generated classes and Hudi's many short phases keep making new
    # code warm.
    session = get_spark("lakehouse-tests", {"spark.driver.defaultJavaOptions": SESSION_JIT})
    yield session
    session.stop()


@pytest.fixture
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A fresh broker (about 3 s to start), so that every test owns the contract's topic names."""
    b = KafkaBroker(tmp_path_factory.mktemp("kafka"))
    b.start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture(scope="session")
def base_lake(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> LakeCopy:
    """The run's one generated lake (BASE_WORKLOAD ingested once, one etl cycle), its broker stopped.

    Built by whichever xdist process needs it first, in the run's folder that all of them share;
    the others wait for it (a build is a minute or two of both cores) and regenerate the same
    records and source state themselves (the generator is seeded).
    """
    shared = tmp_path_factory.getbasetemp()
    if worker_id != "master":
        shared = shared.parent
    where = shared / "base-lake"
    with FileLock(str(shared / "base-lake.lock")):
        if not (where / "built").exists():  # absent too after a build that failed half-way
            shutil.rmtree(where, ignore_errors=True)
            where.mkdir()
            build_base_lake(spark, where)
            (where / "built").touch()
    source, sent = base_workload()
    return LakeCopy(where, None, source, sent, BASE_WORKLOAD)


@pytest.fixture
def lake(base_lake: LakeCopy, tmp_path: Path) -> Iterator[LakeCopy]:
    """A private copy of `base_lake`: lake, broker data (served on new ports), source and sent records."""
    shutil.copytree(base_lake.dir, tmp_path, dirs_exist_ok=True)
    broker = KafkaBroker(tmp_path / "kafka", controller_port=0)
    broker.start()
    try:
        yield LakeCopy(tmp_path, broker, copy.deepcopy(base_lake.source), list(base_lake.sent), BASE_WORKLOAD)
    finally:
        broker.stop()


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    """Each test's tier, checked as its module is collected (tests/tiers.py)."""
    report = yield
    check_tiers(report)
    return report


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Slowest first, dealt into each xdist process's share, the shares' estimates near equal.

    pytest-xdist's worksteal scheduler hands each process a contiguous share of this list and
    lets an idle process steal from the end of another's: with the longest tests at the front
    of every share, the run does not end with one process alone in a ten-minute test (it did:
    the suite's last four minutes were one test). The estimates are tests/durations.json,
    seconds per test (setup, call and teardown) of a `make test` run's `--durations` report on
    the 2-core machine; a test not in it counts as fast unless marked slow. They order the run,
    nothing else: a stale figure costs minutes, never a result.
    """
    known = json.loads((Path(__file__).parent / "durations.json").read_text())
    estimate = {item.nodeid: known.get(item.nodeid, 100.0 if item.get_closest_marker("slow") else 1.0)
                for item in items}
    n = getattr(config, "workerinput", {}).get("workercount", 1)
    shares: list[list[pytest.Item]] = [[] for _ in range(n)]
    for i, item in enumerate(sorted(items, key=lambda item: -estimate[item.nodeid])):
        shares[i % n if i // n % 2 == 0 else n - 1 - i % n].append(item)  # a snake draft: equal counts
    items[:] = [item for share in shares for item in share]
