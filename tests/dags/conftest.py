"""Airflow tests, run in .venv-airflow (`make test`): a throwaway AIRFLOW_HOME with a migrated database.

The lake tables they work on are built by the real pipeline, through the project's CLI in
.venv (Airflow's environment has no Spark, as in production).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Generator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from hudi_configs import test_profile
from lakehouse_dev.kafka_local import JAVA_OPTS_VARIABLE, QUICK_START

PROJECT = Path(__file__).resolve().parents[2]
DAGS = PROJECT / "dags"
LAKEHOUSE = PROJECT / ".venv" / "bin" / "lakehouse"

# Before anything imports airflow: its settings are read at import.
_home = Path(tempfile.mkdtemp(prefix="airflow-home-"))
LINEAGE = _home / "lineage"
os.environ.update({
    "AIRFLOW_HOME": str(_home),
    "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
    "TZ": "UTC",
    # Spark and Hudi sized for test data, for every job the tests start (hudi_configs/test_profile.toml).
    "LAKEHOUSE_HUDI_OVERRIDES": str(test_profile()),
    # The suite's short-lived Kafka brokers: start on less CPU (dev/lakehouse_dev/kafka_local.py).
    JAVA_OPTS_VARIABLE: QUICK_START,
    # The DAGs without their late-run deadline: dag.test() creates runs that were never queued, from which
    # Airflow 3.1.8 cannot compute one (dags/lakehouse_common.py, alerting). The UI test's Airflow has them.
    "LAKEHOUSE_LATE_AFTER": "off",
    # OpenLineage on, as `make airflow` runs it (dags/airflow_local.sh): the provider's events of every task,
    # and those of the Spark jobs the tasks start (hudi_configs/spark.toml [lineage]), in one folder.
    "AIRFLOW__OPENLINEAGE__NAMESPACE": "lakehouse",
    "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "log_file_path": str(LINEAGE / "airflow.jsonl"),
                                                   "append": True}),
    "LAKEHOUSE_LINEAGE_DIR": str(LINEAGE),
})
LINEAGE.mkdir()
sys.path[:0] = [str(DAGS), str(PROJECT)]  # the DAGs' helper module; tests.hudi_files


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, pytest.CollectReport]:
    """Each test's tier, checked as its module is collected (tests/tiers.py; all of tests/dags is `integration`)."""
    from tests.tiers import check_tiers  # here: PROJECT is on sys.path once this module ran

    report = yield
    check_tiers(report)
    return report


@pytest.fixture(scope="session", autouse=True)
def airflow_db() -> Iterator[None]:
    subprocess.run([str(Path(sys.executable).with_name("airflow")), "db", "migrate"], check=True,
                   capture_output=True)
    yield


def lakehouse(*args: str, env: dict[str, str] | None = None, timeout: float = 900) -> str:
    """Run the project's CLI in .venv; fail with its stderr."""
    done = subprocess.run([str(LAKEHOUSE), *args], env={**os.environ, **(env or {})}, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"lakehouse {' '.join(args)}: {done.stderr[-3000:]}"
    return done.stdout


# Short bronze retention: the cleaning tasks of the table-services DAG have file slices to delete.
OVERRIDES = """
[bronze.table]
"hoodie.clean.policy" = "KEEP_LATEST_COMMITS"
"hoodie.clean.commits.retained" = 1
"hoodie.keep.min.commits" = 3
"hoodie.keep.max.commits" = 5
"""


def kafka_up(data_dir: Path) -> int:
    """Start a broker from `data_dir` on a port it chooses (chosen again if taken before its bind): that port."""
    ready = lakehouse("dev", "kafka", "start", "--port", "0", "--data-dir", str(data_dir))
    return int(re.search(r"ready at [\d.]+:(\d+)", ready)[1])


def _lake_env(where: Path, port: int) -> dict[str, str]:
    return {"LAKEHOUSE_ROOT": str(where / "lake"), "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{port}",
            "LAKEHOUSE_SOURCE_STATE": str(where / "source.json"), "LAKEHOUSE_TABLE_SERVICES": "external",
            "LAKEHOUSE_HUDI_OVERRIDES": os.pathsep.join([str(test_profile()), str(where / "overrides.toml")]),
            "LAKEHOUSE_TARGET": "local"}


@pytest.fixture(scope="session")
def built_lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two ingest runs of a generated workload into bronze, with table services external (no inline
    compaction), built once per run; its broker stopped. Tests take a copy (`lake`)."""
    where = tmp_path_factory.mktemp("dag-lake")
    (where / "overrides.toml").write_text(OVERRIDES)
    env = _lake_env(where, kafka_up(where / "kafka"))
    try:
        lakehouse("dev", "generate", "--seed", "5", "--customers", "150", "--orders", "400", "--changes", "800",
                  env=env)
        lakehouse("ingest", "--once", env=env)
        lakehouse("dev", "generate", "--changes", "300", env=env)
        lakehouse("ingest", "--once", env=env)
    finally:
        lakehouse("dev", "kafka", "stop", "--data-dir", str(where / "kafka"), env=env)
    return where


@pytest.fixture
def lake(built_lake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A private copy of `built_lake` (lake, broker data on a new port, source state); the environment points at it."""
    shutil.copytree(built_lake, tmp_path, dirs_exist_ok=True)
    kafka_dir = tmp_path / "kafka"
    for key, value in _lake_env(tmp_path, kafka_up(kafka_dir)).items():
        monkeypatch.setenv(key, value)
    try:
        yield tmp_path / "lake"
    finally:
        lakehouse("dev", "kafka", "stop", "--data-dir", str(kafka_dir))


def many_tables(n: int) -> str:
    """A declaration of `n` source tables `t00`, `t01`, ... of mixed shapes, as a team with a real database
    writes one: single and composite keys, typed and untyped topics, rules of every kind, personal data
    with its subject, derived columns."""
    tables = ['[source]\ntopic_prefix = "app"']
    for i in range(n):
        name, shape = f"t{i:02}", i % 4
        spec = [f"[tables.{name}]", f'source = "public.{name}"']
        if shape == 0:
            spec += ['key = ["id"]', 'rules = [{ column = "status", one_of = ["new", "done"] }, '
                     '{ column = "amount", min = 0, not_null = true }]']
        elif shape == 1:
            spec += ['key = ["site", "sku"]', 'rules = [{ column = "sku", pattern = "^[A-Z0-9-]+$" }]',
                     'clean = [{ column = "sku", trim = true, upper = true }]']
        elif shape == 2:
            spec += ['key = ["id"]', 'subject = "customer_id"', 'pii = ["email"]',
                     'rules = [{ column = "price", cast = "decimal(12,2)" }]',
                     'derive = [{ column = "day", date_of = "created_at" }]']
        else:
            spec += ['key = ["id"]', "typed = false",
                     'columns = { id = "bigint", note = "string", score = "double", ok = "boolean" }',
                     'rules = [{ column = "score", max = 100 }, { column = "ok", not_null = true }]']
        tables.append("\n".join(spec))
    return "\n\n".join(tables) + "\n"


class Webhook:
    """A chat's or pager's webhook, played by an HTTP server on 127.0.0.1: the JSON body of every POST it got."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.received: list[dict] = []
        self.arrived = threading.Condition()

    def connection(self) -> str:
        """The Airflow connection (JSON form, for AIRFLOW_CONN_LAKEHOUSE_ALERTS) whose host is this webhook's URL."""
        return json.dumps({"conn_type": "http", "host": self.url})

    def wait_for(self, predicate, timeout: float) -> dict | None:
        """The first body received that satisfies `predicate`, waiting up to `timeout` seconds; None if none came."""
        with self.arrived:
            self.arrived.wait_for(lambda: any(predicate(b) for b in self.received), timeout)
            return next((b for b in self.received if predicate(b)), None)


@contextlib.contextmanager
def webhook_server() -> Iterator[Webhook]:
    """A Webhook listening until the block ends."""
    hook: Webhook

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.end_headers()
            with hook.arrived:
                hook.received.append(body)
                hook.arrived.notify_all()

        def log_message(self, *args) -> None:
            pass

    with serving(Handler) as url:
        hook = Webhook(f"{url}/hooks/lakehouse")
        yield hook


@contextlib.contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """`handler` served on 127.0.0.1 (a port of its own) until the block ends: its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
