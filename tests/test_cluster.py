"""The shop's pipeline on a real Spark standalone cluster, and the faults only a cluster has.

A master and two one-core workers (dev/lakehouse_dev/spark_cluster.py); every job a separate
driver process with LAKEHOUSE_SPARK_MASTER set, its executors JVMs of the workers. Along one
lake: the supervised stream's driver SIGKILLed under a bronze commit and restarted by `stream
ensure`; an executor SIGKILLed while it runs a task of a bronze batch (its tasks run again, the
stream goes on); a worker and its executor lost for good under an etl commit (the job ends on the
other worker); an erasure verified on the one worker left. Both readers (Spark in this process,
hudi-rs) compare the lake to the model after each. Where tasks ran is read from the master's and
the workers' JSON pages and the applications' event logs, not assumed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lakehouse_dev.generator import ShopSource, WorkloadConfig, ensure_topics, produce
from lakehouse_dev.spark_cluster import AppTasks, LocalCluster, Worker, fetch_json
from pipelines.runtime.local_process import process_started
from pipelines.runtime.spark_conf import event_log_dir
from tests.kill import inflight, pending_instants, wait_caught_up
from tests.lake import assert_bronze_equals_model, assert_lake_equals_model
from tests.model import fold_with_lsn
from tests.test_bronze_ingest import STREAM_LIMITS
from tests.test_gdpr import _orders_stayed, erased_model, orders_of

pytestmark = [pytest.mark.slow, pytest.mark.environment]

LAKEHOUSE = [sys.executable, "-m", "pipelines.cli"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("cluster"), port=0, ui_port=0) as running:
        yield running


def running_tasks(worker: Worker) -> set[str]:
    """Task ids an executor of `worker` has started and not finished, read from its log (stderr, INFO)."""
    apps = sorted(worker.work_dir.glob("app-*"), key=lambda p: p.stat().st_mtime) if worker.work_dir.exists() else []
    if not apps:
        return set()
    text = "".join(p.read_text(errors="replace") for p in apps[-1].glob("*/stderr"))
    started = set(re.findall(r"Running task .* \(TID (\d+)\)", text))
    return started - set(re.findall(r"Finished task .* \(TID (\d+)\)", text))


def executors_by_worker(cluster: LocalCluster) -> dict[tuple[str, str], str]:
    """(application id, executor id) -> the id of the worker that ran it, from each worker's /json/ page."""
    found = {}
    for worker in cluster.worker_list:
        page = fetch_json(f"{worker.ui_url}/json/")
        for executor in page["executors"] + page["finishedexecutors"]:
            found[(executor["appid"], str(executor["id"]))] = page["id"]
    return found


def tasks_per_worker(cluster: LocalCluster, logs: Path, where: dict[tuple[str, str], str]) -> dict[str, dict]:
    """Per application that ran on the cluster: its name, successful tasks per worker, failed tasks' reasons."""
    page = cluster.state()
    apps = {a["id"] for a in page["completedapps"] + page["activeapps"]}
    result = {}
    for events in (logs / event_log_dir().name).iterdir():
        app = AppTasks.read(events)
        if app.app_id in apps:
            per_worker = Counter()
            for executor, n in app.succeeded.items():
                per_worker[where.get((app.app_id, executor), f"unknown executor {executor}")] += n
            result[app.app_id] = {"name": app.name, "workers": dict(per_worker), "failed": app.failed}
    return result


def kill_when(condition: Callable[[], bool], kill: Callable[[], object], job_alive: Callable[[], bool],
              seconds: float = 300) -> None:
    """Poll `condition` every 20 ms beside a running job, then `kill()`; fail if the job ends first."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert job_alive(), "the job ended before the fault could be injected"
        if condition():
            kill()
            return
        time.sleep(0.02)
    raise AssertionError("the kill point was never reached")


@pytest.mark.timeout(1500)
def test_the_shop_on_a_cluster_survives_its_driver_an_executor_and_a_worker(spark, broker, cluster: LocalCluster,
                                                                             tmp_path: Path) -> None:
    root, logs, run = tmp_path / "lake", tmp_path / "logs", tmp_path / "run"
    overrides = tmp_path / "stream.toml"
    overrides.write_text(STREAM_LIMITS)
    env = {**os.environ, "LAKEHOUSE_ROOT": str(root), "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
           "LAKEHOUSE_SPARK_MASTER": cluster.url, "LAKEHOUSE_LOG_DIR": str(logs), "LAKEHOUSE_RUN_DIR": str(run),
           "LAKEHOUSE_ERASURE_KEY_FILE": str(tmp_path / "erasure.key"),
           "LAKEHOUSE_HUDI_OVERRIDES": os.pathsep.join([os.environ["LAKEHOUSE_HUDI_OVERRIDES"], str(overrides)])}
    stream_log = run / "bronze-stream" / "stream.log"

    def lakehouse(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        done = subprocess.run([*LAKEHOUSE, *args], env=env, capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, f"lakehouse {' '.join(args)}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
        return done

    def stream_pid() -> int | None:
        path = run / "bronze-stream" / "stream.pid"
        return json.loads(path.read_text())["pid"] if path.exists() else None

    def stream_alive(pid: int) -> bool:
        return stream_pid() == pid and process_started(pid) is not None

    def caught_up() -> None:
        wait_caught_up(str(root), fold_with_lsn(sent)[0], stream_log, seconds=400)

    source = ShopSource(29)
    ensure_topics(broker.bootstrap)
    sent = source.snapshot(WorkloadConfig(seed=29, customers=60, orders=150, malformed_fraction=0.03)) + \
        source.changes(WorkloadConfig(seed=29, changes=300, malformed_fraction=0.03, invalid_fraction=0.1,
                                      delete_fraction=0.08))
    produce(sent, broker.bootstrap)
    bronze_commit = inflight(root, "bronze/*", "deltacommit")
    worker1, worker2 = cluster.worker_list
    try:
        # The driver: the supervised stream SIGKILLed (its whole process group) under a bronze
        # commit; `ensure` finds it dead and starts it again from the same checkpoint.
        lakehouse("stream", "ensure", "--trigger-seconds", "2")
        first = stream_pid()
        kill_when(lambda: bronze_commit(""), lambda: os.killpg(first, signal.SIGKILL), lambda: stream_alive(first))
        more = source.changes(WorkloadConfig(seed=30, changes=200, replay_runs=1))
        produce(more, broker.bootstrap)
        sent += more
        assert "dead" in lakehouse("stream", "ensure", "--trigger-seconds", "2").stdout
        second = stream_pid()
        assert second != first

        # An executor: SIGKILLed while it runs a task of the restarted stream's batches (a bronze
        # commit in flight, the killed one's or its own); the worker starts another, the tasks run
        # again, the stream goes on.
        more = source.changes(WorkloadConfig(seed=31, changes=300))
        produce(more, broker.bootstrap)
        sent += more
        killed: list[int | None] = []
        kill_when(lambda: bronze_commit("") and bool(running_tasks(worker1)),
                  lambda: killed.append(cluster.kill_executor(0)), lambda: stream_alive(second))
        assert killed[0] is not None, "no executor of the first worker was running"
        caught_up()
        assert "stopped" in lakehouse("stream", "stop").stdout
        assert process_started(second) is None and not pending_instants(root)
        expected, lsns = fold_with_lsn(sent)
        assert_bronze_equals_model(spark, str(root), expected, lsns)

        # A worker lost for good, its executor with it, under an etl commit: etl ends on the other.
        where: dict[tuple[str, str], str] = {}
        silver_commit = inflight(root, "silver/*", "commit")
        with (tmp_path / "etl.log").open("w") as out:
            etl = subprocess.Popen([*LAKEHOUSE, "etl"], env=env, stdout=out, stderr=subprocess.STDOUT)
        # The workers' pages list which executor of which application each ran: read before one goes.
        kill_when(lambda: silver_commit("") and bool(running_tasks(worker2)),
                  lambda: (where.update(executors_by_worker(cluster)), cluster.kill_worker(1)),
                  lambda: etl.poll() is None)
        assert etl.wait(timeout=600) == 0, (tmp_path / "etl.log").read_text()[-3000:]
        assert_lake_equals_model(spark, str(root), source.state)
        assert [w["state"] for w in cluster.state()["workers"]].count("ALIVE") == 1

        # An erasure on the one worker left, verified.
        state = source.state
        victim = next(c for c in sorted({o["customer_id"] for o in state["orders"].values()}
                                        & state["customers"].keys()) if _orders_stayed(sent, state, c))
        orders = orders_of(sent, {victim})
        done = lakehouse("gdpr", "erase", "--customer-id", str(victim), "--reference", "REQ-CLUSTER-1",
                         "--requested-by", "dpo")
        summary = json.loads(done.stdout.splitlines()[-1])
        assert summary["verified"] and summary["status"] == "erased" and summary["rows_removed"] > 0, summary
        expected, lsns = erased_model(sent, {victim}, orders)
        assert_bronze_equals_model(spark, str(root), expected, lsns)
        assert_lake_equals_model(spark, str(root), expected)

        # Where the work ran: every application on the cluster, tasks on both workers until one was
        # lost; the killed executor's tasks failed as lost and ran again.
        apps = tasks_per_worker(cluster, logs, where)
        print(json.dumps(apps, indent=1))
        names = Counter(a["name"] for a in apps.values())
        assert names == {"lakehouse-ingest": 2, "lakehouse-etl": 1, "lakehouse-gdpr": 1}, names
        ingests = [a for a in apps.values() if a["name"] == "lakehouse-ingest"]
        for app in [*ingests, *(a for a in apps.values() if a["name"] == "lakehouse-etl")]:
            assert len(app["workers"]) == 2 and not any(k.startswith("unknown") for k in app["workers"]), app
        assert any("ExecutorLostFailure" in a["failed"] for a in ingests), ingests
    finally:
        if (pid := stream_pid()) is not None and process_started(pid) is not None:
            os.killpg(pid, signal.SIGKILL)
        cluster.start()  # the lost worker back, for whoever uses the cluster next


def test_cluster_status_names_the_master_its_ui_and_the_workers(cluster: LocalCluster, tmp_path: Path) -> None:
    from tests.lake import run_cli

    shown = run_cli("dev", "cluster", "status", "--home", str(cluster.home))
    assert shown.exit_code == 0, shown.output
    assert f"master {cluster.url} (ALIVE), web UI {cluster.master.ui_url}" in shown.output
    assert shown.output.count(" ALIVE: 1 core(s)") == 2, shown.output
    missing = run_cli("dev", "cluster", "status", "--home", str(tmp_path / "none"))
    assert missing.exit_code == 1 and "no Spark master runs from" in missing.output


PROBE = """
import json, sys
from pipelines.runtime.spark import get_spark

def where(_):
    import pipelines.lake.declaration
    yield sys.executable, pipelines.lake.declaration.__file__

print(json.dumps(get_spark("lakehouse-probe").sparkContext.parallelize(range(4), 4).mapPartitions(where).collect()))
"""


def test_executors_import_the_shipped_code_with_the_drivers_python(cluster: LocalCluster, tmp_path: Path) -> None:
    """The code reaches the executors' Python as EMR's does, the `lakehouse package` zip, not this checkout."""
    env = {**os.environ, "LAKEHOUSE_SPARK_MASTER": cluster.url, "LAKEHOUSE_LOG_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert {python for python, _ in seen} == {sys.executable}
    assert all(f"lakehouse.zip{os.sep}pipelines{os.sep}lake{os.sep}declaration.py" in path for _, path in seen), seen
