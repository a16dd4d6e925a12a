"""Bronze's change logs: small files clustered, consumed past days expired, and every reader still exact;
the dead-letter store's small files clustered too.

The change log is partitioned by ingest day (a UTC date). Two days are made in one test by
ingesting under two session time zones, UTC-12 then UTC+14, whose dates always differ.
Retention is cut to one commit and clustering allowed on the newest day (both through
`LAKEHOUSE_HUDI_OVERRIDES`), so that the services have work to do within a test.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import functions as F

from lakehouse_dev.generator import ShopSource, WorkloadConfig, ensure_topics, produce
from pipelines.ingest.bronze import IngestOptions, run_ingest
from pipelines.lake.contract import TABLES, topic
from pipelines.lake.hudi_timeline import checkpoint, consumed, earliest_checkpoint
from pipelines.lake.layout import changelog_path, dead_letter_path, silver_path
from pipelines.runtime.lake import Lake
from pipelines.services.due import live_files, services_due
from pipelines.services.table_services import ServicesPlan, run_services
from pipelines.transform.changes import read_changes
from pipelines.transform.etl import run_etl
from tests.lake import assert_lake_equals_model, with_overrides
from tests.model import row_event, unwrap

pytestmark = pytest.mark.integration

OVERRIDES = """
[bronze.changelog]
"hoodie.clean.policy" = "KEEP_LATEST_COMMITS"
"hoodie.clean.commits.retained" = 1
[table_services.services]
"hoodie.clustering.plan.strategy.daybased.skipfromlatest.partitions" = 0
"""
CHANGELOGS = [f"bronze/_changelog/{t}" for t in TABLES]
DEAD_LETTERS = "bronze/_dead_letters"


def _ingest_on_day(spark, zone: str, root: str, **kwargs) -> None:
    """Ingest with the session's time zone set to `zone`: the ingest day is its date there."""
    spark.conf.set("spark.sql.session.timeZone", zone)
    try:
        run_ingest(Lake.at(root, spark), once=True, **kwargs)
    finally:
        spark.conf.set("spark.sql.session.timeZone", "UTC")


def _disk_files(path: str) -> dict[str, int]:
    """Parquet files per day directory of a change log, replaced or not."""
    return {d.name: len(list(d.glob("*.parquet"))) for d in sorted(Path(path).glob("_ingest_date=*"))}


def _live_files(spark, path: str) -> dict[str, int]:
    """Files per day that a snapshot read of a change log opens."""
    rows = spark.read.format("hudi").load(path).groupBy("_ingest_date") \
        .agg(F.countDistinct("_hoodie_file_name").alias("n")).collect()
    return {f"_ingest_date={r['_ingest_date']}": r["n"] for r in rows}


def _file_count(spark, path: str) -> int:
    """Files that a snapshot read of an unpartitioned table (the dead-letter store) opens."""
    return spark.read.format("hudi").load(path).select("_hoodie_file_name").distinct().count()


def _positions(spark, path: str) -> list[str]:
    """The Kafka positions the dead-letter store holds, sorted."""
    return sorted(r[0] for r in spark.read.format("hudi").load(path).select("position").collect())


@pytest.mark.slow
def test_changelog_days_are_clustered_and_expired_without_losing_a_change(
        spark, broker, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LAKEHOUSE_HUDI_OVERRIDES", with_overrides(tmp_path / "overrides.toml", OVERRIDES))
    root = str(tmp_path / "lake")
    source = ShopSource(83)
    cfg = WorkloadConfig(seed=83, customers=60, orders=200, changes=200, delete_fraction=0.1, malformed_fraction=0.05)
    ensure_topics(broker.bootstrap)

    # Day one, in small batches: many small files. Silver consumes it; an outside consumer
    # of bronze's changes takes a checkpoint and then stays away.
    day_one_records = source.snapshot(cfg) + source.changes(cfg)
    produce(day_one_records, broker.bootstrap)
    _ingest_on_day(spark, "Etc/GMT+12", root=root, bootstrap=broker.bootstrap,
                   options=IngestOptions(max_offsets_per_trigger=300))
    run_etl(Lake.at(root, spark))
    stale = read_changes(Lake.at(root, spark), "bronze/orders", None).checkpoint

    # Day two, also in small batches; silver has not read it yet.
    day_two_records = source.changes(cfg)
    produce(day_two_records, broker.bootstrap)
    _ingest_on_day(spark, "Etc/GMT-14", root=root, bootstrap=broker.bootstrap,
                   options=IngestOptions(max_offsets_per_trigger=150))
    orders_log = changelog_path("orders", root)
    day_one, day_two = sorted(_disk_files(orders_log))
    before = _live_files(spark, orders_log)
    assert before[day_one] > 1 and before[day_two] > 1, before

    # The dead-letter store, written a new small file per batch with malformed records, is clustered too.
    dead = dead_letter_path(root)
    letters = _positions(spark, dead)
    assert _file_count(spark, dead) > 1

    # What the DAG decides from the files alone (pipelines/services/due.py): the days Spark reads, work on each.
    assert {p: len(f) for p, f in live_files(orders_log).items()} == before
    due = {w.table: w.services for w in services_due(root, Lake.at(root).declaration)}
    assert all({"expire", "cluster"} <= set(due[name]) for name in CHANGELOGS), due
    assert "cluster" in due[DEAD_LETTERS], due

    report = run_services(Lake.at(root, spark),
                          ServicesPlan([*CHANGELOGS, DEAD_LETTERS], ("expire", "cluster", "clean")))
    assert report[DEAD_LETTERS]["cluster"]["executed"], report[DEAD_LETTERS]
    assert _file_count(spark, dead) == 1 and _positions(spark, dead) == letters
    for name in CHANGELOGS:
        assert report[name]["cluster"]["executed"], (name, report[name])
        assert report[name]["expire"]["expired"] == [day_one], (name, report[name])
        assert report[name]["expire"]["deletes_kept"] > 0, (name, report[name])
    assert _disk_files(orders_log).get(day_one, 0) == 0, "the expired day's files were not cleaned"
    after = _live_files(spark, orders_log)
    assert day_one not in after and after[day_two] == 1, f"not expired and clustered: {before} -> {after}"
    assert {p: len(f) for p, f in live_files(orders_log).items()} == after

    # Silver reads its window across the clustering commit: every change once, none lost.
    run_etl(Lake.at(root, spark))
    assert_lake_equals_model(spark, root, source.state)
    for table in TABLES:
        mark = consumed(checkpoint(spark, silver_path(table, root)), changelog_path(table, root))
        assert mark >= earliest_checkpoint(spark, changelog_path(table, root)), f"silver/{table} lost its checkpoint"

    # The outside consumer had read all of day one before it was dropped, and day two's files were clustered: its
    # checkpoint is older than what can be read incrementally, yet it reads on by commit time, day two's changes
    # exactly (each key once).
    assert stale < earliest_checkpoint(spark, orders_log)
    change_set = read_changes(Lake.at(root, spark), "bronze/orders", stale)
    assert not change_set.snapshot

    def events(records: list) -> list[tuple[str, int, int, dict]]:
        return [e for m in records if m.topic == topic("orders") and (e := row_event(unwrap(m)[1]))]

    # Day two repeats some of day one's events (replays, older changes): bronze applied those already.
    newest = {}
    for _, key, lsn, _ in events(day_one_records):
        newest[key] = max(lsn, newest.get(key, lsn))
    changed = [r["id"] for r in change_set.rows.select("id").collect()]
    assert sorted(changed) == sorted({k for _, k, lsn, _ in events(day_two_records) if lsn > newest.get(k, -1)})

    # A second run finds nothing to do; ingest and etl go on, exact.
    again = run_services(Lake.at(root, spark), ServicesPlan([*CHANGELOGS, DEAD_LETTERS], ("expire", "cluster")))
    assert all(not again[n]["cluster"]["executed"] and not again[n]["expire"]["expired"]
               for n in [*CHANGELOGS, DEAD_LETTERS]), again
    # ... and so does the DAG's decision, the replaced files still on disk or not.
    assert [w.line() for w in services_due(root, Lake.at(root).declaration) if w.table in [*CHANGELOGS, DEAD_LETTERS]
            and {"expire", "cluster"} & set(w.services)] == []
    # Day one's records delivered again (a connector replay): its deletes now live in the
    # ledgers only, and no replayed insert brings a deleted row back.
    produce(day_one_records + source.changes(cfg), broker.bootstrap)
    _ingest_on_day(spark, "Etc/GMT-14", root=root, bootstrap=broker.bootstrap)
    run_etl(Lake.at(root, spark))
    assert_lake_equals_model(spark, root, source.state)
