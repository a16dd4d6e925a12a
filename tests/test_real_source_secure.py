"""The real source secured end to end: PostgreSQL with TLS and scram-sha-256, Debezium reaching it with
verify-full and a password Connect's FileConfigProvider resolves, Connect's REST API behind basic
authentication, and Connect's own Kafka clients over the broker's SASL_SSL listener (SCRAM-SHA-512).

One source for all of it (a real source is about a minute of the suite's budget): a row inserted in
PostgreSQL reaches its topic, read over SASL_SSL; what lacks the password or TLS is refused. Then the pipeline,
told nothing but a `lakehouse.toml` (no LAKEHOUSE_* or KAFKA_* variable): `doctor` and `source check` pass on
every endpoint, `ingest --once` over SASL_SSL is killed while its first commit is in flight and run again,
bronze and silver hold exactly what PostgreSQL holds, an erasure is verified and sends its tombstones over
SASL_SSL, `reconcile` finds bronze equal to PostgreSQL but for the erased customer's rows; a table created and
declared while the stream runs is onboarded by `source sync` and followed by the running stream; and no password
is in the logs, the configs Connect shows, any process's command line, the jobs' Spark event logs and OpenLineage
events, or the lake.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from importlib import resources
from pathlib import Path

import psycopg
import pytest
from kafka import KafkaConsumer, TopicPartition

from hudi_configs import test_profile as suite_profile
from lakehouse_dev.connect_config import CONNECTOR, psycopg_options
from lakehouse_dev.connect_worker import secure_kafka, slot_status
from lakehouse_dev.kafka_local import KafkaBroker, free_port
from lakehouse_dev.pg_source import RealSource
from pipelines.lake.contract import topic
from pipelines.lake.declaration import SHOP
from pipelines.lake.layout import main_path, silver_path
from pipelines.lake.table_stats import has_completed_commit, read_table
from pipelines.runtime.config import (
    Config,
    ConnectSettings,
    KafkaSettings,
    LakeSettings,
    Secret,
    SourceSettings,
    config_text,
)
from pipelines.runtime.kafka_clients import python_options
from pipelines.runtime.settings import PROJECT_ROOT
from tests.kill import command_lines, inflight, run_until
from tests.lake import own_environment

pytestmark = [pytest.mark.integration]

ROW_ID = 424242
# The table onboarded while the stream runs: numbered, of the shop's orders, without personal data.
PAYMENTS_DDL = ("CREATE TABLE public.payments (id bigint PRIMARY KEY, order_id bigint NOT NULL, "
                "amount numeric(10,2) NOT NULL, paid_at timestamptz NOT NULL DEFAULT now())")
PAYMENTS_TOML = """
[tables.payments]
source = "public.payments"
key = ["id"]
typed = false  # the source's topics come without a Connect schema, as the shop's do
columns = { id = "bigint", order_id = "bigint", amount = "string", paid_at = "string" }
"""
# OpenLineage's listener on for the jobs here (the suite's profile turns it off): its events carry each
# source's options, and must not carry Kafka's JAAS line.
LINEAGE_ON = "[spark.lineage]\nenabled = true\n"


def _change(kafka: KafkaSettings, row_id: int, timeout: float = 90.0) -> dict:
    """The envelope of the first change of customers' row `row_id` on its topic, read over `kafka`'s security."""
    consumer = KafkaConsumer(**python_options(kafka), enable_auto_commit=False, consumer_timeout_ms=2000)
    try:
        name = topic("customers")
        deadline = time.monotonic() + timeout
        while not (partitions := consumer.partitions_for_topic(name)):
            assert time.monotonic() < deadline, f"no topic {name}"
            time.sleep(0.5)
        consumer.assign([TopicPartition(name, p) for p in partitions])
        consumer.seek_to_beginning()
        while time.monotonic() < deadline:
            for record in consumer:
                if record.key and json.loads(record.key) == {"id": row_id} and record.value:
                    return json.loads(record.value)
        raise AssertionError(f"no change of customers {row_id} on {name} in {timeout:.0f} s")
    finally:
        consumer.close()


def _rest_code(url: str, headers: dict[str, str]) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def write_config(where: Path, kafka: KafkaSettings, source: SourceSettings, connect: ConnectSettings) -> Path:
    """The file that tells the pipeline everything: the lake in `where`, its declaration (the shop's, in a file of
    its own that a table is added to later), the three secured endpoints."""
    (where / "erasure.key").write_text("cd" * 32)
    (where / "lineage.toml").write_text(LINEAGE_ON)
    (where / "tables.toml").write_text(resources.files("pipelines.lake").joinpath(SHOP).read_text())
    lake = LakeSettings(root=str(where / "lake"), tables=str(where / "tables.toml"),
                        erasure_key=Secret(file=where / "erasure.key"),
                        hudi_overrides=(str(suite_profile()), str(where / "lineage.toml")))
    path = where / "lakehouse.toml"
    path.write_text(config_text(Config(lake=lake, kafka=kafka, source=source, connect=connect), "the test's"))
    return path


def _lakehouse(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipelines.cli", "--config", str(config), *args],
                          env=own_environment(), capture_output=True, text=True, timeout=600, check=False)


def _workload(conn: psycopg.Connection) -> None:
    """Customers and their orders, some changed, some deleted: what the lake must end up holding."""
    for i in range(1, 21):
        conn.execute("INSERT INTO customers VALUES (%s, %s, %s, 'FR', now(), now())",
                     (i, f"c{i}@example.com", f"C {i}"))
        conn.execute("INSERT INTO orders VALUES (%s, %s, 'placed', %s, 'EUR', now(), now())", (100 + i, i, f"{i}.50"))
    conn.execute("UPDATE customers SET email = 'changed' || id || '@example.com', updated_at = now() WHERE id <= 8")
    conn.execute("UPDATE orders SET status = 'shipped', updated_at = now() WHERE id % 3 = 0")
    conn.execute("DELETE FROM orders WHERE customer_id IN (19, 20)")
    conn.execute("DELETE FROM customers WHERE id IN (19, 20)")


def _pipeline_from_the_file(tmp_path: Path, config: Path, conn: psycopg.Connection) -> None:
    """doctor, source check, an ingest killed and run again, an etl (bronze and silver are PostgreSQL's rows), an
    erasure."""
    doctor = _lakehouse(config, "doctor", "--json")
    found = {f["endpoint"]: f for f in json.loads(doctor.stdout)}
    assert all(found[e]["status"] == "ok" for e in ("kafka", "source", "connect")), doctor.stdout + doctor.stderr
    check = _lakehouse(config, "source", "check", "--json")
    assert check.returncode == 0, check.stdout + check.stderr
    root = tmp_path / "lake"
    cmd = [sys.executable, "-m", "pipelines.cli", "--config", str(config), "ingest", "--once"]
    assert run_until(cmd, own_environment(), tmp_path / "killed.log", inflight(root, "bronze/*", "deltacommit"))
    assert not run_until(cmd, own_environment(), tmp_path / "ingest.log", lambda _log: False)
    etl = _lakehouse(config, "etl")
    assert etl.returncode == 0, etl.stderr[-3000:]
    for table, columns in (("customers", "id, email"), ("orders", "id, status")):
        expected = dict(conn.execute(f"SELECT {columns} FROM {table}").fetchall())
        names = [c.strip() for c in columns.split(",")]
        bronze = {r[names[0]]: r[names[1]] for r in read_table(main_path(table, str(root)), names).to_pylist()}
        assert bronze == expected, f"bronze/{table} differs from PostgreSQL"
        silver = {r["id"] for r in read_table(silver_path(table, str(root)), ["id"]).to_pylist()}
        assert silver == set(expected), f"silver/{table} differs from PostgreSQL"
    # An erasure: the lake forgets customer 5, its tombstones reach the source topics over SASL_SSL.
    erase = _lakehouse(config, "gdpr", "erase", "--customer-id", "5", "--reference", "REQ-SECURE-1")
    assert erase.returncode == 0, erase.stdout + erase.stderr[-3000:]
    summary = json.loads(erase.stdout.splitlines()[-1])
    assert summary["verified"] and summary["status"] == "erased", summary
    kafka = json.loads(Path(summary["certificate"]).read_text())["kafka"]
    assert "error" not in kafka and kafka["tombstones"] >= 2, kafka  # the customer and their order
    assert 5 not in {r["id"] for r in read_table(main_path("customers", str(root)), ["id"]).to_pylist()}
    # Reconciled with PostgreSQL, which still holds customer 5 and their order: erased, so not drift.
    reconciled = _lakehouse(config, "reconcile", "--rounds", "0", "--json")
    assert reconciled.returncode == 0, reconciled.stdout + reconciled.stderr[-3000:]
    reports = {r["table"]: r for r in json.loads(reconciled.stdout)}
    assert {t: (r["source_rows"], r["erased_left_out"], r["drift"]) for t, r in reports.items()} == {
        "customers": (18, 1, False), "orders": (18, 1, False)}, reports


def _onboard_while_streaming(tmp_path: Path, config: Path, conn: psycopg.Connection) -> None:
    """A table created in PostgreSQL and declared while the stream runs over SASL_SSL: `source sync` captures it
    (publication, connector, an incremental snapshot of its rows) and the running stream reads its new topic,
    which Connect creates meanwhile; bronze then holds what PostgreSQL holds, changes after the sync included."""
    root = tmp_path / "lake"
    log_path = tmp_path / "stream.log"
    cmd = [sys.executable, "-m", "pipelines.cli", "--config", str(config), "ingest", "--trigger-seconds", "1",
           "--metrics-port", "0", "--spark-ui-port", "0"]
    with log_path.open("w") as log_file:
        stream = subprocess.Popen(cmd, env=own_environment(), stdout=log_file, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while "the stream starts from the positions" not in log_path.read_text(errors="replace"):
            assert stream.poll() is None, "the stream exited: " + log_path.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "the stream did not start its query"
            time.sleep(0.5)
        conn.execute(PAYMENTS_DDL)
        conn.execute("INSERT INTO payments SELECT g, 100 + g, g * 1.25 FROM generate_series(1, 30) g")
        with (tmp_path / "tables.toml").open("a") as tables:
            tables.write(PAYMENTS_TOML)
        synced = _lakehouse(config, "source", "sync", "--json")
        assert synced.returncode == 0, synced.stdout + synced.stderr[-3000:]
        conn.execute("UPDATE payments SET order_id = order_id + 1000 WHERE id % 4 = 0")
        conn.execute("DELETE FROM payments WHERE id % 7 = 0")
        conn.execute("INSERT INTO payments SELECT g, 100 + g, g * 1.25 FROM generate_series(31, 40) g")
        expected = dict(conn.execute("SELECT id, order_id FROM payments").fetchall())
        deadline, held = time.monotonic() + 240, None
        while held != expected:
            assert stream.poll() is None, "the stream exited: " + log_path.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, f"bronze/payments is not PostgreSQL's: {held}"
            time.sleep(2)
            if has_completed_commit(path := main_path("payments", str(root))):
                held = {r["id"]: r["order_id"] for r in read_table(path, ["id", "order_id"]).to_pylist()}
    finally:
        stream.send_signal(signal.SIGTERM)
        try:
            stream.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(stream.pid, signal.SIGKILL)
            stream.wait()
    assert stream.returncode == 0, log_path.read_text(errors="replace")[-3000:]


def _written_since(folder: Path, started: float) -> list[Path]:
    """The files below `folder` written since `started` (the folder is shared with the rest of the suite)."""
    return [f for f in folder.rglob("*") if f.is_file() and f.stat().st_mtime >= started] if folder.is_dir() else []


def test_real_source_secure(tmp_path: Path) -> None:
    started = time.time()
    home = Path(tempfile.mkdtemp(prefix="lakehouse-pg-secure-"))  # PostgreSQL runs as `postgres`: not under 0700
    home.chmod(0o755)
    with KafkaBroker(tmp_path / "kafka", secure_port=0) as broker:
        kafka = secure_kafka(broker)
        real = RealSource(home, free_port(), free_port(), schemas_enable=False, secure=True, kafka=kafka)
        try:
            postgres, worker = real.up()
            assert RealSource(home).secure and RealSource(home).kafka == kafka, "source.json keeps the security"
            settings, connect = postgres.source_settings(), worker.connect_settings()
            assert settings.password is not None and connect.password is not None
            passwords = {"postgres": settings.password.reveal(), "rest": connect.password.reveal(),
                         "kafka": broker.scram_password_file.read_text().strip()}

            with postgres.connect() as conn:
                conn.execute("INSERT INTO customers VALUES (%s, 'secure@example.com', 'Sec Ure', 'DE', now(), now())",
                             (ROW_ID,))
            change = _change(kafka, ROW_ID)
            assert change["op"] == "c" and change["after"]["email"] == "secure@example.com", change
            assert (slot_status(real.pg_port, settings) or {}).get("active"), "Debezium does not stream"
            with postgres.connect() as conn:
                conn.execute("DELETE FROM customers WHERE id = %s", (ROW_ID,))
                _workload(conn)
                config = write_config(tmp_path, kafka, real.target().source, connect)
                _pipeline_from_the_file(tmp_path, config, conn)
                _onboard_while_streaming(tmp_path, config, conn)

            # PostgreSQL: the wrong password, and the right one without TLS, are refused.
            with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
                psycopg.connect(**psycopg_options(settings) | {"password": "not-the-password"})  # type: ignore[arg-type]
            with pytest.raises(psycopg.OperationalError, match=r"no pg_hba\.conf entry"):
                psycopg.connect(**psycopg_options(settings) | {"sslmode": "disable"})  # type: ignore[arg-type]
            with psycopg.connect(postgres.dsn) as conn:  # the DSN: a passfile and the CA, no password
                assert conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone() == (True,)

            # Connect's REST API: 401 without the credentials; the connector's config names its password's file.
            status = f"{worker.url}/connectors/{CONNECTOR}/status"
            assert _rest_code(status, {}) == 401
            assert _rest_code(status, {"Authorization": "Basic bm9ib2R5Om5vdGhpbmc="}) == 401
            assert _rest_code(status, worker.headers()) == 200
            request = urllib.request.Request(f"{worker.url}/connectors/{CONNECTOR}/config", headers=worker.headers())
            with urllib.request.urlopen(request, timeout=10) as response:
                shown = response.read().decode()
            assert json.loads(shown)["database.password"].startswith("${file:"), shown
            assert json.loads(shown)["database.sslmode"] == "verify-full", shown

            # No generated password in the logs, the configs Connect reads, any process's command line, or what the
            # jobs wrote in their log folder (a job told nothing but its file logs to the checkout's .logs/: its
            # log, Spark's event log, the OpenLineage events).
            files = [worker.log_path, postgres.log_path, worker.work_dir / "worker.properties",
                     worker.work_dir / "connector.json", worker.work_dir / "rest-jaas.conf",
                     tmp_path / "killed.log", tmp_path / "ingest.log", tmp_path / "stream.log",
                     *(tmp_path / "lake").rglob("*"),
                     *_written_since(PROJECT_ROOT / ".logs", started)]
            everything = {str(f): f.read_bytes().decode(errors="replace") for f in files if f.is_file()} | \
                {"/proc/*/cmdline": "\n".join(command_lines().values())}
            for name, password in passwords.items():
                for where, text in everything.items():
                    assert password not in text, f"the {name} password is in {where}"
            assert "security.protocol=SASL_SSL" in everything[str(worker.work_dir / "worker.properties")]
            lineage = [text for where, text in everything.items() if where.endswith("spark.jsonl")]
            assert any("kafka://" in text for text in lineage), "no OpenLineage event of a Kafka read to look in"
            for secret in (worker.secrets_path, postgres.password_file, postgres.tls.server_key,
                           worker.rest_password_file):
                assert secret.stat().st_mode & 0o077 == 0, f"{secret} is readable by others"
        finally:
            real.down()
            for log in (real.connect.log_path, real.postgres.log_path):  # kept for a failure's reader
                if log.exists():
                    shutil.copy(log, tmp_path / log.name)
            shutil.rmtree(home, ignore_errors=True)
