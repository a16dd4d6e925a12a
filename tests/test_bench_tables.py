"""`lakehouse dev bench tables` without running it: the tables' shares, their declaration, their records, and the
goals table it prints. No Spark, no Kafka: seconds."""

from __future__ import annotations

import subprocess
import sys
import time
import tomllib
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from lakehouse_dev.bench import tables
from lakehouse_dev.bench.cli import bench
from lakehouse_dev.bench.common import peak_memory
from lakehouse_dev.bench.freshness import SteadyRun, batch_reports
from lakehouse_dev.bench.table_mix import (
    KEYS,
    MIN_SNAPSHOT_ROWS,
    TableMix,
    declaration_toml,
    record_shares,
    snapshot_rows,
    table_shapes,
    top_share,
    write_declaration,
    zipf_shares,
)
from lakehouse_dev.bench.visibility import Visibility
from pipelines.lake.declaration import DEFAULT_FRESHNESS_SECONDS, load, parse

pytestmark = pytest.mark.unit


def test_zipf_shares_put_nine_tenths_on_the_busiest_five_of_fifty() -> None:
    shares = zipf_shares(50, 2.0)
    assert sum(shares) == pytest.approx(1.0)
    assert shares == sorted(shares, reverse=True)
    assert top_share(shares, 5) == pytest.approx(0.9006, abs=1e-4)
    assert zipf_shares(4, 0.0) == [0.25] * 4


def test_the_declaration_parses_with_every_table_its_key_and_target(tmp_path: Path) -> None:
    shapes = table_shapes(50, 2.0, seed=7, target=15.0, cold_target=60.0, hot=5)
    doc = parse(tomllib.loads(declaration_toml(shapes)))
    assert doc.names == tuple(s.name for s in shapes) == tuple(f"t{i:02d}" for i in range(50))
    assert {s.key_kind for s in shapes[:len(KEYS)]} == set(KEYS)  # every key kind among the busiest, composites too
    assert len({len(s.columns) for s in shapes}) > 5  # narrow and wide tables
    for s in shapes:
        t = doc.table(s.name)
        assert t.key == s.key and doc.topic(s.name) == s.table.topic
        assert t.freshness_seconds == (15.0 if s.name < "t05" else 60.0)
    same = load(write_declaration(shapes[:3], tmp_path / "three.toml"))
    assert same.names == ("t00", "t01", "t02") and same.table("t00").freshness_seconds == DEFAULT_FRESHNESS_SECONDS


def test_the_records_follow_the_shares_and_repeat_for_every_deployment() -> None:
    shapes = table_shapes(8, 2.0, seed=3)
    rows = snapshot_rows(shapes, 1000)
    assert rows["t0"] == round(1000 * shapes[0].share) and min(rows.values()) == MIN_SNAPSHOT_ROWS
    mix = TableMix(shapes, seed=3)
    assert len(mix.snapshot(rows)) == sum(rows.values())
    records = mix.changes(20_000)
    assert len(records) == 20_000
    per_topic = Counter(m.topic for m in records)
    for s in shapes[:3]:
        assert per_topic[s.table.topic] / len(records) == pytest.approx(s.share, abs=0.02)
    # A deployment of the busiest tables gets the same records whatever tables sit idle beside them.
    first, second = TableMix(shapes[:3], seed=3), TableMix(shapes[:3], seed=3)
    assert first.changes(500) == second.changes(500)
    offsets = {f"{s.table.topic}/{p}": [10, 10 + per_topic[s.table.topic] // 2] for s in shapes for p in (0, 1)}
    shares = record_shares(offsets, {s.name: s.table.topic for s in shapes})
    assert sum(shares.values()) == pytest.approx(1.0)
    assert shares["t0"] == pytest.approx(per_topic[shapes[0].table.topic] / len(records), abs=1e-3)


def _figures(delays: dict[str, list[float]], shop_p95: float | None,
             batch: tuple[float, float] | None) -> dict[str, Any]:
    """What `tables.run` saves, from made-up changes: the per-table rows by the benchmark's own code."""
    plan = tables.Plan(tables=6, hot=2, touched=3, small=5)
    shapes = table_shapes(plan.tables, plan.exponent, plan.seed, hot=plan.hot)
    changes = [Visibility(t, 0, i, 1, 100.0, 100.0 + d) for t, ds in delays.items() for i, d in enumerate(ds)]
    offsets = {f"{s.table.topic}/0": [0, 100 - i] for i, s in enumerate(shapes)}
    done = SteadyRun({"steady_offsets": offsets, "kafka_records": sum(e - b for b, e in offsets.values()),
                      "steady_seconds": 10.0}, changes, [])
    deployment = {"peak_memory_mib": {"jvm": 1000.0}, "restart": {"first_batch_seconds": 20.0, "session_seconds": 9.0}}
    return {
        "plan": {**tables.asdict(plan), "reference_from": None},
        "planned_top_share": 0.8, "actual_top_share": 0.79,
        "per_table": tables._per_table(done, shapes),
        "hot_delay_seconds": {"p95": 5.0},
        "main": {"events": len(changes), "delay_seconds": {"p50": 3.0, "p95": 6.0},
                 "batches": {"count": 9, "seconds_mean": 4.0}},
        "reference": {"delay_seconds": {"p95": shop_p95}} if shop_p95 else None,
        "deployments": {str(n): {**deployment, "tables": n, "batches": {"seconds_mean": s, "count": 12}}
                        for n, s in ((3, batch[0]), (5, batch[0]), (6, batch[1]))} if batch else {},
    }


def test_the_goals_table_says_met_not_met_and_not_measured() -> None:
    ok = _figures({"t0": [4.0, 5.0, 6.0], "t1": [5.0], "t2": [14.0]}, shop_p95=6.0, batch=(4.0, 4.4))
    rows = {r["goal"].split(" ")[0] + r["goal"].split(" ")[1]: r for r in tables.goals(ok)}
    assert [r["status"] for r in tables.goals(ok)] == ["met", "met", "met", "measured", "measured"]
    assert "3 of 3 tables" in rows["everytable's"]["measured"] and "3 tables had no counted change" in \
        rows["everytable's"]["measured"]
    assert "1.1x" in rows["abatch"]["measured"]
    late = _figures({"t0": [4.0, 30.0], "t1": [9.0]}, shop_p95=5.0, batch=(4.0, 6.0))
    assert [r["status"] for r in tables.goals(late)][:3] == ["not met", "not met", "not met"]
    bare = _figures({"t0": [4.0]}, shop_p95=None, batch=None)
    assert [r["status"] for r in tables.goals(bare)] == ["met", "not measured", "not measured", "not measured",
                                                          "not measured"]
    idle = _figures({"t0": [4.0]}, shop_p95=6.0, batch=(4.0, 4.4))
    idle["deployments"]["3"]["batches"]["count"] = 0  # a counted window shorter than a batch
    assert tables.goals(idle)[2]["status"] == "not measured"
    ok["commits"] = {"main": 300, "changelog": 290, "seconds": 300.0, "per_second": 1.97, "batch_main_commits": 280,
                     "phase_seconds_per_main_commit": {"table": 1.2, "plan": 0.6}}
    (commits,) = [r for r in tables.goals(ok) if r["goal"].startswith("table commits")]
    assert commits["status"] == "met" and "1.97 (300 main and 290 change-log commits in 300 s)" in commits["measured"]
    assert "table 1.20, plan 0.60" in commits["measured"]
    ok["commits"]["per_second"] = 0.4
    assert [r["status"] for r in tables.goals(ok) if r["goal"].startswith("table commits")] == ["not met"]
    text = tables.report(ok)
    assert text.startswith("| goal") and "| t0 " in text and "| NO " not in text
    assert "| NO " in tables.report(late)


def test_the_command_lists_its_options_without_starting_anything() -> None:
    result = CliRunner().invoke(bench, ["tables", "--help"])
    assert result.exit_code == 0, result.output
    for option in ("--tables", "--rate", "--minutes", "--warmup-minutes", "--zipf", "--target", "--no-reference",
                   "--reference-from", "--no-deployments", "--touched", "--small", "--deployment-minutes"):
        assert option in result.output
    assert "[default: 50" in result.output and "[default: 2000.0" in result.output


def test_the_stops_line_is_not_a_batch_of_its_own(tmp_path: Path) -> None:
    log = tmp_path / "ingest.log"
    log.write_text("batch 0: 10 records in 2.0s | t: row=10 | seconds: tables=1.0\n"
                   "batch 1: 5 records in 1.5s | t: waiting=5 | seconds: tables=0.0\n"
                   "the waiting changes, written as the stream stops: batch 1: 0 records in 1.1s | seconds: "
                   "tables=1.1\n")
    assert [(r.batch_id, r.seconds) for r in batch_reports(log)] == [(0, 2.0), (1, 1.5)]


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="no /proc")
def test_peak_memory_reads_the_high_water_mark() -> None:
    # A process of its own: the suite's process has a Spark JVM child when the Spark tests share it.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.5)
        peaks = peak_memory(child.pid)
    finally:
        child.kill()
        child.wait()
    assert peaks is not None and peaks["python"] > 1 and peaks["jvm"] == 0.0 and peaks["processes"] == 1
