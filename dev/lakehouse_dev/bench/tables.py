"""Many tables in one stream: each table's freshness against its own target, and what idle tables cost.

The real continuous ingest runs, as in `bench freshness` (its `steady` run: own process and JVM,
a private broker, delays read from the timelines afterwards), on declared tables of mixed shapes
(`table_mix`: 50 by default, written as a declaration that LAKEHOUSE_TABLES names) with skewed
traffic: 2,000 records/s, a Zipf share per table (exponent 2: the busiest 5 of 50 take 90%).

- **Per-table freshness**: each table's changes counted after the warm-up, p50/p95/max of their
  delay (Kafka timestamp to the completion of the bronze commit that made them visible), against
  the table's `freshness_seconds`. Production goes on for a cool-down after the counted minutes,
  so that the last changes of a quiet table are committed by its cadence, not by the stop.
- **The hot tables against the shop**: the busiest tables' p95 against the shop's two-table
  freshness run at the same rate in the same session (`freshness.run`, or its saved figures).
- **Deployments**: the same changes, on the busiest 3 tables only, into a stream of 3, of 5 and of
  all the tables (each a fresh lake whose other tables hold a small snapshot and then idle): the
  batches' mean time (3 of 50 against 3 alone), the stream's start on the lake it built (a restart:
  process start to its first batch done, every table's newest commits read on the way) and the
  peak memory of its driver JVM (the kernel's high-water mark of resident memory).

Run: `lakehouse dev bench tables --help`; `--tables 8 --minutes 0.5 --warmup-minutes 0 --no-reference
--deployment-minutes 0.25` is a quick check of the whole path.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import click

from lakehouse_dev.bench import freshness
from lakehouse_dev.bench.common import bench_dir, save, say, table
from lakehouse_dev.bench.freshness import SteadyRun, Workload, delay_figures, steady
from lakehouse_dev.bench.plots import table_freshness_chart
from lakehouse_dev.bench.table_mix import (
    Shape,
    TableMix,
    describe,
    record_shares,
    snapshot_rows,
    table_shapes,
    top_share,
    write_declaration,
)
from lakehouse_dev.bench.visibility import CommitLog
from lakehouse_dev.generator.kafka import produce
from pipelines.lake.declaration import DECLARATION_VARIABLE, DEFAULT_FRESHNESS_SECONDS, Declaration, load
from pipelines.lake.layout import changelog_path, main_path

NAME = "tables"
# The goals: the hot tables' p95 at most this times the shop's, and a batch
# touching a few tables of many at most this times the same batch on a deployment of those alone.
HOT_ALLOWANCE = 1.2
BATCH_ALLOWANCE = 1.3
# 50 tables each due every 15 s need 3.3 commits a second (a main's and a change log's each); the goal on 2 cores.
COMMITS_PER_SECOND = 1.5
# Records produced before a deployment's stream is started again on its lake (its start is measured).
RESTART_RECORDS = 100


@dataclass(frozen=True)
class Plan:
    """What `bench tables` runs (its options)."""

    tables: int = 50
    rate: float = 2000.0
    minutes: float = 5.0
    warmup_minutes: float = 3.0
    trigger_seconds: float = 5.0
    exponent: float = 2.0
    hot: int = 5
    target: float = DEFAULT_FRESHNESS_SECONDS
    cold_target: float | None = None
    snapshot_rows: int = 2000
    seed: int = 7
    # The shop's reference: a run of this many counted minutes (0: none), or the figures of one saved before.
    reference_minutes: float = 5.0
    reference_warmup_minutes: float = 3.0
    reference_from: Path | None = None
    # The deployments: the busiest `touched` tables' changes into streams of `touched`, `small` and all tables.
    deployments: bool = True
    touched: int = 3
    small: int = 5
    deployment_minutes: float = 1.0
    deployment_warmup_minutes: float = 1.0

    def cooldown_seconds(self, shapes: list[Shape]) -> float:
        """Production after the counted minutes: long enough for any table's last counted change to fall due
        by its target while batches still run (three trigger intervals of slack)."""
        return max(s.freshness_seconds for s in shapes) + 3 * self.trigger_seconds


def run(plan: Plan) -> dict[str, Any]:
    """The main run, the shop's reference and the deployments; figures saved as `tables.json`, plotted."""
    if not 0 < plan.touched <= plan.tables:
        raise click.BadParameter(f"--touched {plan.touched} must be 1 to --tables ({plan.tables})")
    shapes = table_shapes(plan.tables, plan.exponent, plan.seed, plan.target, plan.cold_target, plan.hot)
    planned = [s.share for s in shapes]
    say(f"{plan.tables} tables, Zipf exponent {plan.exponent:g}: the busiest {plan.hot} take "
        f"{top_share(planned, plan.hot):.1%} of the records ("
        + ", ".join(f"{s.name} {s.share:.1%}" for s in shapes[:plan.hot]) + f"), the quietest {shapes[-1].share:.2%}")
    main = _steady(f"{NAME}_main", shapes, shapes, plan, plan.minutes, plan.warmup_minutes)
    per_table = _per_table(main, shapes)
    actual = {r["table"]: r["record_share"] for r in per_table}
    say(f"records per table: the busiest {plan.hot} took {top_share(actual, plan.hot):.1%} (planned "
        f"{top_share(planned, plan.hot):.1%}): " + ", ".join(f"{t} {s:.1%}" for t, s in list(actual.items())[:8])
        + (", ..." if len(actual) > 8 else ""))
    commits = commit_figures(Path(main.figures["ingest_log"]).with_name("lake"), load(
        bench_dir() / f"{NAME}_main" / "tables.toml"), main.figures)
    say(f"table commits: {commits['per_second']} a second in the counted window ({commits['main']} main, "
        f"{commits['changelog']} change log)")
    reference = _reference(plan)
    deployments = _deployments(shapes, plan) if plan.deployments else {}
    figures = {
        "plan": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(plan).items()},
        "planned_top_share": round(top_share(planned, plan.hot), 4),
        "actual_top_share": round(top_share(actual, plan.hot), 4),
        "per_table": per_table,
        "hot_delay_seconds": delay_figures([v for v in main.changes if v.table in {s.name for s in shapes[:plan.hot]}]),
        "main": {k: v for k, v in main.figures.items() if k != "lag"},
        "commits": commits,
        "lag": [{"t": s["t"], "total": s["total"]} for s in main.figures["lag"]],
        "reference": reference,
        "deployments": deployments,
    }
    limit = (f"the busiest {plan.hot}: at most {HOT_ALLOWANCE:g} x the shop's p95",
             HOT_ALLOWANCE * reference["delay_seconds"]["p95"], plan.hot) if reference else None
    figures["plot"] = str(table_freshness_chart(
        sorted((r for r in per_table if r["changes"]), key=lambda r: -r["records_per_s"]), bench_dir() / f"{NAME}.png",
        f"Freshness per table: {plan.tables} tables, {plan.rate:g} records/s (Zipf {plan.exponent:g}), "
        f"{plan.minutes:g} counted min", limit))
    save(NAME, figures)
    return figures


def _steady(name: str, shapes: list[Shape], busy: list[Shape], plan: Plan, minutes: float, warmup_minutes: float,
            restart: int = 0) -> SteadyRun:
    """A steady run of a deployment of `shapes`: each holds a snapshot, and the changes go to `busy` (the first
    of them) alone. The busy tables' records come from a generator of their own, the same in every deployment."""
    path = write_declaration(shapes, bench_dir() / name / "tables.toml")
    changing = TableMix(busy, plan.seed)
    idle = TableMix(shapes[len(busy):], plan.seed + 1) if len(shapes) > len(busy) else None

    def snapshot(bootstrap: str) -> int:
        rows = snapshot_rows(shapes, plan.snapshot_rows)
        messages = changing.snapshot({s.name: rows[s.name] for s in busy})
        if idle is not None:
            messages += idle.snapshot({s.name: rows[s.name] for s in shapes[len(busy):]})
        say(f"snapshot: {len(messages):,} rows of {len(shapes)} tables")
        return produce(messages, bootstrap)

    workload = Workload(name, load(path), snapshot, changing.changes, {DECLARATION_VARIABLE: str(path)})
    return steady(workload, minutes, plan.rate, plan.trigger_seconds, warmup_minutes,
                  cooldown_seconds=plan.cooldown_seconds(shapes), restart_records=restart)


def commit_figures(root: Path, decl: Declaration, figures: dict[str, Any]) -> dict[str, Any]:
    """Table commits a second in the counted window (main's delta commits and the change logs' commits, counted on
    their timelines by completion time), and where a table's part of a batch goes, phase by phase: each table
    phase (`<table>.plan`, `.changelog`, `.table`, ...) of the counted batches, summed over the tables and divided
    by the main commits those batches made (the `.table` phases)."""
    since = figures["counted_from"]
    until = figures["counted_until"] or since + figures["minutes"] * 60
    counted = {"main": 0, "changelog": 0}
    for t in decl.names:
        for part, path, action in (("main", main_path(t, str(root)), "deltacommit"),
                                   ("changelog", changelog_path(t, str(root)), "commit")):
            counted[part] += sum(since <= c.completed < until for c in CommitLog(path, action).refresh())
    batches = figures["batches"]
    totals: dict[str, float] = defaultdict(float)
    for name, mean in batches["phases_mean"].items():
        table_name, dot, phase = name.rpartition(".")
        if dot and table_name in decl.tables:
            totals[phase] += mean * batches["count"]
    mains = sum(n for name, n in batches["phases_batches"].items()
                if name.endswith(".table") and name.removesuffix(".table") in decl.tables)
    return {**counted, "seconds": round(until - since, 1),
            "per_second": round((counted["main"] + counted["changelog"]) / (until - since), 2),
            "batch_main_commits": mains,
            "phase_seconds_per_main_commit": {k: round(v / max(1, mains), 2) for k, v in
                                              sorted(totals.items(), key=lambda kv: -kv[1])}}


def _per_table(done: SteadyRun, shapes: list[Shape]) -> list[dict[str, Any]]:
    """Per table, busiest first: its shape, records, counted changes and their delays against its target."""
    shares = record_shares(done.figures["steady_offsets"], {s.name: s.table.topic for s in shapes})
    records = done.figures["kafka_records"]
    seconds = done.figures["steady_seconds"] or 1.0
    changes = defaultdict(list)
    for v in done.changes:
        changes[v.table].append(v)
    rows = []
    for s in shapes:
        mine = changes.get(s.name, [])
        d = delay_figures(mine)
        rows.append({**describe(s), "record_share": round(shares[s.name], 5),
                     "records_per_s": round(shares[s.name] * records / seconds, 2), "changes": len(mine),
                     "p50": d["p50"], "p95": d["p95"], "max": d["max"],
                     "within_target": d["p95"] <= s.freshness_seconds if mine else None})
    return rows


def _reference(plan: Plan) -> dict[str, Any] | None:
    """The shop's two-table freshness at the same rate: run now, or read from a run saved earlier."""
    if plan.reference_from is not None:
        figures = json.loads(plan.reference_from.read_text())
        if figures.get("rate_records_per_s") != plan.rate:
            raise click.ClickException(f"{plan.reference_from} was measured at {figures.get('rate_records_per_s')} "
                                       f"records/s, not {plan.rate:g}: no reference for this run")
        say(f"reference: the shop's freshness from {plan.reference_from} (measured {figures.get('measured_at')})")
    elif plan.reference_minutes:
        say(f"reference: the shop's two tables at {plan.rate:g} records/s")
        figures = freshness.run(plan.reference_minutes, plan.rate, plan.trigger_seconds, plan.seed,
                                plan.reference_warmup_minutes, name=f"{NAME}_reference")
    else:
        return None
    return {k: figures.get(k) for k in ("rate_records_per_s", "minutes", "warmup_minutes", "events", "delay_seconds",
                                        "batches", "measured_at", "plot")}


def _deployments(shapes: list[Shape], plan: Plan) -> dict[str, dict[str, Any]]:
    """The busiest `touched` tables' changes into deployments of `touched`, `small` and all the tables."""
    busy = shapes[:plan.touched]
    sizes = sorted({plan.touched, min(plan.small, plan.tables), plan.tables})
    found = {}
    for n in sizes:
        say(f"deployment of {n} tables: the changes of {', '.join(s.name for s in busy)} alone")
        done = _steady(f"{NAME}_{n}", shapes[:n], busy, plan, plan.deployment_minutes, plan.deployment_warmup_minutes,
                       restart=RESTART_RECORDS)
        f = done.figures
        found[str(n)] = {"tables": n, "touched": plan.touched, "batches": f["batches"],
                         "delay_seconds": f["delay_seconds"], "events": f["events"], "start": f["start"],
                         "restart": f["restart"], "peak_memory_mib": f["peak_memory_mib"],
                         "kafka_records": f["kafka_records"], "ingest_log": f["ingest_log"]}
    return found


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def goals(figures: dict[str, Any]) -> list[dict[str, str]]:
    """The benchmark's goals beside the figures: one row each, its status `met`, `not met`, `measured` (no
    threshold) or `not measured` (the part was skipped)."""
    plan, rows = figures["plan"], []
    counted = [r for r in figures["per_table"] if r["changes"]]
    late = [r for r in counted if not r["within_target"]]
    worst = max(counted, key=lambda r: r["p95"] / r["target"], default=None)
    rows.append({"goal": "every table's p95 within its target",
                 "measured": f"{len(counted) - len(late)} of {len(counted)} tables"
                             + (f"; worst {worst['table']}: p95 {worst['p95']:.2f} s, target {worst['target']:g} s"
                                if worst else "")
                             + (f" ({len(figures['per_table']) - len(counted)} tables had no counted change)"
                                if len(counted) < len(figures["per_table"]) else ""),
                 "status": ("met" if not late else "not met") if counted else "not measured"})
    hot = figures["per_table"][:plan["hot"]]
    hottest = max((r for r in hot if r["changes"]), key=lambda r: r["p95"], default=None)
    reference = figures.get("reference")
    if reference and hottest:
        shop = reference["delay_seconds"]["p95"]
        r = _ratio(hottest["p95"], shop)
        rows.append({"goal": f"hot tables' p95 <= {HOT_ALLOWANCE:g}x the shop's (same rate, same session)",
                     "measured": f"worst of the {plan['hot']} busiest: {hottest['table']} {hottest['p95']:.2f} s; "
                                 f"shop {shop:.2f} s: {r}x",
                     "status": "met" if r is not None and r <= HOT_ALLOWANCE else "not met"})
    else:
        rows.append({"goal": f"hot tables' p95 <= {HOT_ALLOWANCE:g}x the shop's", "measured": "no reference run",
                     "status": "not measured"})
    if commits := figures.get("commits"):
        phases = ", ".join(f"{k} {v:.2f}" for k, v in commits["phase_seconds_per_main_commit"].items())
        rows.append({"goal": f"table commits a second >= {COMMITS_PER_SECOND:g}",
                     "measured": f"{commits['per_second']:.2f} ({commits['main']} main and {commits['changelog']} "
                                 f"change-log commits in {commits['seconds']:g} s); per main commit, s: {phases}",
                     "status": "met" if commits["per_second"] >= COMMITS_PER_SECOND else "not met"})
    deps = figures.get("deployments") or {}
    many, few, small = deps.get(str(plan["tables"])), deps.get(str(plan["touched"])), \
        deps.get(str(min(plan["small"], plan["tables"])))
    if many and few and many is not few and many["batches"]["count"] and few["batches"]["count"]:
        a, b = many["batches"]["seconds_mean"], few["batches"]["seconds_mean"]
        r = _ratio(a, b)
        rows.append({"goal": f"a batch touching {plan['touched']} of {plan['tables']} tables <= {BATCH_ALLOWANCE:g}x "
                             f"the same on {plan['touched']} alone",
                     "measured": f"{a:.2f} s against {b:.2f} s (mean of {many['batches']['count']} and "
                                 f"{few['batches']['count']} batches): {r}x",
                     "status": "met" if r is not None and r <= BATCH_ALLOWANCE else "not met"})
    else:
        rows.append({"goal": f"a batch touching {plan['touched']} of {plan['tables']} tables <= {BATCH_ALLOWANCE:g}x "
                             "the same alone", "measured": "no deployments run, or no batch in their counted minutes",
                     "status": "not measured"})
    if many and small and many is not small:
        n, k = plan["tables"], small["tables"]
        a, b = many["restart"]["first_batch_seconds"], small["restart"]["first_batch_seconds"]
        rows.append({"goal": f"the stream's start at {n} tables against {k}",
                     "measured": f"process start to first batch done {a:.1f} s against {b:.1f} s ({_ratio(a, b)}x); "
                                 f"session up {many['restart']['session_seconds']} s against "
                                 f"{small['restart']['session_seconds']} s",
                     "status": "measured"})
        a, b = (d["peak_memory_mib"]["jvm"] if d["peak_memory_mib"] else None for d in (many, small))
        rows.append({"goal": f"peak driver memory at {n} tables against {k}",
                     "measured": f"driver JVM peak RSS {a:,.0f} MiB against {b:,.0f} MiB ({_ratio(a, b)}x)"
                     if a and b else "no /proc here", "status": "measured" if a and b else "not measured"})
    else:
        rows += [{"goal": f"the stream's {what} at {plan['tables']} tables against {plan['small']}",
                  "measured": "no deployments run", "status": "not measured"} for what in ("start", "peak memory")]
    return rows


def report(figures: dict[str, Any]) -> str:
    """The goals against the figures, then every table's freshness (markdown, for BENCHMARKS.md)."""
    plan = figures["plan"]
    per_table = [{"table": r["table"], "key": r["key"], "columns": r["columns"], "planned": f"{r['share']:.2%}",
                  "share": f"{r['record_share']:.2%}", "records/s": f"{r['records_per_s']:g}",
                  "changes": f"{r['changes']:,}", "p50 s": r["p50"] if r["changes"] else "-",
                  "p95 s": r["p95"] if r["changes"] else "-", "max s": r["max"] if r["changes"] else "-",
                  "target s": f"{r['target']:g}",
                  "within": {True: "yes", False: "NO", None: "-"}[r["within_target"]]} for r in figures["per_table"]]
    main, hot = figures["main"], figures["hot_delay_seconds"]
    lines = [table(goals(figures), ["goal", "measured", "status"]), "",
             f"{plan['tables']} tables at {plan['rate']:g} records/s for {plan['minutes']:g} counted min after "
             f"{plan['warmup_minutes']:g} min of warm-up: the busiest {plan['hot']} took "
             f"{figures['actual_top_share']:.1%} of the records (Zipf {plan['exponent']:g}: "
             f"{figures['planned_top_share']:.1%}); {main['events']:,} changes counted, all tables p50 "
             f"{main['delay_seconds']['p50']} s, p95 {main['delay_seconds']['p95']} s; the busiest {plan['hot']} "
             f"p95 {hot['p95']} s; {main['batches']['count']} batches of {main['batches']['seconds_mean']} s (mean)",
             "", table(per_table, list(per_table[0]))]
    return "\n".join(lines)
