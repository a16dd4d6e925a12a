"""The whole pipeline on an object store: a real S3 API server (moto server, no AWS) and LAKEHOUSE_ROOT=s3://lake/...

One lean lake, every command as operators run it: ingest SIGKILLed mid-run and re-run (its
checkpoint on the store), etl, changes, services, quality (results and Data Docs on the
store), status, show, dead-letters, and an erasure with its verification (the registry, the
certificate and the audit log on the store, the file scan over the store). Tables are read
with Spark and hudi-rs and compared to the model. Nothing is mocked: moto here is the S3
server that Spark reaches through S3A, hudi-rs and pyarrow through their own S3 clients.

Every client reaches the store through Toxiproxy, and the store fails the requests of etl's
commits, of the services' compaction and cleaning, and of the erasure as S3 does under load and
across a flaky network: connections reset and stalled (Toxiproxy), `503 SlowDown`
answered by the store itself. The clients' retries must carry every step through, whole.
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from lakehouse_dev.generator import ShopSource, WorkloadConfig, ensure_topics, produce
from lakehouse_dev.object_store import BUCKET, ObjectStore
from lakehouse_dev.supervised import Supervised
from lakehouse_dev.toxiproxy import Proxy, Toxiproxy
from pipelines.lake import storage
from pipelines.lake.contract import TABLES
from pipelines.lake.layout import changelog_path, gdpr_path, ingest_checkpoint_path, main_path, silver_path
from pipelines.lake.storage import is_transient
from pipelines.runtime.local_process import HOST, free_port
from pipelines.services.quality import data_docs_index
from tests.hudi_files import not_completed
from tests.kill import run_until, wait_caught_up
from tests.lake import assert_bronze_equals_model, assert_lake_equals_model, dead_letters, run_cli
from tests.model import expected_silver, fold_with_lsn, is_malformed
from tests.test_faults_kafka import STREAM_LIMITS, mid_batch
from tests.test_gdpr import _orders_stayed, erased_model, orders_of, texts_of

pytestmark = [pytest.mark.slow, pytest.mark.environment]

# How long the store is cut off under a batch of the stream (LAKEHOUSE_FAULT_STORE_BLACKOUT sets it).
BLACKOUT = float(os.environ.get("LAKEHOUSE_FAULT_STORE_BLACKOUT", "15"))



@pytest.fixture(scope="module")
def object_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ObjectStore]:
    with ObjectStore(tmp_path_factory.mktemp("s3"), 0) as store:
        yield store


@pytest.fixture
def store_proxy(object_store: ObjectStore, tmp_path: Path) -> Iterator[tuple[str, Proxy]]:
    """The store reached through Toxiproxy: its endpoint for every client, and the proxy to put faults on."""
    toxiproxy = Toxiproxy(tmp_path / "toxiproxy").start()
    try:
        listen = f"{HOST}:{free_port()}"
        yield f"http://{listen}", toxiproxy.client.create("s3", listen, f"{HOST}:{object_store.port}")
    finally:
        toxiproxy.stop()


# The faults' rates. Each SlowDown costs the client a backoff (S3A's SDK waits 250 to 500 ms before its first
# retry of a throttled request), each stall its length, and a Hudi commit's requests are mostly one after the
# other on the driver: at 3% SlowDown, 5% resets and 2% stalls of 3 s etl alone runs over 8 minutes, and at
# 0.5%, 3% and 1% of 1 s the faults add two thirds to the test's time. At these,
# etl's 6,267 requests meet about 12 SlowDowns and the erasure's 27,090 about 54 (none in etl: e^-12); the
# services' 571 requests meet one or none (not asserted there). More faults would take the same retry paths
# more often, and only add backoffs. A stall of 1 s takes the client down the same path as one of 3 (the
# connection hangs, then closes under the request).
SLOW_DOWN, RESETS, STALLS, STALL_MS = 0.002, 0.01, 0.003, 1000


@contextmanager
def store_faults(proxy: Proxy, store: ObjectStore, step: str) -> Iterator[dict[str, int]]:
    """What S3 does under load and across a flaky network, to the requests made inside the block: connections
    reset and stalled then dropped (Toxiproxy), requests answered `503 SlowDown` (the store itself). Yields
    the store's counts of requests and SlowDowns in the block, filled in at the end, and prints them."""
    before, started = store.slow_down(SLOW_DOWN), time.monotonic()
    toxics = [proxy.add_toxic("reset_peer", {"timeout": 0}, name="resets", toxicity=RESETS),
              proxy.add_toxic("timeout", {"timeout": STALL_MS}, name="stalls", toxicity=STALLS)]
    seen: dict[str, int] = {}
    try:
        yield seen
    finally:
        for toxic in toxics:
            toxic.remove()
        seen.update({k: v - before[k] for k, v in store.slow_down(0).items()})
        print(f"\n{step} under the store's faults: {time.monotonic() - started:.1f} s, {seen['requests']} requests, "
              f"{seen['slow_down']} answered SlowDown")


def _point_session_at(spark: SparkSession, store: ObjectStore, endpoint: str) -> None:
    """The suite's Spark JVM started before the store: give its S3A what a new JVM reads from the environment."""
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    env = store.env()
    conf.set("fs.s3a.endpoint", endpoint)
    conf.set("fs.s3a.access.key", env["AWS_ACCESS_KEY_ID"])
    conf.set("fs.s3a.secret.key", env["AWS_SECRET_ACCESS_KEY"])


def pending_instants_on(paths: list[str]) -> list[str]:
    """Instants not completed on the timelines of the tables at `paths` on the store."""
    return [f"{p}:{i}" for p in paths for i in not_completed(storage.list_dir(f"{p}/.hoodie/timeline"))]


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
        return any(pending_instants_on([path])
                   for path in [main_path(t, root) for t in TABLES] + [changelog_path(t, root) for t in TABLES])
    return seen


# Every Hudi commit is hundreds of requests to moto: about 17 minutes beside the rest of the suite.
def test_a_small_file_read_through_slow_downs(object_store: ObjectStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `503 SlowDown` answering a GetObject of a small file fails past the AWS SDK's retries: the SDK writes the
    error's body into the buffer pyarrow sized to the file, overflows it, and gives up ("Failed to flush response
    stream", INTERNAL_FAILURE). storage reads such a file again."""
    for key, value in object_store.env().items():
        monkeypatch.setenv(key, value)
    uri, data = f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}/small", os.urandom(60)
    storage.write_bytes(uri, data)
    transient = []

    def counted(error: BaseException) -> bool:
        transient.append(found := is_transient(error))
        return found

    monkeypatch.setattr(storage, "is_transient", counted)
    object_store.slow_down(0.3)
    try:
        reads = [storage.read_bytes(uri) for _ in range(20)]
    finally:
        object_store.slow_down(0)
    assert all(r == data for r in reads)
    assert any(transient), "no read met a SlowDown past the SDK: the test proved nothing"
    assert not is_transient(FileNotFoundError("AWS Error NETWORK_CONNECTION")), "a missing file is final"


@pytest.mark.timeout(2400)
def test_the_pipeline_on_an_object_store(spark, broker, object_store: ObjectStore, store_proxy: tuple[str, Proxy],
                                         tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}"
    endpoint, proxy = store_proxy
    env = {**object_store.env(), "AWS_ENDPOINT_URL": endpoint, "LAKEHOUSE_ROOT": root,
           "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap, "LAKEHOUSE_ERASURE_KEY_FILE": str(tmp_path / "erasure.key")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    _point_session_at(spark, object_store, endpoint)
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

    # The supervised stream on the store (`lakehouse stream start`, as the DAG runs it), and the store cut off
    # (the proxy disabled: every connection through it closed and refused) for BLACKOUT s under one of its
    # batches. The stream rides it through or dies of it; `stream ensure`, as the DAG runs it every 5 minutes,
    # starts a dead one again from the checkpoint on the store. Bronze ends equal to the model.
    stream = Supervised(tmp_path / "stream", broker.bootstrap, STREAM_LIMITS, extra_env=env)
    with stream.running():
        mid_batch(stream, source.changes(WorkloadConfig(seed=18, changes=150, malformed_fraction=0.03, replay_runs=1)),
                  broker.bootstrap, sent, timeout=180)
        with proxy.blackout():
            time.sleep(BLACKOUT)
        back = time.monotonic()
        ensured = stream.run("ensure")
        expected, lsns = fold_with_lsn(sent)
        wait_caught_up(root, expected, stream.log_path)
        print(f"\nstore cut off {BLACKOUT:.0f} s under a batch: bronze caught up {time.monotonic() - back:.1f} s after "
              f"it was back; ensure said: {ensured}")
    assert_bronze_equals_model(spark, root, expected, lsns)
    letters = dead_letters(root)
    assert len(letters) == sum(is_malformed(m) for m in sent)

    # etl before any erasure: no registry yet, and none is read.
    assert not storage.list_files(gdpr_path(root))
    # Every write of the lake from here on meets the store's faults: etl's commits, the services' compaction
    # and cleaning, the erasure. Each client retries them (S3A, pyarrow's and hudi-rs's S3 clients), and the
    # lake after each step is the model's, whole.
    with store_faults(proxy, object_store, "etl") as faults:
        done = run_cli("etl")
    assert done.exit_code == 0, done.stderr[-3000:]
    assert faults["slow_down"] > 0, "no request met a fault"
    assert_lake_equals_model(spark, root, source.state)

    ckpt = tmp_path / "customers.ckpt"
    done = run_cli("changes", "silver/customers", "--checkpoint-file", str(ckpt))
    assert done.exit_code == 0, done.stderr[-3000:]
    upserts = {json.loads(line)["id"] for line in done.stdout.splitlines()}
    assert upserts == set(expected_silver(source.state)[0]["customers"]) and "snapshot:" in done.stderr
    again = run_cli("changes", "silver/customers", "--checkpoint-file", str(ckpt))
    assert again.exit_code == 0 and again.stdout == "", again.stderr[-3000:]

    with store_faults(proxy, object_store, "services") as faults:
        done = run_cli("services", "--table", "bronze/orders", "--table", "silver/orders")
    assert done.exit_code == 0, done.stderr[-3000:]
    assert faults["requests"] > 0, "the services made no request"
    assert not pending_instants_on([main_path("orders", root), silver_path("orders", root)]), \
        "a service left an instant in flight"
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
    with store_faults(proxy, object_store, "the erasure") as faults:
        done = run_cli("gdpr", "erase", "--customer-id", str(victim), "--reference", "REQ-S3-1",
                       "--requested-by", "dpo")
    assert done.exit_code == 0, done.stderr[-3000:]
    assert faults["slow_down"] > 0, "no request met a fault"
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
