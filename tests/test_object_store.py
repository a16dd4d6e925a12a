"""The whole pipeline on an object store: a real S3 API server (moto server, no AWS) and LAKEHOUSE_ROOT=s3://lake/...

One lean lake, every command as operators run it: ingest SIGKILLed mid-run and re-run (its
checkpoint on the store), etl, changes, services, quality (results and Data Docs on the
store), status, show, dead-letters, and an erasure with its verification (the registry, the
certificate and the audit log on the store, the file scan over the store). Tables are read
with Spark and hudi-rs and compared to the model. Nothing is mocked: moto here is the S3
server that Spark reaches through S3A, hudi-rs and pyarrow through their own S3 clients.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pipelines import storage
from pipelines.contract import TABLES
from pipelines.devtools.generator import ShopSource, WorkloadConfig, ensure_topics, produce
from pipelines.devtools.object_store import BUCKET, ObjectStore
from pipelines.services.quality import data_docs_index
from pipelines.settings import changelog_path, gdpr_path, ingest_checkpoint_path, main_path, silver_path
from tests.hudi_files import not_completed
from tests.kill import run_until
from tests.lake import assert_bronze_equals_model, assert_lake_equals_model, dead_letters, run_cli
from tests.model import expected_silver, fold_with_lsn, is_malformed
from tests.test_gdpr import _orders_stayed, erased_model, orders_of, texts_of

pytestmark = pytest.mark.slow



@pytest.fixture(scope="module")
def object_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ObjectStore]:
    with ObjectStore(tmp_path_factory.mktemp("s3"), 0) as store:
        yield store


def _point_session_at(spark: SparkSession, store: ObjectStore) -> None:
    """The suite's Spark JVM started before the store: give its S3A what a new JVM reads from the environment."""
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    env = store.env()
    conf.set("fs.s3a.endpoint", env["AWS_ENDPOINT_URL"])
    conf.set("fs.s3a.access.key", env["AWS_ACCESS_KEY_ID"])
    conf.set("fs.s3a.secret.key", env["AWS_SECRET_ACCESS_KEY"])


def _commit_in_flight(root: str) -> Callable[[str], bool]:
    """True once a bronze table's timeline on the store holds an instant not completed (polled every 0.5 s).

    The kill's moment follows the job, not the clock: under the suite's load a kill timed in
    seconds after the first batch started could land before any commit.
    """
    polled = [0.0]

    def seen(_log: str) -> bool:
        if time.monotonic() - polled[0] < 0.5:
            return False
        polled[0] = time.monotonic()
        return any(not_completed(storage.list_dir(f"{path}/.hoodie/timeline"))
                   for path in [main_path(t, root) for t in TABLES] + [changelog_path(t, root) for t in TABLES])
    return seen


# Every Hudi commit is hundreds of requests to moto: 1,020 s beside the rest of the suite (2026-11-25).
@pytest.mark.timeout(2400)
def test_the_pipeline_on_an_object_store(spark, broker, object_store: ObjectStore, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    root = f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}"
    env = {**object_store.env(), "LAKEHOUSE_ROOT": root, "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
           "LAKEHOUSE_ERASURE_KEY_FILE": str(tmp_path / "erasure.key")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    _point_session_at(spark, object_store)
    monkeypatch.chdir(tmp_path)  # anything written to a local path by mistake would land here

    source = ShopSource(17)
    cfg = WorkloadConfig(seed=17, customers=40, orders=100, changes=150, malformed_fraction=0.03,
                         invalid_fraction=0.1, delete_fraction=0.08)
    ensure_topics(broker.bootstrap)
    sent = source.snapshot(cfg) + source.changes(cfg)
    produce(sent, broker.bootstrap)

    # Ingest, killed (the whole process group) while a commit of a bronze table is in flight
    # on the store, then run again with more changes (and replays) on the topics: bronze equals the model.
    cmd = [sys.executable, "-m", "pipelines.cli", "ingest", "--once", "--max-offsets-per-trigger", "120"]
    assert run_until(cmd, {**os.environ, **env}, tmp_path / "killed.log", _commit_in_flight(root)), \
        "the ingest run was not killed"
    more = source.changes(WorkloadConfig(seed=17, changes=60, malformed_fraction=0.03, replay_runs=1))
    produce(more, broker.bootstrap)
    sent += more
    done = run_cli("ingest", "--once")
    assert done.exit_code == 0, done.stderr[-3000:]
    expected, lsns = fold_with_lsn(sent)
    assert_bronze_equals_model(spark, root, expected, lsns)
    letters = dead_letters(root)
    assert len(letters) == sum(is_malformed(m) for m in sent) > 0
    assert any(f.startswith("offsets/") for f in storage.list_files(ingest_checkpoint_path(root))), \
        "the stream's checkpoint is not on the store"

    # etl before any erasure: no registry yet, and none is read.
    assert not storage.list_files(gdpr_path(root))
    done = run_cli("etl")
    assert done.exit_code == 0, done.stderr[-3000:]
    assert_lake_equals_model(spark, root, source.state)

    ckpt = tmp_path / "customers.ckpt"
    done = run_cli("changes", "silver/customers", "--checkpoint-file", str(ckpt))
    assert done.exit_code == 0, done.stderr[-3000:]
    upserts = {json.loads(line)["id"] for line in done.stdout.splitlines()}
    assert upserts == set(expected_silver(source.state)[0]["customers"]) and "snapshot:" in done.stderr
    again = run_cli("changes", "silver/customers", "--checkpoint-file", str(ckpt))
    assert again.exit_code == 0 and again.stdout == "", again.stderr[-3000:]

    done = run_cli("services", "--table", "bronze/orders", "--table", "silver/orders")
    assert done.exit_code == 0, done.stderr[-3000:]
    assert {json.loads(line)["table"] for line in done.stdout.splitlines()} == {"bronze/orders", "silver/orders"}
    assert_bronze_equals_model(spark, root, expected, lsns)

    done = run_cli("quality")
    assert done.exit_code == 0, done.stdout[-3000:]
    assert storage.exists(data_docs_index(root)), "no Data Docs on the store"
    assert any(f.startswith("gx/uncommitted/validations/") for f in storage.list_files(f"{root}/_quality"))

    status = run_cli("status")
    assert status.exit_code == 0, status.stderr[-3000:]
    assert f"lake root: {root}" in status.stdout
    for table in TABLES:
        (line,) = [x for x in status.stdout.splitlines() if x.startswith(f"bronze/{table} ")]
        assert int(line.split()[1]) == len(expected[table]), line
    shown = run_cli("show", "gold/customer_ltv", "--limit", "3")
    assert shown.exit_code == 0 and shown.stdout.startswith("gold/customer_ltv: "), shown.stderr[-3000:]
    listed = run_cli("dead-letters", "list", "--limit", "1")
    assert listed.exit_code == 0 and listed.stdout.startswith(f"{len(letters)} dead letters"), listed.stderr[-3000:]

    # An erasure: registry, certificate and audit log on the store; verified by reads and a
    # scan of every file on the store.
    state = source.state
    victim = next(c for c in sorted({o["customer_id"] for o in state["orders"].values()} & state["customers"].keys())
                  if _orders_stayed(sent, state, c))
    orders, texts = orders_of(sent, {victim}), texts_of(sent, {victim})
    done = run_cli("gdpr", "erase", "--customer-id", str(victim), "--reference", "REQ-S3-1", "--requested-by", "dpo")
    assert done.exit_code == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.splitlines()[-1])
    assert summary["verified"] and summary["status"] == "erased" and summary["rows_removed"] > 0, summary
    assert summary["certificate"].startswith(f"{root}/_gdpr/certificates/"), summary["certificate"]
    certificate = json.loads(storage.read_text(summary["certificate"]))
    scan = certificate["verification"]["scan"]
    assert scan["findings"] == 0 and scan["files"] > 0, scan
    audit = storage.read_text(f"{gdpr_path(root)}/audit.jsonl")
    for text in (json.dumps(certificate), audit):
        assert not [t for t in texts if t.lower() in text.lower()], "the certificate or audit log holds personal data"
    assert storage.list_files(f"{gdpr_path(root)}/erased"), "the registry is not on the store"

    expected, lsns = erased_model(sent, {victim}, orders)
    assert_bronze_equals_model(spark, root, expected, lsns)
    assert_lake_equals_model(spark, root, expected)
    assert not any(Path(tmp_path).glob("**/_gdpr")) and not any(Path(tmp_path).glob("**/_quality")), \
        "something of the lake was written to the local disk"
    assert storage.list_files(silver_path("customers", root))
