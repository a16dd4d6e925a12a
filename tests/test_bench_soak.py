"""`lakehouse dev bench soak`'s pure parts, without running it: the seeded fault schedule, the checker's counts of
rows lost / duplicated / resurrected, the recovery figure, the JVM perf-data reader. No JVM, Kafka or
PostgreSQL: milliseconds (the soak itself is a benchmark, never part of `make test`)."""

from __future__ import annotations

import struct
from collections import Counter

import numpy as np
import pytest

from lakehouse_dev.bench import cli
from lakehouse_dev.bench.memory import heap_used, parse_histogram, perf_counters
from lakehouse_dev.bench.soak_plan import (
    DEFAULT_KINDS,
    DURATIONS,
    KINDS,
    CatchUp,
    affected,
    live_summary,
    percentiles,
    schedule,
    tally,
)
from lakehouse_dev.generator import ShopSource, WorkloadConfig
from lakehouse_dev.sql_sink import statements

pytestmark = pytest.mark.unit


def test_the_schedule_is_the_seeds() -> None:
    assert schedule(7, 30, 4) == schedule(7, 30, 4)
    assert schedule(7, 30, 4) != schedule(8, 30, 4)


def test_thirty_minutes_every_three_give_eight_faults_two_of_each_kind_inside_their_slots() -> None:
    faults = schedule(7, 30, 3, warmup_minutes=3, tail_minutes=3)
    assert len(faults) == 8
    assert Counter(f.kind for f in faults) == dict.fromkeys(DEFAULT_KINDS, 2)
    for i, f in enumerate(faults):
        slot = 180 + 180 * i
        assert slot + 10 <= f.at and f.end <= slot + 180, f
        assert f.seconds == DURATIONS[f.kind]
    assert faults[-1].end <= 27 * 60, "the tail stays quiet"


def test_a_fault_too_long_for_its_slot_is_left_out_and_a_shorter_one_fits() -> None:
    assert schedule(1, 3, 1, ["kafka_blackout"], warmup_minutes=0.5, tail_minutes=0.5) == []
    short = schedule(1, 3, 1, ["kafka_blackout"], warmup_minutes=0.5, tail_minutes=0.5,
                     durations={**DURATIONS, "kafka_blackout": 20})
    assert [f.kind for f in short] == ["kafka_blackout", "kafka_blackout"]


def test_unknown_kinds_are_refused_and_the_cli_offers_exactly_the_known_ones() -> None:
    with pytest.raises(ValueError, match="fault kinds"):
        schedule(7, 30, 4, ["disk_full"])
    assert cli._SOAK_KINDS == KINDS


def test_tally_counts_lost_duplicated_resurrected_and_stale_rows() -> None:
    source = {1: {"id": 1, "v": "a"}, 2: {"id": 2, "v": "b"}, 3: {"id": 3, "v": "c"}, 4: {"id": 4, "v": "d"}}
    lake = [{"id": 1, "v": "a", "_lsn": 9},  # exact
            {"id": 2, "v": "b"}, {"id": 2, "v": "b"}, {"id": 2, "v": "b"},  # two extra copies
            {"id": 3, "v": "old"},  # stale
            {"id": 7, "v": "x"}]  # deleted in the source, live in the lake; 4 is lost
    t = tally(source, lake, "id", ["v"])
    assert (t.source_rows, t.lake_rows, t.lost, t.duplicated, t.resurrected, t.stale) == (4, 6, 1, 2, 1, 1)
    assert not t.exact
    assert tally(source, list(source.values()), "id", ["v"]).exact
    assert tally({}, [], "id", ["v"]).as_dict()["exact"]


def test_recovery_is_when_everything_committed_before_the_end_was_visible() -> None:
    committed = [10.0, 12.0, 20.0, 31.0, 40.0]
    visible = [15.0, 45.0, 25.0, 36.0, 41.0]  # the change of 12.0 waited for the fault
    catch = CatchUp(committed, visible)
    assert catch.seconds_after(5.0) is None, "nothing committed before"
    assert catch.seconds_after(30.0) == 15.0  # 12.0's visibility at 45
    assert catch.seconds_after(50.0) == 0.0, "all visible before the instant"
    assert CatchUp([3.0, 1.0], [4.0, 9.0]).seconds_after(2.0) == 7.0, "unsorted input"


def test_changes_inside_fault_windows_and_percentiles() -> None:
    committed = np.array([1.0, 5.0, 10.0, 15.0, 20.0])
    assert affected(committed, [(4.0, 11.0), (20.0, 21.0)]).tolist() == [False, True, True, False, True]
    assert percentiles(np.array([]))["n"] == 0
    assert percentiles(np.arange(1.0, 101.0)) == {"p50": 50.5, "p95": 95.05, "max": 100.0, "n": 100}


def _perf_buffer(counters: dict[str, int], little: bool = True) -> bytes:
    """A HotSpot perf-data buffer (hsperfdata 2.0) holding `counters` as longs, and one byte-vector entry."""
    order = "<" if little else ">"
    entries = b""
    for name, value in [*counters.items(), ("sun.rt.javaCommand", None)]:
        raw = name.encode() + b"\0"
        raw += b"\0" * (-(20 + len(raw)) % 8)
        data = struct.pack(f"{order}q", value) if value is not None else b"org.Main\0\0\0\0\0\0\0\0"
        kind, vector = (ord("J"), 0) if value is not None else (ord("B"), len(data))
        entries += struct.pack(f"{order}iiibbbbi", 20 + len(raw) + len(data), 20, vector, kind, 0, 0, 0,
                               20 + len(raw)) + raw + data
    prologue = b"\xca\xfe\xc0\xc0" + bytes([1 if little else 0, 2, 0, 1])
    prologue += struct.pack(f"{order}iiqii", 32 + len(entries), 0, 0, 32, len(counters) + 1)
    return prologue + entries


@pytest.mark.parametrize("little", [True, False])
def test_perf_data_gives_the_heap_in_use_by_generation(little: bool) -> None:
    mib = 2**20
    buffer = _perf_buffer({"sun.gc.generation.0.space.0.used": 30 * mib, "sun.gc.generation.0.space.1.used": 2 * mib,
                           "sun.gc.generation.1.space.0.used": 100 * mib,
                           "sun.gc.generation.1.space.0.capacity": 500 * mib, "sun.gc.metaspace.used": 80 * mib},
                          little)
    counters = perf_counters(buffer)
    assert counters["sun.gc.metaspace.used"] == 80 * mib
    assert heap_used(counters) == (132.0, 100.0)
    assert heap_used({"sun.os.hrt.ticks": 1}) is None
    with pytest.raises(ValueError):
        perf_counters(b"\0" * 64)


def test_an_insert_played_again_is_an_upsert_of_the_same_image() -> None:
    source = ShopSource(3)
    inserts = list(statements(source.snapshot(WorkloadConfig(seed=3, customers=2, orders=2))))
    assert inserts and all(s.op == "c" for s in inserts)
    first = inserts[0]
    assert first.again.startswith(first.sql + " ON CONFLICT (id) DO UPDATE SET ")
    assert "id = EXCLUDED.id" not in first.again and "email = EXCLUDED.email" in inserts[0].again


def test_the_report_and_the_chart_come_from_the_figures(tmp_path) -> None:
    from lakehouse_dev.bench import soak
    from lakehouse_dev.bench.plots import soak_chart

    plan = soak.SoakPlan(minutes=4, rate=300, every_minutes=0.75, warmup_minutes=0.5, tail_minutes=0.5,
                         fault_seconds=15)
    t0 = 1000.0
    committed = t0 + np.linspace(0, 240, 2000)
    visible = committed + 5 + (np.arange(2000) % 7)
    catch = CatchUp(committed, visible)
    runs = [{"kind": f.kind, "start": t0 + f.at, "end": t0 + f.end, "at_min": round(f.at / 60, 2), "seconds": f.seconds,
             "recovery_seconds": catch.seconds_after(t0 + f.end), "delay_seconds": percentiles(visible - committed)}
            for f in plan.faults]
    memory = [{"t": t0 + 5 * i, "pid": 42, "rss_mib": 900.0 + i, "heap_used_mib": 300.0, "old_used_mib": 200.0}
              for i in range(48)]
    live = [{"t": t0 + 60 * i, "pid": 42, "live_mib": 200.0 + i, "classes": {"[B": 100.0 + i}} for i in range(4)]
    exact = {"source_rows": 10, "lake_rows": 10, "lost": 0, "duplicated": 0, "resurrected": 0, "stale": 0}
    figures = {"plan": {"minutes": 4, "rate": 300, "warmup_minutes": 0.5}, "t0": t0, "fault_runs": runs,
               "kafka_records_per_s": 299.0, "changes_per_s": 270.0, "caught_up_after_load_seconds": 9.0,
               "ensure_acted": [], "memory": memory, "live": live,
               "bronze": {"customers": exact, "orders": {**exact, "lost": 2}},
               "silver": {"orders": exact}, "gold": {"customer_ltv": exact},
               "delay_seconds": {"during_faults": percentiles(np.array([9.0])),
                                 "outside_faults": percentiles(np.array([6.0]))},
               "quiet_catch_up_seconds": percentiles(np.array([5.0])),
               "delay_series": soak._series(committed - t0, visible - committed),
               "memory_summary": soak._memory(memory, t0 + 30), "live_summary": live_summary(live, t0 + 30)}
    text = soak.report(figures)
    assert "| 201.0→203.0 " in text and "[B +2" in text, "the live set after the warm-up, and what grew"
    assert "| 2/0/0/0 " in text, "lost rows summed over the tables"
    assert "911.5→941.5" in text, "RSS: medians of the first minute after the warm-up and of the last"
    assert text.count("broker_kill") + text.count("kafka_blackout") + text.count("postgres_restart") >= len(runs)
    assert soak_chart(figures, tmp_path / "soak.png").stat().st_size > 10_000


HISTOGRAM = """12345:
 num     #instances         #bytes  class name (module)
-------------------------------------------------------
   1:         81234      104857600  [B (java.base@17.0.13)
   2:          2048        3145728  org.apache.spark.status.TaskDataWrapper
   3:            10           1024  java.lang.Object (java.base@17.0.13)
Total         83292      108004352
"""


def test_a_class_histogram_reads_as_the_live_set_and_its_largest_classes() -> None:
    live, classes = parse_histogram(HISTOGRAM, top=2)
    assert live == 103.0  # 108,004,352 bytes
    assert classes == {"[B": 100.0, "org.apache.spark.status.TaskDataWrapper": 3.0}
    with pytest.raises(ValueError, match="no Total line"):
        parse_histogram("12345:\nConnection refused")


def test_the_live_set_trend_per_jvm_counts_from_the_warm_up_and_names_what_grew() -> None:
    t0 = 10_000.0
    first = [{"t": t0 - 60, "pid": 1, "live_mib": 90.0, "classes": {}}]  # in the warm-up: not counted
    first += [{"t": t0 + 120 * i, "pid": 1, "live_mib": 500.0 + 10 * i,
               "classes": {"leaky": 100.0 + 10 * i, "steady": 50.0}} for i in range(6)]
    # A restarted stream: a second JVM whose live set levels off after filling its bounded stores.
    second = [{"t": t0 + 900 + 120 * i, "pid": 2, "live_mib": min(400.0 + 40 * i, 480.0), "classes": {"steady": 50.0}}
              for i in range(6)]
    one, two = live_summary(first + second, t0)["jvms"]
    assert (one["pid"], one["readings"], one["minutes"]) == (1, 6, 10.0)
    assert (one["live_first_mib"], one["live_last_mib"]) == (500.0, 550.0)
    assert one["trend_mib_per_min"] == one["second_half_trend_mib_per_min"] == 5.0
    assert one["grew_most_mib"] == {"leaky": 50.0, "steady": 0.0}
    assert two["trend_mib_per_min"] > 0 and two["second_half_trend_mib_per_min"] == 0.0
    # A collection that lands while a batch holds its rows: one reading far above the others moves the trend little.
    spike = [dict(r, live_mib=1600.0) if i == 3 else r for i, r in enumerate(first)]
    assert live_summary(spike, t0)["jvms"][0]["trend_mib_per_min"] == 5.0
