"""Soak: half an hour of steady changes on the real source while the world around the stream fails.

`lakehouse dev bench soak` plays the shop generator's changes as SQL on a real PostgreSQL at a steady
rate (`sql_sink.PlayAtRate`), Debezium captures them, the supervised stream (`lakehouse stream
start`, then `ensure` every few minutes as the bronze_ingest_stream DAG runs it) ingests them, and
every few minutes a fault from a seeded schedule breaks something around it (soak_plan.schedule,
soak_rig.inject). Then the checker:

- **Exactness**: the load stops, a marker change proves Debezium has delivered everything
  (`sql_sink.mark`), the stream catches up (`stream wait`) and stops; every bronze table is
  compared with PostgreSQL's own rows read with SQL (source_state, the oracle): rows lost,
  duplicated, resurrected, stale (soak_plan.tally). Then one `lakehouse etl`: every live source
  key must be in silver or its quarantine, once.
- **Recovery** per fault: from its end until everything the source committed before that end was
  visible in bronze (soak_plan.CatchUp), beside the same figure at quiet instants.
- **Freshness**: a change's delay is its bronze visibility (lakehouse_dev.bench.visibility)
  minus its commit time in PostgreSQL (Debezium's `source.ts_ms`; same machine, same clock), p50
  and p95 for the changes committed during a fault or its recovery, and for the others.
- **Memory**: the stream driver JVM's resident set and heap in use every few seconds
  (lakehouse_dev.bench.memory), at the start of the counted run and at its end; and every two
  minutes its live set (what a full collection leaves), its trend in MiB per minute and the classes
  that grew: the reading that tells a leak from a heap not yet collected.

Figures on stdout, JSON and a PNG (freshness and memory over time, faults shaded) in the bench dir.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import click
import numpy as np

from lakehouse_dev import sql_sink
from lakehouse_dev.bench.common import DELETE_FRACTION, bench_dir, lakehouse, save, say, table
from lakehouse_dev.bench.freshness import shop_workload
from lakehouse_dev.bench.plots import soak_chart
from lakehouse_dev.bench.soak_plan import (
    DEFAULT_KINDS,
    DURATIONS,
    CatchUp,
    Fault,
    affected,
    live_summary,
    percentiles,
    schedule,
    tally,
)
from lakehouse_dev.bench.soak_rig import Ensure, Rig, Sampler, inject, rig
from lakehouse_dev.bench.visibility import LagProbe, topics_of, visibility
from lakehouse_dev.generator import ShopSource, WorkloadConfig
from lakehouse_dev.source_state import database_state
from lakehouse_dev.supervised import SupervisorError
from pipelines.lake.contract import COLUMNS, PRIMARY_KEY, TABLES
from pipelines.lake.layout import gold_path, main_path, quarantine_path, silver_path
from pipelines.lake.table_stats import has_completed_commit, read_table
from pipelines.runtime.settings import INGEST_TRIGGER_SECONDS

NAME = "soak"
_SETTLE_TIMEOUT = 900.0
# Generator changes per call: a few seconds of load, generated just ahead of being played.
_CHUNK = 4000


@dataclass(frozen=True)
class SoakPlan:
    """What one soak does; `lakehouse dev bench soak --help` says each."""

    minutes: float = 30.0
    rate: float = 2000.0
    seed: int = 7
    every_minutes: float = 3.0
    kinds: tuple[str, ...] = DEFAULT_KINDS
    warmup_minutes: float = 3.0
    tail_minutes: float = 3.0
    fault_seconds: float | None = None  # every fault's duration instead of its kind's (soak_plan.DURATIONS)
    trigger_seconds: float = INGEST_TRIGGER_SECONDS
    snapshot_rows: int = 2000
    ensure_seconds: float = 300.0
    etl: bool = True
    faults: list[Fault] = field(init=False)

    def __post_init__(self) -> None:
        durations = {k: self.fault_seconds or v for k, v in DURATIONS.items()}
        object.__setattr__(self, "faults", schedule(self.seed, self.minutes, self.every_minutes, self.kinds,
                                                    self.warmup_minutes, self.tail_minutes, durations))


def _workload(seed: int, **more: Any) -> WorkloadConfig:
    """The source's changes: no replays, malformed records or logical messages (the real connector makes its own)."""
    return WorkloadConfig(seed=seed, delete_fraction=DELETE_FRACTION, replay_runs=0, malformed_fraction=0.0,
                          other_ops=False, **more)


def run(plan: SoakPlan) -> dict[str, Any]:
    """The soak (module docstring); its figures, saved and plotted."""
    home = bench_dir() / NAME
    shop = shop_workload(NAME, plan.seed, plan.snapshot_rows)
    topics = topics_of(shop.declaration)
    sim = ShopSource(plan.seed)
    env = {**shop.env, "LAKEHOUSE_ERASURE_KEY_FILE": str(home / "erasure.key")}
    customers = plan.snapshot_rows // 4

    def snapshot(dsn: str) -> None:
        say(f"source: {plan.snapshot_rows:,} rows before Debezium's snapshot")
        sql_sink.apply(sim.snapshot(_workload(plan.seed, customers=customers,
                                              orders=plan.snapshot_rows - customers, changes=0)), dsn)

    say(f"soak: {plan.minutes:g} min at {plan.rate:g} records/s, faults "
        + ", ".join(f"{f.kind}@{f.at / 60:.1f}m/{f.seconds:g}s" for f in plan.faults))
    with rig(home, env, plan.trigger_seconds, snapshot, shop.declaration) as r:
        figures = _soak(r, plan, sim, topics)
        figures |= _check(r, plan)
    figures |= _freshness(r, plan, figures, topics)
    figures["plot"] = str(soak_chart(figures, bench_dir() / f"{NAME}.png"))
    save(NAME, figures)
    return figures


def _soak(r: Rig, plan: SoakPlan, sim: ShopSource, topics: dict[str, str]) -> dict[str, Any]:
    """The load, the faults and the samplers; then the source drained into bronze and the stream stopped."""
    dsn = r.source.postgres.dsn
    say(f"lakehouse stream start: {r.stream.run('start', 'stream started')}; waiting for the snapshot in bronze")
    probe = LagProbe(r.broker.bootstrap, str(r.stream.root), topics)
    sampler, ensure = Sampler(r), Ensure(r.stream, plan.ensure_seconds)
    try:
        _until(lambda: probe.lag()["total"] == 0, _SETTLE_TIMEOUT, "the source's snapshot in bronze", r)
        start_offsets = probe.kafka_end()
        player = sql_sink.PlayAtRate(dsn, plan.rate, lambda: sim.changes(_workload(plan.seed, changes=_CHUNK)))
        thread = threading.Thread(target=player.run, name="soak-load", daemon=True)
        t0 = time.time()
        thread.start()
        sampler.start(probe)
        ensure.start()
        say(f"steady load started; stream pid {r.stream.pid()}")
        done_faults = []
        try:
            for fault in plan.faults:
                _pace(t0, fault.at, thread, player, sampler)
                say(f"fault: {fault.kind} for {fault.seconds:g}s")
                done_faults.append(inject(r, fault))
                say(f"fault over: {fault.kind}; stream status half-way: {done_faults[-1]['status']}")
            _pace(t0, plan.minutes * 60, thread, player, sampler)
        finally:
            player.stop.set()
            thread.join(timeout=600)
            ensure.stop.set()
        stopped = time.time()
        say(f"load stopped: {player.played:,} changes in {player.transactions:,} transactions; "
            "waiting for Debezium to deliver the last")
        sql_sink.mark(dsn, r.broker.bootstrap)
        # As the DAG would, sooner or later: a stream that died is started again before it is waited for.
        if not (said := r.stream.run("ensure")).startswith("running"):
            ensure.acted.append({"t": time.time(), "said": said})
        try:
            say(f"stream {r.stream.run('wait', 'caught up')}")
        except SupervisorError as exc:  # checked all the same: what it lacks is counted as lost
            say(f"the stream did not catch up: {exc}")
        caught_up = time.time()
        sampler.close()
        end_offsets = probe.kafka_end()
        r.stream.run("stop", "stopped")
    finally:
        sampler.close()
        ensure.stop.set()
        probe.close()
    return {"plan": {k: v for k, v in plan.__dict__.items() if k != "faults"},
            "planned_faults": [f.__dict__ for f in plan.faults], "faults": done_faults,
            "t0": t0, "load_stopped": stopped, "caught_up_after_load_seconds": round(caught_up - stopped, 1),
            "changes_played": player.played, "records_played": player.records, "transactions": player.transactions,
            "changes_per_s": round(player.played / (stopped - t0), 1),
            "records_per_s": round(player.records / (stopped - t0), 1),
            "kafka_records_per_s": round(sum(end_offsets[tp] - start_offsets.get(tp, 0) for tp in end_offsets)
                                         / (stopped - t0), 1),
            "source_outages": [[round(a - t0, 1), round(b - t0, 1)] for a, b in player.outages],
            "kafka_records": sum(end_offsets[tp] - start_offsets.get(tp, 0) for tp in end_offsets),
            "offsets": {"start": start_offsets, "end": end_offsets},
            "ensure_acted": ensure.acted, "connector_restarts": sampler.connector_restarts,
            "memory": sampler.memory, "live": sampler.live, "lag": sampler.lag}


def _pace(t0: float, until: float, load: threading.Thread, player: sql_sink.PlayAtRate, sampler: Sampler) -> None:
    """Wait until `until` seconds after `t0`, a progress line every 30 s; fail if the load died."""
    last = 0.0
    while (now := time.time()) < t0 + until:
        if not load.is_alive():
            raise click.ClickException("the SQL load stopped (see the traceback above)")
        if now - last >= 30:
            s = sampler.latest()
            say(f"{(now - t0) / 60:5.1f} min: {player.played:,} changes played, lag {s.get('total', '?')} records, "
                f"slot {(s.get('slot_lag_bytes') or 0) / 2**20:.1f} MiB behind, driver RSS {s.get('rss_mib')} MiB, "
                f"heap {s.get('heap_used_mib')} MiB")
            last = now
        time.sleep(min(1.0, max(0.0, t0 + until - now)))


def _until(done: Any, timeout: float, what: str, r: Rig) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise click.ClickException(f"no end to {what} after {timeout:.0f}s; stream log {r.stream.log_path}")
        time.sleep(2)


def _rows(path: str, columns: list[str]) -> list[dict[str, Any]]:
    return read_table(path, columns).to_pylist() if has_completed_commit(path) else []


def _check(r: Rig, plan: SoakPlan) -> dict[str, Any]:
    """Bronze against PostgreSQL's rows (the oracle); after one etl, silver and quarantine against its keys."""
    say("checking bronze against PostgreSQL's rows")
    postgres = r.source.postgres.start()  # started again only if a fault left it down
    state = database_state(postgres)
    root = str(r.stream.root)
    bronze = {t: tally(state[t], _rows(main_path(t, root), list(COLUMNS[t])), PRIMARY_KEY, COLUMNS[t]).as_dict()
              for t in TABLES}
    say("bronze: " + "; ".join(f"{t} {v['lake_rows']:,} rows, lost {v['lost']}, duplicated {v['duplicated']}, "
                               f"resurrected {v['resurrected']}, stale {v['stale']}" for t, v in bronze.items()))
    out: dict[str, Any] = {"bronze": bronze}
    if plan.etl:
        say("lakehouse etl, then silver, its quarantine and gold/customer_ltv checked")
        seconds = lakehouse("etl", env=r.stream.env, log=r.home / "etl.log")
        keys = PRIMARY_KEY
        out["silver"] = {t: {**tally({k: {} for k in state[t]},
                                     _rows(silver_path(t, root), [keys]) + _rows(quarantine_path(t, root), [keys]),
                                     keys, ()).as_dict(), "etl_seconds": round(seconds, 1)} for t in TABLES}
        # gold/customer_ltv: one row per silver customer (contract section 3).
        silver_customers = {r[keys]: {} for r in _rows(silver_path("customers", root), [keys])}
        out["gold"] = {"customer_ltv": tally(silver_customers, _rows(gold_path("customer_ltv", root), ["customer_id"]),
                                             "customer_id", ()).as_dict()}
        say("silver + quarantine keys: " + "; ".join(
            f"{t} lost {v['lost']}, duplicated {v['duplicated']}, resurrected {v['resurrected']}"
            for t, v in out["silver"].items()))
    return out


def _freshness(r: Rig, plan: SoakPlan, figures: dict[str, Any], topics: dict[str, str]) -> dict[str, Any]:
    """Per change, commit in PostgreSQL to visible in bronze; per fault, its recovery and freshness."""
    t0 = figures["t0"]
    say("freshness: every change bronze applied, from its change log")
    seen = [v for v in visibility(str(r.stream.root), figures["offsets"]["start"], figures["offsets"]["end"], topics)
            if v.source_ts is not None]
    committed = np.array([v.source_ts for v in seen])
    visible = np.array([v.visible_at for v in seen])
    delay = visible - committed
    catch = CatchUp(committed, visible)
    faults, windows = [], []
    for f in figures["faults"]:
        recovery = catch.seconds_after(f["end"])
        until = f["end"] + (recovery or 0.0)
        windows.append((f["start"], until))
        inside = affected(committed, [(f["start"], until)])
        faults.append({**f, "at_min": round((f["start"] - t0) / 60, 2), "seconds": round(f["end"] - f["start"], 1),
                       "recovery_seconds": recovery, "delay_seconds": percentiles(delay[inside])})
    counted = committed >= t0 + plan.warmup_minutes * 60
    during = affected(committed, windows)
    quiet = [catch.seconds_after(t) for t in np.arange(t0 + plan.warmup_minutes * 60, figures["load_stopped"], 10.0)
             if not affected(np.array([t]), windows)[0]]
    quiet_values = np.array([q for q in quiet if q is not None])
    return {"fault_runs": faults, "changes_seen": len(seen),
            "delay_seconds": {"during_faults": percentiles(delay[counted & during]),
                              "outside_faults": percentiles(delay[counted & ~during]),
                              "warmup": percentiles(delay[~counted])},
            "quiet_catch_up_seconds": percentiles(quiet_values),
            "delay_series": _series(committed - t0, delay),
            "memory_summary": _memory(figures["memory"], t0 + plan.warmup_minutes * 60),
            "live_summary": live_summary(figures.get("live", []), t0 + plan.warmup_minutes * 60)}


def _series(at: np.ndarray, delay: np.ndarray, step: float = 10.0) -> list[dict[str, float]]:
    """p50 and p95 of the delay per `step` seconds of commit time, for the plot."""
    if not len(at):
        return []
    bins = np.floor(at / step).astype(int)
    return [{"t": float(b * step), "p50": round(float(np.percentile(delay[bins == b], 50)), 2),
             "p95": round(float(np.percentile(delay[bins == b], 95)), 2)} for b in np.unique(bins)]


def _memory(samples: list[dict[str, Any]], counted_from: float, window: float = 60.0,
            floor_window: float = 300.0) -> dict[str, Any]:
    """The driver JVM's memory at the start of the counted run and at its end, its peak, and the JVMs seen (more
    than one: the stream was started again).

    Resident memory and heap in use: medians of the first and the last `window` seconds of samples (one
    reading of the heap catches any point of the collector's saw-tooth). The old generation: its floor,
    the least in use over the first and the last `floor_window` seconds (a third of a shorter run). G1
    (spark.toml) starts collecting the old generation only once the heap fills to its initiating
    occupancy (adaptive, 45% at first), so between its mixed collections the old generation holds
    garbage too; what survives every collection, the floor, is where a leak shows.
    """
    read = [s for s in samples if s["rss_mib"] is not None]
    if not read:
        return {}

    def between(start: float, end: float) -> list[dict[str, Any]]:
        return [s for s in read if start <= s["t"] < end] or read[:1]

    def stat(rows: list[dict[str, Any]], key: str, how: Any = np.median) -> float | None:
        values = [s[key] for s in rows if s[key] is not None]
        return round(float(how(values)), 1) if values else None

    end = read[-1]["t"] + 1
    floor_window = min(floor_window, (end - counted_from) / 3)  # a short run: its thirds, not overlapping
    first, last = between(counted_from, counted_from + window), between(end - window, end)
    first_floor, last_floor = between(counted_from, counted_from + floor_window), between(end - floor_window, end)
    return {"rss_start_mib": stat(first, "rss_mib"), "rss_end_mib": stat(last, "rss_mib"),
            "rss_max_mib": max(s["rss_mib"] for s in read), "heap_start_mib": stat(first, "heap_used_mib"),
            "heap_end_mib": stat(last, "heap_used_mib"), "old_floor_start_mib": stat(first_floor, "old_used_mib", min),
            "old_floor_end_mib": stat(last_floor, "old_used_mib", min), "window_seconds": window,
            "floor_window_seconds": round(floor_window), "jvm_pids": sorted({s["pid"] for s in read})}


def report(figures: dict[str, Any]) -> str:
    """The results tables (stdout of `lakehouse dev bench soak`), as BENCHMARKS.md shows them."""
    kinds: dict[str, int] = {}
    for f in figures["fault_runs"]:
        kinds[f["kind"]] = kinds.get(f["kind"], 0) + 1
    b = figures["bronze"]
    d, m = figures["delay_seconds"], figures["memory_summary"]
    summary = {"minutes": f"{figures['plan']['minutes']:g}", "records/s": figures["kafka_records_per_s"],
               "changes/s": figures["changes_per_s"],
               "faults": " ".join(f"{k}×{n}" for k, n in kinds.items()) or "-",
               "lost/dup/resurrected/stale": "/".join(str(sum(v[k] for v in b.values()))
                                                      for k in ("lost", "duplicated", "resurrected", "stale")),
               "p50/p95 s outside": f"{d['outside_faults']['p50']}/{d['outside_faults']['p95']}",
               "p50/p95 s during": f"{d['during_faults']['p50']}/{d['during_faults']['p95']}",
               "RSS MiB start→end": f"{m.get('rss_start_mib')}→{m.get('rss_end_mib')}",
               "heap MiB start→end": f"{m.get('heap_start_mib')}→{m.get('heap_end_mib')}",
               "old gen floor MiB start→end": f"{m.get('old_floor_start_mib')}→{m.get('old_floor_end_mib')}"}
    live = [{"driver JVM": j["pid"], "minutes": j["minutes"], "readings": j["readings"],
             "live set MiB first→last": f"{j['live_first_mib']}→{j['live_last_mib']}",
             "MiB/min": j["trend_mib_per_min"], "MiB/min, 2nd half": j["second_half_trend_mib_per_min"],
             "grew most (MiB)": ", ".join(f"{c} {v:+g}" for c, v in list(j["grew_most_mib"].items())[:4])}
            for j in figures.get("live_summary", {}).get("jvms", [])]
    faults = [{"#": i + 1, "kind": f["kind"], "at min": f["at_min"], "s": f["seconds"],
               "recovery s": f["recovery_seconds"], "p95 s during": f["delay_seconds"]["p95"]}
              for i, f in enumerate(figures["fault_runs"])]
    tables = [{"table": f"bronze/{t}", **{k: v[k] for k in ("source_rows", "lake_rows", "lost", "duplicated",
                                                            "resurrected", "stale")}} for t, v in b.items()]
    keyed = ("source_rows", "lake_rows", "lost", "duplicated", "resurrected")
    tables += [{"table": f"silver+quarantine/{t}", **{k: v[k] for k in keyed}}
               for t, v in figures.get("silver", {}).items()]
    tables += [{"table": f"gold/{t} (vs silver)", **{k: v[k] for k in keyed}}
               for t, v in figures.get("gold", {}).items()]
    q = figures["quiet_catch_up_seconds"]
    return "\n\n".join([
        table([summary], list(summary)),
        table(faults, ["#", "kind", "at min", "s", "recovery s", "p95 s during"])
        + f"\nrecovery at quiet instants (the baseline): p50 {q['p50']}s, p95 {q['p95']}s",
        table(tables, ["table", "source_rows", "lake_rows", "lost", "duplicated", "resurrected", "stale"]),
        table(live, list(live[0])) if live else "no live-set reading of the driver JVM",
        f"stream restarted by ensure: {len(figures['ensure_acted'])}; Debezium's FAILED task restarted by the soak "
        f"(Connect does not): {len(figures.get('connector_restarts', []))}; driver JVMs seen: {m.get('jvm_pids')}; "
        f"caught up {figures['caught_up_after_load_seconds']}s after the load stopped"])
