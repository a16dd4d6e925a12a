"""An incremental-ETL consumer of `read_changes` keeps an exact replica, seeing each change once."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from pipelines.bronze import run_ingest
from pipelines.changes import read_changes
from pipelines.etl import run_etl
from pipelines.generator import ShopSource, WorkloadConfig, ensure_topics, produce
from pipelines.settings import CHANGE_FEED_TABLES
from tests.lake import ingested_lake

TABLES = tuple(CHANGE_FEED_TABLES)


def _key(table: str, row: dict) -> tuple:
    return tuple(row[k] for k in CHANGE_FEED_TABLES[table])


def _snapshot(spark, root: str, table: str) -> dict[tuple, dict]:
    df = spark.read.format("hudi").load(f"{root}/{table}")
    return {_key(table, r): {c: r[c] for c in df.columns if not c.startswith("_hoodie")} for r in df.collect()}


def test_consumer_replicas_equal_the_tables_and_see_deletes(spark, broker, tmp_path) -> None:
    root = str(tmp_path / "lake")
    source = ShopSource(44)
    cfg = WorkloadConfig(seed=44, customers=100, orders=300, changes=900, delete_fraction=0.1)
    ensure_topics(broker.bootstrap)
    replicas: dict[str, dict[tuple, dict]] = {t: {} for t in TABLES}
    checkpoints: dict[str, str | None] = dict.fromkeys(TABLES)
    deletes_seen = dict.fromkeys(TABLES, 0)
    batches = [source.snapshot(cfg) + source.changes(cfg), source.changes(cfg), source.changes(cfg)]
    for batch in batches:
        produce(batch, broker.bootstrap)
        run_ingest(once=True, root=root, bootstrap=broker.bootstrap, spark=spark)
        run_etl(spark, root)
        for table in TABLES:
            change_set = read_changes(spark, table, checkpoints[table], root)
            assert change_set.snapshot == (checkpoints[table] is None), table
            rows = [r.asDict() for r in change_set.rows.collect()]
            keys = [_key(table, r) for r in rows]
            assert len(keys) == len(set(keys)), f"{table}: a key twice in one read"
            for key, row in zip(keys, rows, strict=True):
                if row.pop("_change") == "delete":
                    deletes_seen[table] += replicas[table].pop(key, None) is not None
                else:
                    replicas[table][key] = row
            checkpoints[table] = change_set.checkpoint
            want = _snapshot(spark, root, table)
            got = {k: {c: v[c] for c in want[k]} for k, v in replicas[table].items() if k in want}
            assert replicas[table].keys() == want.keys(), f"{table}: replica keys differ from the table"
            assert got == want, f"{table}: replica rows differ from the table"
            again = read_changes(spark, table, change_set.checkpoint, root)
            assert again.rows.count() == 0, f"{table}: reading from the new checkpoint returned rows again"
    assert all(deletes_seen[t] > 0 for t in TABLES), f"deletes seen by the consumer: {deletes_seen}"


def test_cli_changes_with_a_checkpoint_file(broker, spark, tmp_path) -> None:
    root = str(tmp_path / "lake")
    cfg = WorkloadConfig(seed=45, customers=30, orders=60, changes=100)
    source = ingested_lake(spark, broker.bootstrap, root, cfg)
    env = {**os.environ, "LAKEHOUSE_ROOT": root}
    ckpt = tmp_path / "ckpt"
    cmd = [sys.executable, "-m", "pipelines.cli", "changes", "bronze/customers", "--checkpoint-file", str(ckpt)]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-2000:]
    lines = [json.loads(line) for line in first.stdout.splitlines()]
    upserts = {r["id"] for r in lines if r["_change"] == "upsert"}
    deletes = {r["id"] for r in lines if r["_change"] == "delete"}
    # From the start: every live customer once, and keys deleted so far as deletions.
    assert upserts == set(source.state["customers"]) and len(upserts) == sum(r["_change"] == "upsert" for r in lines)
    assert not deletes & upserts
    assert ckpt.read_text().strip()
    second = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert second.returncode == 0 and second.stdout == "", second.stderr[-2000:]
