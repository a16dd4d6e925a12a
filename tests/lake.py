"""Lakes built by the pipeline, read back twice (Spark and hudi-rs, no JVM) and compared to the model."""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result
from pyspark.sql import SparkSession

from hudi_configs import test_profile
from lakehouse_dev.generator import Message, ShopSource, WorkloadConfig, ensure_topics, produce
from lakehouse_dev.kafka_local import KafkaBroker
from pipelines.ingest.bronze import run_ingest
from pipelines.lake.contract import COLUMNS, TABLES
from pipelines.lake.layout import changelog_path, dead_letter_path, ledger_path, main_path, quarantine_path, silver_path
from pipelines.lake.table_stats import has_completed_commit, read_table
from pipelines.runtime.lake import Lake
from pipelines.transform.etl import run_etl
from tests.model import Rows, expected_silver

# The shared lake's workload: quarantined rows (invalid), deletes and re-inserts, orphan
# orders, malformed records (dead letters), replays and both converter formats.
BASE_WORKLOAD = WorkloadConfig(seed=90, customers=100, orders=300, changes=800, invalid_fraction=0.12,
                               delete_fraction=0.08)


@dataclass
class LakeCopy:
    """A lake built by the pipeline, with the broker holding its topics and the source that produced them."""

    dir: Path  # holds lake/ and kafka/
    broker: KafkaBroker | None  # None for the stopped original
    source: ShopSource
    sent: list[Message]
    cfg: WorkloadConfig

    @property
    def root(self) -> str:
        return str(self.dir / "lake")

    @property
    def bootstrap(self) -> str:
        assert self.broker is not None, "the base lake's broker is stopped: use a copy (the `lake` fixture)"
        return self.broker.bootstrap

    def produce(self, messages: list[Message]) -> None:
        """Send `messages` and remember them as sent (what the model folds)."""
        produce(messages, self.bootstrap)
        self.sent += messages


def base_workload() -> tuple[ShopSource, list[Message]]:
    """BASE_WORKLOAD's source and records: the same bytes in every process (the generator is seeded)."""
    source = ShopSource(BASE_WORKLOAD.seed)
    return source, source.snapshot(BASE_WORKLOAD) + source.changes(BASE_WORKLOAD)


def build_base_lake(spark: SparkSession, where: Path) -> None:
    """BASE_WORKLOAD's snapshot and changes, ingested once, then one etl cycle; the broker stopped after."""
    broker = KafkaBroker(where / "kafka")
    broker.start()
    try:
        ensure_topics(broker.bootstrap)
        produce(base_workload()[1], broker.bootstrap)
        run_ingest(Lake.at(str(where / "lake"), spark), once=True, bootstrap=broker.bootstrap)
        run_etl(Lake.at(str(where / "lake"), spark))
    finally:
        broker.stop()


# OpenLineage's listener on (hudi_configs/spark.toml [lineage]), which the suite's profile turns off for its cost
# (hudi_configs/test_profile.toml): for the tests of lineage itself, added after the profile (`with_overrides`).
LINEAGE_ON = """
[spark.lineage]
enabled = true
"""


def with_overrides(path: Path, text: str) -> str:
    """Write a test's own Hudi overrides to `path`; returns LAKEHOUSE_HUDI_OVERRIDES with them after the profile."""
    path.write_text(text)
    return os.pathsep.join([str(test_profile()), str(path)])


def own_environment() -> dict[str, str]:
    """This process's environment without a setting of the pipeline's: for a job told nothing but its
    lakehouse.toml (`--config`)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("LAKEHOUSE_", "KAFKA_"))}


def run_cli(*args: str, env: dict[str, str] | None = None) -> Result:
    """The `lakehouse` command line in this process: its Spark session is the test run's, no JVM to start.

    For tests of what a command does; a test of the process itself (a kill, a signal, a
    second writer) runs `python -m pipelines.cli` instead.
    """
    from pipelines.cli.app import main

    return CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)


def _keyed(rows: list[dict[str, Any]], table: str) -> dict[int, dict[str, Any]]:
    ids = Counter(r["id"] for r in rows)
    dup = [k for k, n in ids.items() if n > 1]
    assert not dup, f"bronze/{table}: record keys appear more than once: {dup[:10]}"
    return {r["id"]: r for r in rows}


def bronze_spark(spark: SparkSession, root: str, table: str) -> dict[int, dict[str, Any]]:
    if not has_completed_commit(main_path(table, root)):
        return {}
    df = spark.read.format("hudi").load(main_path(table, root)).select(*COLUMNS[table], "_lsn", "_op")
    return _keyed([r.asDict() for r in df.collect()], table)


def bronze_hudi_rs(root: str, table: str) -> dict[int, dict[str, Any]]:
    if not has_completed_commit(main_path(table, root)):
        return {}
    return _keyed(read_table(main_path(table, root), [*COLUMNS[table], "_lsn", "_op"]).to_pylist(), table)


def assert_bronze_equals_model(spark: SparkSession, root: str, expected: Rows,
                               lsns: dict[str, dict[int, int]]) -> None:
    """Both readers see exactly the model's live rows, each at the LSN of the event that made it."""
    for table in TABLES:
        for reader, got in (("spark", bronze_spark(spark, root, table)), ("hudi-rs", bronze_hudi_rs(root, table))):
            data = {k: {c: v[c] for c in COLUMNS[table]} for k, v in got.items()}
            missing = expected[table].keys() - data.keys()
            extra = data.keys() - expected[table].keys()
            wrong = [k for k in expected[table].keys() & data.keys() if data[k] != expected[table][k]]
            assert not (missing or extra or wrong), (
                f"{reader} bronze/{table} differs from the model: missing={sorted(missing)[:10]} "
                f"resurrected/extra={sorted(extra)[:10]} wrong={sorted(wrong)[:5]} "
                f"e.g. {[(data[k], expected[table][k]) for k in sorted(wrong)[:2]]}")
            assert {k: v["_lsn"] for k, v in got.items()} == lsns[table], f"{reader} bronze/{table}: _lsn differs"
            assert {v["_op"] for v in got.values()} <= {"r", "c", "u"}
        # No recorded delete (change log or ledger) claims a live key was deleted after its live version.
        deletes: dict[int, int] = {}
        for path in (changelog_path(table, root), ledger_path(table, root)):
            if has_completed_commit(path):
                rows = read_table(path, ["id", "_lsn", "_op"]).to_pylist()
                for r in rows:
                    if r["_op"] == "d" or path == ledger_path(table, root):
                        deletes[r["id"]] = max(deletes.get(r["id"], -1), r["_lsn"])
        live = lsns[table]
        ahead = [k for k in deletes.keys() & live.keys() if deletes[k] >= live[k]]
        assert not ahead, f"deletes recorded after the live version of bronze/{table}: {sorted(ahead)[:10]}"


def dead_letters(root: str) -> list[dict[str, Any]]:
    if not has_completed_commit(dead_letter_path(root)):
        return []
    return read_table(dead_letter_path(root), ["position", "kafka_topic", "value", "reason"]).to_pylist()


def _gold_rows(rows: list[dict[str, Any]], key: tuple[str, ...], columns: tuple[str, ...]) -> dict:
    keyed: dict = {}
    for r in rows:
        k = tuple(_naive(r[c]) for c in key)
        assert k not in keyed, f"gold key {k} appears twice"
        keyed[k[0] if len(k) == 1 else k] = {c: _naive(r[c]) for c in columns}
    return keyed


def _naive(value: Any) -> Any:
    """hudi-rs gives timestamps with a UTC zone, Spark naive UTC ones (the tests run with TZ=UTC)."""
    return value.replace(tzinfo=None) if hasattr(value, "tzinfo") and value.tzinfo else value


LTV_COLUMNS = ("country", "orders_count", "total_amount", "first_order_at", "last_order_at")
DAILY_COLUMNS = ("orders_count", "revenue")


def assert_gold_equals_model(spark: SparkSession, root: str, state: Rows) -> None:
    """gold/customer_ltv and gold/daily_revenue, read with Spark and with hudi-rs, equal the contract on `state`."""
    from tests.model import expected_gold

    ltv, daily = expected_gold(state)
    want_ltv = {k: {c: _naive(v[c]) for c in LTV_COLUMNS} for k, v in ltv.items()}
    want_daily = {k: dict(v) for k, v in daily.items()}
    for reader in ("spark", "hudi-rs"):
        for table, key, columns, want in (("customer_ltv", ("customer_id",), LTV_COLUMNS, want_ltv),
                                          ("daily_revenue", ("order_date", "country", "currency"), DAILY_COLUMNS,
                                           want_daily)):
            path = f"{root}/gold/{table}"
            if reader == "spark":
                rows = [r.asDict() for r in spark.read.format("hudi").load(path).collect()]
            else:
                rows = read_table(path).to_pylist()
            got = _gold_rows(rows, key, columns)
            missing, extra = sorted(want.keys() - got.keys())[:5], sorted(got.keys() - want.keys())[:5]
            assert not missing and not extra, f"gold/{table} ({reader}): missing {missing}, extra {extra}"
            wrong = [(k, got[k], want[k]) for k in want if got[k] != want[k]]
            assert not wrong, f"gold/{table} ({reader}): {len(wrong)} rows differ, e.g. {wrong[:2]}"


def assert_lake_equals_model(spark: SparkSession, root: str, state: Rows) -> None:
    """Silver, quarantine and gold against the contract's rules applied to the model's source state."""
    silver, quarantine = expected_silver(state)
    for table in TABLES:
        got = {r["id"]: r.asDict() for r in spark.read.format("hudi").load(silver_path(table, root)).collect()}
        want = {k: {c: _naive(v) for c, v in row.items()} for k, row in silver[table].items()}
        assert got.keys() == want.keys(), (f"silver/{table}: missing {sorted(want.keys() - got.keys())[:10]}, "
                                           f"extra {sorted(got.keys() - want.keys())[:10]}")
        wrong = [k for k in want if {c: got[k][c] for c in want[k]} != want[k]]
        assert not wrong, f"silver/{table} rows differ: {[(got[k], want[k]) for k in wrong[:2]]}"
        # The independent reader sees the same keys at the same LSNs.
        rs = {r["id"]: r["_lsn"] for r in read_table(silver_path(table, root), ["id", "_lsn"]).to_pylist()}
        assert rs == {k: r["_lsn"] for k, r in got.items()}, f"hudi-rs and Spark disagree on silver/{table}"
        q = {r["id"]: r["failed_rule"] for r in spark.read.format("hudi").load(quarantine_path(table, root)).collect()}
        assert q == quarantine[table], f"quarantine/{table} differs"
    assert_gold_equals_model(spark, root, state)
