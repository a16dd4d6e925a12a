"""PNG charts of the benchmarks' figures (matplotlib, no display needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure


def bar_chart(path: Path, title: str, values: dict[str, float], unit: str) -> Path:
    """One labelled bar per contender, so the chart reads without the JSON beside it."""
    fig, ax = plt.subplots(figsize=(7, 4))
    bars = ax.bar(list(values), list(values.values()), color="#4C72B0")
    ax.bar_label(bars, labels=[f"{v:,.0f}" if v >= 100 else f"{v:.2f}" for v in values.values()])
    ax.set_ylabel(unit)
    ax.set_title(title)
    return _save(fig, path)


def grouped_bars(path: Path, title: str, groups: Sequence[str], series: dict[str, Sequence[float]],
                 unit: str) -> Path:
    """One group of bars per x label, one bar per series (e.g. incremental vs full rebuild)."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / max(1, len(series))
    for i, (name, values) in enumerate(series.items()):
        xs = [g + i * width for g in range(len(groups))]
        bars = ax.bar(xs, values, width, label=name)
        ax.bar_label(bars, labels=[f"{v:,.1f}" for v in values], fontsize=8)
    ax.set_xticks([g + width * (len(series) - 1) / 2 for g in range(len(groups))], list(groups))
    ax.set_ylabel(unit)
    ax.set_title(title)
    ax.legend()
    return _save(fig, path)


def freshness_chart(figures: dict[str, Any], delays: list[float], path: Path,
                    warmup_delays: list[float] | None = None) -> Path:
    """Two panels: consumer lag over time (steady phase and warm-up shaded), and the delay CDF with p50/p95/p99."""
    fig, (lag_ax, cdf_ax) = plt.subplots(2, 1, figsize=(9, 8))
    # From the last sample before the steady phase (the snapshot in bronze, lag 0): the
    # snapshot's load is not what is measured, and its lag would set the scale.
    before = [i for i, s in enumerate(figures["lag"]) if s["t"] < 0]
    shown = figures["lag"][before[-1] if before else 0:]
    tables = [k for k in (shown[0] if shown else {}) if k not in ("t", "total")]
    for key in (*tables, "total"):
        lag_ax.step([s["t"] for s in shown], [s[key] for s in shown], where="post", label=key,
                    lw=2 if key == "total" else 1)
    warmup = figures.get("warmup_seconds", 0.0)
    if warmup:
        lag_ax.axvspan(0, warmup, color="0.82", label="steady production, JVM warm-up (not counted)")
    lag_ax.axvspan(warmup, figures["steady_seconds"], color="0.92", label="steady production")
    lag_ax.set(xlabel="seconds since steady production started", ylabel="consumer lag (Kafka records)",
               title=f"Consumer lag: {figures['rate_records_per_s']:g} records/s, "
                     f"trigger {figures['trigger_seconds']:g}s")
    lag_ax.legend(loc="upper right")

    def cdf(values: list[float], **style: Any) -> None:
        xs = np.sort(np.array(values))
        cdf_ax.plot(xs, np.arange(1, len(xs) + 1) / max(1, len(xs)), **style)

    cdf(delays, lw=1.5, label="counted")
    if warmup_delays:
        cdf(warmup_delays, lw=1, color="0.6", label="warm-up")
    for q, style in (("p50", ":"), ("p95", "--"), ("p99", "-.")):
        value = figures["delay_seconds"][q]
        cdf_ax.axvline(value, color="C3", ls=style, label=f"{q} {value:.1f}s")
    cdf_ax.set(xlabel="seconds from entering Kafka to visible in a bronze snapshot query",
               ylabel="share of changes", title=f"Visibility delay of {figures['events']:,} changes")
    cdf_ax.legend(loc="lower right")
    return _save(fig, path, dpi=110)


def table_freshness_chart(rows: Sequence[dict[str, Any]], path: Path, title: str,
                          reference: tuple[str, float, int] | None = None) -> Path:
    """Per table (in the order given: busiest first), p50 and p95 bars, the max as a mark, and the table's
    freshness target as a line over its bars: a table past its target stands out among fifty.

    `rows`: {"table", "p50", "p95", "max", "target", "records_per_s"}; `reference`: a (label, seconds, n)
    line over the first n tables (the busiest, held to the shop's p95 times their allowance)."""
    fig, ax = plt.subplots(figsize=(max(8.0, 0.32 * len(rows) + 2), 5.5))
    xs = np.arange(len(rows))
    ax.bar(xs - 0.2, [r["p50"] for r in rows], 0.4, label="p50", color="#4C72B0")
    ax.bar(xs + 0.2, [r["p95"] for r in rows], 0.4, label="p95", color="#DD8452")
    ax.scatter(xs, [r["max"] for r in rows], marker="_", s=120, color="0.2", label="max", zorder=3)
    ax.step(np.append(xs, xs[-1] + 1) - 0.5 if len(rows) else xs,
            [*(r["target"] for r in rows), rows[-1]["target"]] if rows else [], where="post", color="C3",
            label="target (freshness_seconds)")
    if reference:
        label, seconds, n = reference
        ax.hlines(seconds, -0.5, min(n, len(rows)) - 0.5, color="C2", ls="--", label=label)
    rates = [f"{v:,.0f}" if v >= 10 else f"{v:.2g}" for v in (r["records_per_s"] for r in rows)]
    ax.set_xticks(xs, [f"{r['table']}\n{rate}/s" for r, rate in zip(rows, rates, strict=True)], rotation=90,
                  fontsize=7)
    ax.set(ylabel="seconds from entering Kafka to visible in bronze", xlim=(-0.7, len(rows) - 0.3))
    ax.set_title(title, pad=26)
    ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=5, frameon=False, fontsize=8)  # clear of the bars
    return _save(fig, path, dpi=110)


_FAULT_COLORS = {"broker_kill": "C3", "kafka_blackout": "C1", "postgres_restart": "C4", "kafka_latency": "C2",
                 "kafka_bandwidth": "C5", "kafka_reset_peer": "C6"}


def soak_chart(figures: dict[str, Any], path: Path) -> Path:
    """The soak over time (minutes since the load started): freshness per 10 s of commit time, and the stream
    driver JVM's memory, each fault shaded in its kind's colour and its recovery lighter, so a fault's cost and a
    memory that grows read off one picture."""
    t0 = figures["t0"]
    fig, (fresh_ax, mem_ax) = plt.subplots(2, 1, figsize=(11, 8), sharex=True)
    series = figures.get("delay_series") or []
    minutes = [s["t"] / 60 for s in series]
    fresh_ax.plot(minutes, [s["p50"] for s in series], lw=1, label="p50")
    fresh_ax.plot(minutes, [s["p95"] for s in series], lw=1.5, label="p95")
    fresh_ax.set(ylabel="seconds, commit in PostgreSQL to visible in bronze",
                 title=f"Soak: {figures['plan']['rate']:g} records/s, {len(figures['fault_runs'])} faults")
    memory = [m for m in figures.get("memory", []) if m["rss_mib"] is not None]
    at = [(m["t"] - t0) / 60 for m in memory]
    mem_ax.plot(at, [m["rss_mib"] for m in memory], lw=1.5, label="driver JVM resident (RSS)")
    mem_ax.plot(at, [m["heap_used_mib"] for m in memory], lw=1, label="heap in use")
    mem_ax.plot(at, [m["old_used_mib"] for m in memory], lw=1, label="old generation in use")
    live = figures.get("live", [])
    mem_ax.plot([(m["t"] - t0) / 60 for m in live], [m["live_mib"] for m in live], "ko", ms=4,
                label="live set (after a full collection)")
    mem_ax.set(xlabel="minutes since the steady load started", ylabel="MiB")
    seen: set[str] = set()
    for f in figures["fault_runs"]:
        color = _FAULT_COLORS.get(f["kind"], "0.5")
        start, end = (f["start"] - t0) / 60, (f["end"] - t0) / 60
        recovered = end + (f["recovery_seconds"] or 0.0) / 60
        for ax in (fresh_ax, mem_ax):
            ax.axvspan(start, end, color=color, alpha=0.3,
                       label=None if f["kind"] in seen or ax is mem_ax else f["kind"])
            ax.axvspan(end, recovered, color=color, alpha=0.1)
        seen.add(f["kind"])
    fresh_ax.axvspan(0, figures["plan"]["warmup_minutes"], color="0.9", label="warm-up (no fault)")
    fresh_ax.legend(loc="upper right", fontsize=8)
    mem_ax.legend(loc="lower right", fontsize=8)
    return _save(fig, path, dpi=110)


def _save(fig: Figure, path: Path, dpi: int = 120) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return path
