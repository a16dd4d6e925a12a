"""A cycle whose checkpoint is no longer readable (archived or cleaned) rebuilds, says so, and is exact.

Retention is cut to the minimum through `LAKEHOUSE_HUDI_OVERRIDES`, then the readers fall
behind on purpose:
- silver's checkpoint on bronze's change log is archived: many ingest batches, no etl;
- gold's checkpoint on silver is cleaned: silver cycles run without gold, and the
  cleaner deletes the file versions that silver's older commits wrote.
"""

from __future__ import annotations

import logging

import pytest

from lakehouse_dev.generator import ShopSource, WorkloadConfig, ensure_topics, produce
from pipelines.ingest.bronze import IngestOptions, run_ingest
from pipelines.lake.contract import TABLES
from pipelines.lake.hudi_timeline import checkpoint, consumed, earliest_checkpoint
from pipelines.lake.layout import changelog_path, gold_path, silver_path
from pipelines.runtime.lake import Lake
from pipelines.transform.changes import read_changes
from pipelines.transform.etl import run_etl, silver_cycle
from tests.lake import assert_lake_equals_model, with_overrides

pytestmark = pytest.mark.integration

SHORT_RETENTION = """
"hoodie.clean.policy" = "KEEP_LATEST_COMMITS"
"hoodie.clean.commits.retained" = 1
"hoodie.keep.min.commits" = 2
"hoodie.keep.max.commits" = 3
"hoodie.metadata.compact.max.delta.commits" = 1
"""


def test_cycles_rebuild_exactly_when_their_checkpoint_is_gone(spark, broker, tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setenv("LAKEHOUSE_HUDI_OVERRIDES", with_overrides(
        tmp_path / "short-retention.toml", f"[bronze.changelog]{SHORT_RETENTION}[silver.table]{SHORT_RETENTION}"))
    root = str(tmp_path / "lake")
    source = ShopSource(61)
    cfg = WorkloadConfig(seed=61, customers=80, orders=240, changes=300, delete_fraction=0.1)
    ensure_topics(broker.bootstrap)
    produce(source.snapshot(cfg), broker.bootstrap)
    run_ingest(Lake.at(root, spark), once=True, bootstrap=broker.bootstrap)
    run_etl(Lake.at(root, spark))
    gold_marks = checkpoint(spark, gold_path("_customer_orders", root))  # what gold has consumed of silver

    # Silver keeps up with bronze for a while (and is cleaned), gold does not run at all.
    for _ in range(2):
        produce(source.changes(cfg), broker.bootstrap)
        run_ingest(Lake.at(root, spark), once=True, bootstrap=broker.bootstrap)
        for table in TABLES:
            silver_cycle(Lake.at(root, spark), table)
    # Then bronze runs ahead of silver by many small batches (and its change log is archived).
    produce(source.changes(cfg), broker.bootstrap)
    run_ingest(Lake.at(root, spark), once=True, bootstrap=broker.bootstrap,
               options=IngestOptions(max_offsets_per_trigger=100))
    for table in TABLES:
        readable = earliest_checkpoint(spark, silver_path(table, root))
        assert readable and readable > consumed(gold_marks, silver_path(table, root)), f"silver/{table} was not cleaned"
    for table in TABLES:
        silver_mark = consumed(checkpoint(spark, silver_path(table, root)), changelog_path(table, root))
        assert earliest_checkpoint(spark, changelog_path(table, root)) > silver_mark, \
            f"bronze's change log of {table} was not archived past silver's checkpoint"

    with caplog.at_level(logging.WARNING, logger="pipelines"):
        run_etl(Lake.at(root, spark))
    rebuilt = [r.getMessage() for r in caplog.records if "no longer readable" in r.getMessage()]
    for table in TABLES:
        assert any(changelog_path(table, root) in m for m in rebuilt), f"silver/{table} did not notice: {rebuilt}"
    assert any(silver_path("orders", root) in m for m in rebuilt), f"gold did not notice: {rebuilt}"

    assert_lake_equals_model(spark, root, source.state)

    # A consumer with the old checkpoint is told that what it gets is the whole table.
    change_set = read_changes(Lake.at(root, spark), "silver/orders", consumed(gold_marks, silver_path("orders", root)))
    assert change_set.snapshot
    assert change_set.rows.count() == spark.read.format("hudi").load(silver_path("orders", root)).count()
