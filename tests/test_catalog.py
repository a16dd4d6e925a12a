"""The lake's tables by name in a real Hive Metastore (`make catalog-up`'s), kept in step by the writers.

One lake copy goes through: a catalog sync of the lake as it was; a round of ingest and etl (then
time T1); a round with the metastore stopped that adds a column at the source (the writers go on,
the catalog falls behind and `catalog status` says so; it catches up, column included, when the
metastore is back); a
consumer's own PySpark job that finds every table by name, reads silver and gold equal to the lake
(itself checked against the model), reads silver as of T1 equal to the lake then, and sees the
added column; then an erasure, after which `lakehouse sql` finds none of the subject's rows by
name and the metastore's own files hold none of the subject's data.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from lakehouse_dev.metastore import Metastore
from pipelines.gdpr.erase import erase
from pipelines.gdpr.request import parse_request
from pipelines.ingest.bronze import run_ingest
from pipelines.lake.catalog import lake_tables
from pipelines.lake.contract import TABLES
from pipelines.lake.hudi_timeline import latest_completion
from pipelines.metastore import catalog_sync
from pipelines.runtime.lake import Lake
from pipelines.runtime.settings import jvm_dir
from pipelines.transform.etl import run_etl
from tests.lake import LakeCopy, assert_lake_equals_model, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.environment]

BY_NAME = [f"silver.{t}" for t in TABLES] + ["gold.customer_ltv", "gold.daily_revenue"]


@pytest.fixture(scope="module")
def metastore(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Metastore]:
    with Metastore(tmp_path_factory.mktemp("metastore"), port=0) as running:
        yield running


def _rows(spark: SparkSession, path: str, as_of: str | None = None) -> list[dict]:
    reader = spark.read.format("hudi")
    if as_of:
        reader = reader.option("as.of.instant", as_of)
    return sorted((json.loads(r) for r in reader.load(path).toJSON().collect()), key=json.dumps)


def _parsed(rows: list[str]) -> list[dict]:
    return sorted((json.loads(r) for r in rows), key=json.dumps)


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pipelines.cli", *args], env=env, capture_output=True, text=True,
                          timeout=600, check=False)


def test_tables_by_name_follow_the_lake(spark: SparkSession, lake: LakeCopy, metastore: Metastore, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    root, src = lake.root, lake.source
    env = {"LAKEHOUSE_ROOT": root, "KAFKA_BOOTSTRAP_SERVERS": lake.bootstrap, "LAKEHOUSE_METASTORE_URI": metastore.uri,
           "LAKEHOUSE_ERASURE_KEY_FILE": str(tmp_path / "erasure.key")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(catalog_sync, "RETRY_SECONDS", 1.0)
    env = {**os.environ, **env}

    def round_(messages: list) -> None:
        lake.produce(messages)
        run_ingest(Lake.at(root, spark), once=True, bootstrap=lake.bootstrap)
        run_etl(Lake.at(root, spark))

    # The lake was written before the catalog existed: one command registers all of it.
    done = run_cli("catalog", "sync")
    assert done.exit_code == 0, done.output
    registered = [t for t in lake_tables(root, Lake.at(root).declaration) if (Path(t.path) / ".hoodie").is_dir()]
    assert len(done.stdout.splitlines()) == len(registered)

    # A round synced by its writers, then T1: the lake equals the model, and is kept to compare with later.
    round_(src.changes(lake.cfg))
    assert not catalog_sync.flush(), "the catalog did not follow a round"
    assert_lake_equals_model(spark, root, src.state)
    at_t1 = {name: _rows(spark, f"{root}/{name.replace('.', '/')}") for name in BY_NAME}
    t1 = max(latest_completion(spark, f"{root}/{name.replace('.', '/')}") for name in BY_NAME)
    time.sleep(1.0)  # the next commit's instant is later than T1 by more than the timeline's millisecond

    # The metastore goes down: every writer goes on, the catalog falls behind and says so (no retry by
    # the clock until the end of the test's flush: what `catalog status` sees is this round's doing).
    # Meanwhile the source adds a column (contract section 6), which the catalog must catch up with too.
    monkeypatch.setattr(catalog_sync, "RETRY_SECONDS", 600.0)
    metastore.down()
    started = time.monotonic()
    src.alter("customers", add={"loyalty_tier": "string"})
    changed = sorted(src.state["customers"])[:5]
    added = [m for i in changed for m in src.update("customers", i, {"loyalty_tier": "gold"}, lake.cfg)]
    round_(added + src.changes(lake.cfg))
    behind = catalog_sync.flush(timeout=30)
    assert behind and "silver.customers" in behind, behind
    outage_round = time.monotonic() - started
    metastore.up()
    status = _cli(["catalog", "status"], env)
    assert status.returncode == 1 and "catalog is behind on" in status.stdout, status.stdout + status.stderr[-2000:]
    lagging = status.stdout.split("catalog is behind on", 1)[1]
    assert all(t in lagging for t in behind), status.stdout
    assert not catalog_sync.flush(timeout=60), "the catalog did not catch up once the metastore was back"
    assert_lake_equals_model(spark, root, src.state)
    now = {name: _rows(spark, f"{root}/{name.replace('.', '/')}") for name in BY_NAME}

    # A consumer's own job, by name only.
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({
        "metastore": metastore.uri, "bundle": str(jvm_dir() / "spark" / "hudi-spark3.5-bundle_2.12-1.0.2.jar"),
        "queries": {name: f"SELECT * FROM {name}" for name in BY_NAME},
        "as_of": {f"{name}@t1": [f"SELECT * FROM {name}", t1] for name in BY_NAME},
        "describe": ["bronze.customers_rt", "bronze.customers_ro", "silver.customers", "bronze._changelog_customers"],
        "bad": {"unknown": ["SELECT * FROM silver.ordrs", None],
                "too old": ["SELECT * FROM silver.customers", "2000-01-01"]}}))
    job = subprocess.run([sys.executable, "-m", "tests.catalog_consumer", str(spec)], env=env, capture_output=True,
                         text=True, timeout=600, check=False)
    assert job.returncode == 0, job.stderr[-3000:]
    seen = json.loads(job.stdout.splitlines()[-1])
    for table in registered:  # every table the lake has (a delete ledger appears with the first expiry)
        layer, name = catalog_sync.catalog_name(table.name).split(".")
        names = {name, f"{name}_rt", f"{name}_ro"} if table.merge_on_read else {name}
        assert names <= set(seen["tables"][layer]), (table.name, seen["tables"][layer])
        assert seen["properties"][f"{layer}.{name}"]["last_commit_time_sync"], table.name
    for name in BY_NAME:
        assert _parsed(seen["rows"][name]) == now[name], f"{name} by name differs from the lake"
        assert _parsed(seen["rows"][f"{name}@t1"]) == at_t1[name], f"{name} as of {t1} differs from the lake then"
    assert at_t1["silver.customers"] != now["silver.customers"]
    assert "loyalty_tier" in seen["columns"]["bronze.customers_rt"], seen["columns"]["bronze.customers_rt"]
    assert "loyalty_tier" in seen["columns"]["bronze._changelog_customers"]
    assert seen["partitions"]["bronze._changelog_customers"], "the change log's days are not in the catalog"
    assert "no table silver.ordrs in the catalog (silver has: " in seen["bad"]["unknown"], seen["bad"]["unknown"]
    assert ", orders)" in seen["bad"]["unknown"]
    assert "holds no version as of 20000101000000000" in seen["bad"]["too old"], seen["bad"]["too old"]
    assert "oldest retained commit" in seen["bad"]["too old"]

    # An erasure: by name, nothing of the subject; in the metastore's files, none of their data.
    victim = next(c for c in sorted(src.state["customers"])
                  if any(o["customer_id"] == c for o in src.state["orders"].values()))
    person = src.state["customers"][victim]
    certificate = erase(Lake.at(root, spark), parse_request([victim], "REQ-CATALOG-1", "dpo"),
                        bootstrap=lake.bootstrap)
    assert certificate.verified, certificate.verification.failures
    assert not catalog_sync.flush()
    where = {"bronze.customers_rt": "id", "bronze.customers_ro": "id", "silver.customers": "id",
             "bronze.orders_rt": "customer_id", "silver.orders": "customer_id", "gold.customer_ltv": "customer_id"}
    union = " UNION ALL ".join(f"SELECT '{t}' AS t, count(*) AS n FROM {t} WHERE {c} = {victim}"
                               for t, c in where.items())
    found = _cli(["sql", "--json", "--as-of", time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(time.time() + 5)),
                  union], env)
    assert found.returncode == 0, found.stderr[-3000:]
    counts = {r["t"]: r["n"] for r in map(json.loads, found.stdout.splitlines())}
    assert counts == dict.fromkeys(where, 0), counts
    texts = [str(person[c]).encode() for c in ("email", "full_name") if person.get(c)]
    assert texts
    for path in metastore.home.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert not [t for t in texts if t in data], f"the metastore's {path.name} holds the subject's data"
    print(f"outage round {outage_round:.1f} s")
