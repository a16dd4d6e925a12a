"""The freshness benchmark on a short real run: its figures must add up, whatever the machine's speed.

No timing threshold: only what holds on any machine. Each applied change is counted once,
the snapshot not at all, every key's last change of the steady phase is among them (bronze
itself says which one that was), delays lie within the run, and the lag ends at zero.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lakehouse_dev.bench import freshness
from lakehouse_dev.bench.visibility import visibility
from pipelines.lake.contract import TABLES, topic
from pipelines.lake.layout import changelog_path, main_path
from pipelines.lake.table_stats import has_completed_commit, read_table

pytestmark = pytest.mark.integration


@pytest.mark.slow
def test_freshness_figures_add_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAKEHOUSE_BENCH_DIR", str(tmp_path))
    figures = freshness.run(minutes=0.4, rate=20, trigger_seconds=5, seed=11, warmup_minutes=0.2)

    root = str(tmp_path / "freshness" / "lake")
    start = {tp: span[0] for tp, span in figures["steady_offsets"].items()}
    end = {tp: span[1] for tp, span in figures["steady_offsets"].items()}
    assert figures["kafka_records"] == sum(end.values()) - sum(start.values()) == 720  # warm-up included

    changes = visibility(root, start, end)
    positions = {(c.table, c.partition, c.offset) for c in changes}
    assert len(changes) == len(positions) <= figures["kafka_records"]
    # Counted: the changes that entered Kafka after the warm-up; the warm-up's are reported apart.
    counted = [c for c in changes if c.kafka_ts >= figures["counted_from"]]
    assert 0 < figures["events"] == len(counted) and 0 < figures["warmup_events"] == len(changes) - len(counted)
    # The change logs hold the snapshot and the counted changes, nothing else.
    snapshot = freshness.SNAPSHOT_ROWS
    assert sum(read_table(changelog_path(t, root), ["_lsn"]).num_rows for t in TABLES) == snapshot + len(changes)
    # Per live key, the row holds the Kafka position of the last change applied.
    for t in TABLES:
        for path in (main_path(t, root),):
            if not has_completed_commit(path):
                continue
            held = {(t, r["_kafka_partition"], r["_kafka_offset"])
                    for r in read_table(path, ["_kafka_partition", "_kafka_offset"]).to_pylist()}
            steady = {p for p in held if start[f"{topic(t)}/{p[1]}"] <= p[2] < end[f"{topic(t)}/{p[1]}"]}
            assert steady, path
            assert steady <= positions, f"{path}: last changes not counted: {sorted(steady - positions)[:5]}"

    run_length = figures["caught_up_seconds"]
    assert all(0 < c.delay < run_length for c in changes)
    for d in (figures["delay_seconds"], figures["warmup_delay_seconds"]):
        assert 0 < d["min"] <= d["p50"] <= d["p95"] <= d["p99"] <= d["max"] < run_length
    assert round(max(c.delay for c in counted), 3) == figures["delay_seconds"]["max"]
    # The steady phase's batches, all of them, each in one of the two windows.
    assert figures["batches"]["records"] + figures["warmup_batches"]["records"] == figures["kafka_records"]
    lag = figures["lag"]
    assert lag[-1]["total"] == 0 and any(s["total"] > 0 for s in lag if s["t"] >= 0)
    assert all(s["total"] == s["customers"] + s["orders"] >= 0 for s in lag)
    assert (tmp_path / "freshness.png").stat().st_size > 10_000
    assert (tmp_path / "freshness.json").exists()
