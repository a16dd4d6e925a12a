"""The source and Kafka Connect credentials of a DAG task as Airflow Connections, end to end: the reconcile DAG's
`source_check` task run for real (`dag.test()`, a LakehouseBashOperator spark-submitting `lakehouse source check`),
told by a lakehouse.toml that names the Connections and holds no endpoint.

- `[source] airflow_connection`: a secure PostgreSQL (TLS verify-full, scram-sha-256 only:
  tests/capturable_source.py), its Connection defined as Airflow's environment backend reads one
  (`AIRFLOW_CONN_LAKEHOUSE_SOURCE`, JSON form).
- `[connect] airflow_connection`: a Connection in Airflow's metadata database only, so that the command in .venv (no
  Airflow there) can have it from nowhere but the operator's handing it over. Kafka Connect's REST API is a stand-in
  here, an HTTP server of the test's own requiring basic authentication and answering the connector's config and
  state as Connect does (a real worker is a minute of JVM); the client, its Connection and the task are the real ones.

The task succeeds only if the command authenticated to both; then neither password is in the task's log files, in
any process's command line seen while it ran, or in the OpenLineage events.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from conftest import DAGS, LINEAGE, PROJECT, serving

pytestmark = pytest.mark.integration

PG_BIN = Path(os.environ.get("LAKEHOUSE_PG_BIN") or "/usr/lib/postgresql/15/bin")
CONNECTOR = "shop-source"


@dataclass
class ConnectStandIn:
    """Kafka Connect's REST API as `lakehouse source check` reads it, behind basic authentication: the
    `Authorization` of every request, and the refused ones."""

    login: str
    password: str
    config: dict[str, str]
    url: str = ""
    seen: list[str | None] = field(default_factory=list)
    refused: int = 0

    def answer(self, path: str, authorization: str | None) -> tuple[int, object]:
        self.seen.append(authorization)
        wanted = "Basic " + base64.b64encode(f"{self.login}:{self.password}".encode()).decode()
        if authorization != wanted:
            self.refused += 1
            return 401, {"error_code": 401, "message": "Unauthorized"}
        running = {"state": "RUNNING", "worker_id": "127.0.0.1:8083"}
        return {f"/connectors/{CONNECTOR}": (200, {"name": CONNECTOR, "config": self.config, "tasks": []}),
                f"/connectors/{CONNECTOR}/config": (200, self.config),
                f"/connectors/{CONNECTOR}/status": (200, {"name": CONNECTOR, "connector": running,
                                                          "tasks": [{"id": 0, **running}]}),
                }.get(path, (404, {"error_code": 404, "message": f"no {path}"}))


@contextlib.contextmanager
def connect_stand_in(stand_in: ConnectStandIn) -> Iterator[ConnectStandIn]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            code, body = stand_in.answer(self.path, self.headers.get("Authorization"))
            raw = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *args) -> None:
            pass

    with serving(Handler) as stand_in.url:
        yield stand_in


class CommandLines:
    """Every process's command line, sampled from /proc until stopped: those holding any of `needles` (`hits`), and
    those holding `marker` (`marked`: the sampling saw the processes it is about)."""

    def __init__(self, needles: list[str], marker: str) -> None:
        self.needles, self.marker = [n.encode() for n in needles], marker.encode()
        self.hits: list[str] = []
        self.marked: set[str] = set()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self.done.wait(0.01):
            for pid in (p for p in os.listdir("/proc") if p.isdigit()):
                try:
                    line = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if self.marker in line:
                    self.marked.add(line.replace(b"\0", b" ").decode(errors="replace"))
                self.hits += [line.decode(errors="replace") for n in self.needles if n in line]

    def __enter__(self) -> CommandLines:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join(10)


def _venv(*args: str) -> str:
    done = subprocess.run([str(PROJECT / ".venv" / "bin" / "python"), *args], cwd=PROJECT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture
def source_password() -> str:
    return f"src-{secrets.token_hex(12)}"


@pytest.fixture
def source(source_password: str) -> Iterator[dict]:
    """The secure, capturable PostgreSQL with `source_password`, its slot streamed by pg_recvlogical (Debezium's
    task's part): what tests/capturable_source.py prints."""
    home = Path(tempfile.mkdtemp(prefix="af-conn-source-"))  # not under pytest's 0700 folder: `postgres` runs it
    (home / "postgres").mkdir()
    password_file = home / "postgres" / "password"
    password_file.touch(mode=0o600)
    password_file.write_text(source_password)
    stream = None
    try:
        found = json.loads(_venv("-m", "tests.capturable_source", "start", str(home)))
        stream = subprocess.Popen([str(PG_BIN / "pg_recvlogical"), "-d", found["dsn"], "-S", "shop_debezium",
                                   "--start", "-o", "proto_version=1", "-o", "publication_names=shop_publication",
                                   "-f", "/dev/null"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        yield found
    finally:
        if stream is not None:
            stream.terminate()
            stream.wait(10)
        _venv("-m", "tests.capturable_source", "stop", str(home))
        shutil.rmtree(home, ignore_errors=True)


@contextlib.contextmanager
def metadata_connection(conn_id: str, **fields: object) -> Iterator[None]:
    """An Airflow Connection in the metadata database alone (not in this process's environment)."""
    from airflow.models.connection import Connection
    from airflow.utils.session import create_session

    with create_session() as session:
        session.add(Connection(conn_id=conn_id, **fields))
    try:
        yield
    finally:
        with create_session() as session:
            session.query(Connection).filter(Connection.conn_id == conn_id).delete()


def _texts(folder: Path) -> dict[Path, str]:
    return {p: p.read_text(errors="replace") for p in folder.rglob("*") if p.is_file()} if folder.exists() else {}


def _configure(tmp_path: Path, source: dict, password: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """[source] as the Connection of AIRFLOW_CONN_LAKEHOUSE_SOURCE, [connect] as `lakehouse_connect`'s (the metadata
    database's), named by a lakehouse.toml holding no endpoint."""
    monkeypatch.setenv("AIRFLOW_CONN_LAKEHOUSE_SOURCE", json.dumps({
        "conn_type": "postgres", "host": "127.0.0.1", "port": source["port"], "login": "postgres",
        "password": password, "schema": "shop", "extra": {"sslmode": "verify-full", "sslrootcert": source["ca"]}}))
    monkeypatch.delenv("AIRFLOW_CONN_LAKEHOUSE_CONNECT", raising=False)
    (tmp_path / "lakehouse.toml").write_text(
        f'[lake]\nroot = "{tmp_path / "lake"}"\n\n[source]\nairflow_connection = "lakehouse_source"\n\n'
        '[connect]\nairflow_connection = "lakehouse_connect"\n')
    monkeypatch.setenv("LAKEHOUSE_CONFIG", str(tmp_path / "lakehouse.toml"))
    monkeypatch.setenv("LAKEHOUSE_TARGET", "local")


def test_source_check_task_reads_its_endpoints_from_airflow_connections(
        source: dict, source_password: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    """dag.test() runs the task in this process, its log (the task's records, the command's output) on this
    process's output, where capfd reads it: a log file under AIRFLOW_HOME/logs is a supervisor's, with its own
    Execution API server; what that folder holds is read too."""
    from airflow.models.dagbag import DagBag

    connect_password = f"connect-{secrets.token_hex(12)}"
    _configure(tmp_path, source, source_password, monkeypatch)
    logs = Path(os.environ["AIRFLOW_HOME"]) / "logs"
    before = _texts(logs)
    stand_in = ConnectStandIn("lakehouse-watchdog", connect_password, source["connector"])
    with connect_stand_in(stand_in), metadata_connection(
            "lakehouse_connect", conn_type="http", host="127.0.0.1", port=int(stand_in.url.rsplit(":", 1)[1]),
            login=stand_in.login, password=connect_password):
        bag = DagBag(dag_folder=str(DAGS), include_examples=False)
        assert bag.import_errors == {}, bag.import_errors
        capfd.readouterr()
        with CommandLines([source_password, connect_password], "__main__.py\0source\0check") as lines:
            run = bag.dags["lakehouse_reconcile"].test(mark_success_pattern="reconcile")
    out = capfd.readouterr()
    task_log = out.out + out.err
    # The command authenticated to PostgreSQL (scram-sha-256 only) and to Connect, with the Connections' passwords.
    assert run.get_task_instance("source_check").state == "success", task_log[-5000:]
    assert "source check: 0 errors" in task_log and stand_in.url in task_log, task_log[-5000:]
    assert stand_in.seen and stand_in.refused == 0, stand_in
    assert lines.marked, "no command line of the task's seen"
    assert lines.hits == [], lines.hits
    written = {p: t for p, t in _texts(logs).items() if before.get(p) != t}
    for where, texts in (("task log", {Path("<task output>"): task_log, **written}), ("lineage", _texts(LINEAGE))):
        leaks = [str(p) for p, t in texts.items() if source_password in t or connect_password in t]
        assert leaks == [], f"a password in the {where}: {leaks}"
