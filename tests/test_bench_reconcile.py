"""`lakehouse dev bench reconcile`'s own parts, without starting anything: the drift it makes (0.01%, three
disjoint kinds, extra keys the source never had), the progress it reads from the stream's log, the check that
reconcile found exactly that drift, and its table."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import click
import pytest
from click.testing import CliRunner

from lakehouse_dev.bench import reconcile
from lakehouse_dev.bench.cli import bench

pytestmark = pytest.mark.unit


def test_the_drift_is_a_hundredth_of_a_percent_in_three_disjoint_kinds() -> None:
    drift = reconcile.drift_keys(1_000_000, seed=7)
    assert drift.counts() == {"missing": 33, "extra": 33, "differ": 34}
    assert not set(drift.missing) & set(drift.differ)
    assert all(1 <= k <= 1_000_000 for k in drift.missing + drift.differ)
    assert all(k > 1_000_000 for k in drift.extra)  # keys the source never had
    assert reconcile.drift_keys(1_000_000, seed=7) == drift
    assert sum(reconcile.drift_keys(20_000, seed=1).counts().values()) == 3  # at least one of each


def test_progress_counts_the_tables_upserts(tmp_path: Path) -> None:
    log = tmp_path / "ingest.log"
    log.write_text(f"batch 0: 10 records in 2.0s | {reconcile.TABLE}: upsert=10 | seconds: tables=1.0\n"
                   "something else\n"
                   f"batch 1: 6 records in 1.5s | {reconcile.TABLE}: delete=1 upsert=5 | seconds: tables=0.5\n")
    assert reconcile.upserts(log) == (15, 2)


def _report(found: dict[str, list[int]], unsettled: int = 0) -> SimpleNamespace:
    return SimpleNamespace(keys={k: [{"id": str(i)} for i in v] for k, v in found.items()},
                           counts={"unsettled": unsettled, **{k: len(v) for k, v in found.items()}})


def test_reconcile_must_find_exactly_the_drift_made() -> None:
    drift = reconcile.Drift(differ=[1, 2], missing=[3], extra=[10**12 + 4])
    reconcile.check_found(_report({"missing": [3], "extra": [10**12 + 4], "differ": [2, 1]}), drift)
    for found, unsettled in (({"missing": [3], "extra": [10**12 + 4], "differ": [1]}, 0),
                             ({"missing": [3], "extra": [], "differ": [1, 2]}, 0),
                             ({"missing": [3], "extra": [10**12 + 4], "differ": [1, 2]}, 1)):
        with pytest.raises(click.ClickException, match="other drift than was made"):
            reconcile.check_found(_report(found, unsettled), drift)


def test_the_table_sets_reconcile_beside_the_full_comparison() -> None:
    part = {"seconds": 12.5, "buckets": 65536, "buckets_differing": 100, "rows_read": {"source": 1500, "lake": 1490},
            "found": {"missing": 33, "extra": 33, "differ": 34}}
    figures = {"rows": 1_000_000, "ingest": {"seconds": 300.0, "rows_per_s": 3333},
               "clean": {**part, "buckets_differing": 0, "rows_read": {"source": 0, "lake": 0}, "found": {}},
               "drifted": part, "full_comparison": {"seconds": 40.0, "rows_read": {"source": 1_000_000,
                                                                                   "lake": 1_000_033}},
               "heal": {"seconds": 60.0, "stream_start_seconds": 20.0},
               "drift_made": {"missing": 33, "extra": 33, "differ": 34}}
    text = reconcile.report(figures)
    assert "| 1,500 " in text and "| 1,000,000 " in text and "100 of 65,536" in text
    assert "not measured at the goal's size" in text
    assert "met" in reconcile.report({**figures, "rows": 10_000_000}).splitlines()[-1]


def test_the_command_lists_its_options_without_starting_anything() -> None:
    result = CliRunner().invoke(bench, ["reconcile", "--help"])
    assert result.exit_code == 0, result.output
    for option in ("--rows", "--trigger-seconds", "--ingest-timeout", "--heal-timeout", "--seed"):
        assert option in result.output
    assert "[default: 1000000" in result.output
