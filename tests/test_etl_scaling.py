"""An etl cycle's work grows with the change, not with the table: rows and files read, small vs 10x table.

Two lakes are built from generated databases of 300 and 3,000 customers (3 orders each), then
both receive the same change: the same kinds of change on the same keys. What the cycle reads
is taken from Spark's own metrics (pipelines.metrics). Files are capped at 64 KiB so that the
small tables span several files too: in production the cap is 120 MiB and the argument is the
same at that scale, a changed key costs the files that hold it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.bronze import run_ingest
from pipelines.etl import run_etl
from pipelines.generator import ShopSource, WorkloadConfig, ensure_topics, produce
from pipelines.kafka_local import KafkaBroker, free_port
from pipelines.metrics import ReadMeter, Reads
from tests.lake import assert_gold_equals_model

CAP = """
"hoodie.parquet.max.file.size" = 65536
"hoodie.parquet.small.file.limit" = 32768
"""


def _the_change(source: ShopSource) -> list:
    """Country of 10 customers, 3 customers deleted, 10 orders cancelled, 5 re-priced, 5 deleted."""
    out = []
    for cid in range(1, 11):
        current = source.state["customers"][cid]["country"]
        out += source.update("customers", cid, {"country": "SE" if current != "SE" else "NO"})
    for cid in range(11, 14):
        out += source.delete("customers", cid)
    for oid in range(1, 11):
        out += source.update("orders", oid, {"status": "cancelled"})
    for oid in range(11, 16):
        out += source.update("orders", oid, {"amount": "12.34"})
    for oid in range(16, 21):
        out += source.delete("orders", oid)
    return out


def _cycle_reads(spark, tmp: Path, customers: int) -> tuple[Reads, Reads]:
    """(reads of the first, full cycle; reads of the cycle after the change), gold checked after each."""
    root = str(tmp / f"lake-{customers}")
    broker = KafkaBroker(tmp / f"kafka-{customers}", port=free_port())
    broker.start()
    try:
        ensure_topics(broker.bootstrap)
        source = ShopSource(5)
        cfg = WorkloadConfig(seed=5, customers=customers, orders=3 * customers, invalid_fraction=0.0,
                             orphan_fraction=0.05)
        produce(source.snapshot(cfg), broker.bootstrap)
        run_ingest(once=True, root=root, bootstrap=broker.bootstrap, spark=spark)
        with ReadMeter(spark) as full:
            run_etl(spark, root)
        produce(_the_change(source), broker.bootstrap)
        run_ingest(once=True, root=root, bootstrap=broker.bootstrap, spark=spark)
        with ReadMeter(spark) as incremental:
            run_etl(spark, root)
        assert_gold_equals_model(spark, root, source.state)
        return full.result, incremental.result
    finally:
        broker.stop()


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=(
    "not yet proportional (measured, 300 vs 3,000 customers): the silver step's incremental read of "
    "bronze (merge-on-read) reads whole file slices, about the table (429 -> 3,207 rows); the state "
    "step's keyed read and record-index lookups open 334 -> 1,216 files; daily_revenue 52 -> 161 files"))
def test_cycle_reads_grow_with_the_change_not_the_table(spark, tmp_path, monkeypatch) -> None:
    overrides = tmp_path / "file-cap.toml"
    overrides.write_text(f"[silver.table]{CAP}[gold.common]{CAP}")
    monkeypatch.setenv("LAKEHOUSE_HUDI_OVERRIDES", str(overrides))
    small_full, small = _cycle_reads(spark, tmp_path, 300)
    large_full, large = _cycle_reads(spark, tmp_path, 3000)
    print(f"\nfull cycle:        small {small_full.as_dict()}\n                   10x   {large_full.as_dict()}"
          f"\nincremental cycle: small {small.as_dict()}\n                   10x   {large.as_dict()}")
    # The metric sees table size: the first (full) cycle reads about ten times as much.
    assert large_full.rows_read > 6 * small_full.rows_read
    # The same change on a ten times larger table: about the same work (well under 2x).
    assert large.rows_read < 2 * small.rows_read, (small, large)
    assert large.files_read < 2 * small.files_read, (small, large)
