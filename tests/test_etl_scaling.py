"""An etl cycle's work grows with the change, not with the table: rows and files read, small vs 10x table.

Two lakes are built from generated databases of 50 and 500 customers (3 orders each), then
both receive the same change: the same kinds of change on the same keys. What each step of
the cycle reads is taken from Spark's own metrics (pipelines.monitoring.metrics). Files are capped at
16 KiB so that the small tables span many more files than the change touches: in production
the cap is 120 MiB and the argument is the same at that scale, a changed key costs the files
that hold it.

daily_revenue is the one step that reads whole partitions: the days the change touches. A day
holds at most one row per country and currency whatever the order volume, so its cost per
touched day is bounded, not proportional to the change; the test checks that bound."""

from __future__ import annotations

from pathlib import Path

import pytest

from lakehouse_dev.generator import COUNTRIES, ShopSource, WorkloadConfig, ensure_topics, produce
from lakehouse_dev.kafka_local import KafkaBroker
from pipelines.ingest.bronze import run_ingest
from pipelines.lake.contract import CURRENCIES
from pipelines.lake.layout import silver_path
from pipelines.monitoring.metrics import ReadMeter, Reads
from pipelines.runtime.lake import Lake
from pipelines.transform import gold
from pipelines.transform.etl import silver_cycle
from tests.lake import assert_gold_equals_model, with_overrides

pytestmark = pytest.mark.integration

DAILY = "gold/daily_revenue"

CAP = """
"hoodie.parquet.max.file.size" = 16384
"hoodie.parquet.small.file.limit" = 8192
"""


def _the_change(source: ShopSource) -> list:
    """Country of 3 customers, 1 customer deleted, 2 orders cancelled, 2 re-priced, 1 deleted."""
    out = []
    for cid in range(1, 4):
        current = source.state["customers"][cid]["country"]
        out += source.update("customers", cid, {"country": "SE" if current != "SE" else "NO"})
    out += source.delete("customers", 4)
    for oid in range(1, 3):
        out += source.update("orders", oid, {"status": "cancelled"})
    for oid in range(3, 5):
        out += source.update("orders", oid, {"amount": "12.34"})
    out += source.delete("orders", 5)
    return out


def _steps(spark, root: str) -> tuple[dict[str, Reads], dict[str, dict[str, int]]]:
    """One etl cycle, step by step as `run_etl` runs it: what each step read, and its counts."""
    silver = silver_path("customers", root), silver_path("orders", root)
    steps = {
        "silver/customers": lambda: silver_cycle(Lake.at(root, spark), "customers"),
        "silver/orders": lambda: silver_cycle(Lake.at(root, spark), "orders"),
        "gold/_customer_orders": lambda: gold.state_cycle(spark, root, *silver),
        "gold/customer_ltv": lambda: gold.ltv_cycle(spark, root),
        "gold/daily_revenue": lambda: gold.daily_cycle(spark, root),
    }
    reads, counts = {}, {}
    for name, step in steps.items():
        with ReadMeter(spark) as meter:
            counts[name] = step()
        reads[name] = meter.result
    return reads, counts


def _total(reads: dict[str, Reads], *, but: str = "") -> Reads:
    return Reads(*(sum(getattr(r, f) for n, r in reads.items() if n != but)
                   for f in ("rows_read", "bytes_read", "files_read", "stages")))


def _cycle_reads(spark, tmp: Path, customers: int) -> tuple[Reads, dict[str, Reads], int]:
    """Reads of the first (full) cycle, of each step of the cycle after the change, and the days it touched."""
    root = str(tmp / f"lake-{customers}")
    broker = KafkaBroker(tmp / f"kafka-{customers}")
    broker.start()
    try:
        ensure_topics(broker.bootstrap)
        source = ShopSource(5)
        cfg = WorkloadConfig(seed=5, customers=customers, orders=3 * customers, invalid_fraction=0.0,
                             orphan_fraction=0.05)
        produce(source.snapshot(cfg), broker.bootstrap)
        run_ingest(Lake.at(root, spark), once=True, bootstrap=broker.bootstrap)
        full = _total(_steps(spark, root)[0])
        produce(_the_change(source), broker.bootstrap)
        run_ingest(Lake.at(root, spark), once=True, bootstrap=broker.bootstrap)
        incremental, counts = _steps(spark, root)
        assert_gold_equals_model(spark, root, source.state)
        return full, incremental, counts[DAILY]["days"]
    finally:
        broker.stop()


# daily_revenue has at most this many rows per day: every country (the generator's and the
# change's "NO"), "??", and every currency.
KEYS_PER_DAY = (len(COUNTRIES) + 2) * len(CURRENCIES)


@pytest.mark.slow
def test_cycle_reads_grow_with_the_change_not_the_table(spark, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LAKEHOUSE_HUDI_OVERRIDES",
                       with_overrides(tmp_path / "file-cap.toml", f"[silver.table]{CAP}[gold.common]{CAP}"))
    small_full, small, _ = _cycle_reads(spark, tmp_path, 50)
    large_full, large, days = _cycle_reads(spark, tmp_path, 500)
    print(f"\nfull cycle: small {small_full.as_dict()}\n            10x   {large_full.as_dict()}")
    for step in small:
        print(f"{step:<22} small {small[step].as_dict()}\n{'':<22} 10x   {large[step].as_dict()}")
    # The metric sees table size: the first (full) cycle reads about ten times as much.
    assert large_full.rows_read > 6 * small_full.rows_read
    # The same change on a ten times larger table: about the same work (well under 2x).
    a, b = _total(small, but=DAILY), _total(large, but=DAILY)
    assert b.rows_read < 2 * a.rows_read and b.files_read < 2 * a.files_read, (a, b)
    # daily_revenue reads the days the change touches, whole: a day holds at most KEYS_PER_DAY
    # rows however many orders there are, so the 10x table may cost that much more per day, no more.
    assert large[DAILY].rows_read <= small[DAILY].rows_read + days * KEYS_PER_DAY, (small[DAILY], large[DAILY])
