"""Freshness: from an event entering Kafka to its visibility in bronze, at a steady rate.

The real continuous ingest (`lakehouse ingest --trigger-seconds T`, its own process and JVM)
runs against a private broker while the generator produces change events at a steady rate.

- **Delay** of an event = completion time of the bronze commit that made it visible − the
  event's source time. The source time is the Kafka record timestamp (`_kafka_ts`, set by
  the producer when the event entered Kafka): the generator's `source.ts_ms` is a simulated
  clock, not this machine's. When a change became visible is read from bronze's timelines
  and change log after the run (`pipelines.devtools.bench.visibility`); records that changed
  nothing (replays, superseded changes, tombstones, logical messages, malformed records)
  have no delay.
- **Consumer lag** (sampled every second) = Kafka end offsets − what the lake holds
  (`visibility.LagProbe`).
- **Warm-up**: the production starts `--warmup-minutes` before the counted minutes and runs
  on without a pause; changes that entered Kafka during the warm-up (by their record
  timestamp) and its batches are reported apart. A new JVM compiles Spark's and Hudi's code
  during its first minutes, a cost a stream that runs for days pays once.

The rate is Kafka records per second, the contract's noise included (tombstones, replays,
malformed records: about a fifth of the records). The ingest runs with TZ=UTC, the zone the
timelines are read in. Run: `lakehouse bench freshness --help`.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import click
import numpy as np

from pipelines.devtools.bench.common import (
    DELETE_FRACTION,
    bench_dir,
    broker,
    cluster_tasks,
    produce_snapshot,
    save,
    say,
    spark_cluster,
    table,
)
from pipelines.devtools.bench.plots import freshness_chart
from pipelines.devtools.bench.visibility import WRITER_TZ, LagProbe, Offsets, Visibility, stream_done, visibility
from pipelines.devtools.generator.kafka import produce
from pipelines.devtools.generator.source import ShopSource
from pipelines.devtools.generator.values import Message, WorkloadConfig
from pipelines.ingest.batch import BatchReport

NAME = "freshness"
# Rows of the source's snapshot, loaded before the steady phase: a small lake by default, which the
# steady phase grows (to about 170,000 live rows in 8 minutes); `--snapshot-rows` starts from a large one.
SNAPSHOT_ROWS = 2000
# Changes per generator call: each call may re-deliver a run of older records (a connector
# restart), so calls are kept the size of a few seconds of a busy source, not one per event.
_CHUNK_CHANGES = 2000
_SAMPLE_SECONDS = 1.0
_SETTLE_TIMEOUT = 900.0  # JVM start plus the snapshot's batch, or the catch-up, on a busy machine


def steady_messages(source: ShopSource, records: int, seed: int) -> list[Message]:
    """Exactly `records` Kafka records of contract changes (generated ahead: the source's clock is simulated)."""
    cfg = WorkloadConfig(seed=seed, changes=_CHUNK_CHANGES, delete_fraction=DELETE_FRACTION)
    out: list[Message] = []
    while len(out) < records:
        out += source.changes(cfg)
    return out[:records]


def _delays(changes: list[Visibility]) -> dict[str, float]:
    """p50/p95/p99, max, min and mean of the changes' delays (zeros when there are none)."""
    delays = np.array([v.delay for v in changes]) if changes else np.zeros(1)
    p50, p95, p99 = (round(float(np.percentile(delays, q)), 3) for q in (50, 95, 99))
    return {"p50": p50, "p95": p95, "p99": p99, "max": round(float(delays.max()), 3),
            "min": round(float(delays.min()), 3), "mean": round(float(delays.mean()), 3)}


def batch_summary(log: Path, after: int | None, until: int | None = None) -> dict[str, Any]:
    """Batches after `after` (and up to `until`) as the ingest job logged them (its own wall time per batch)."""
    reports = [r for r in filter(None, map(BatchReport.parse, log.read_text(errors="replace").splitlines()))
               if (after is None or r.batch_id > after) and (until is None or r.batch_id <= until)]
    seconds = np.array([r.seconds for r in reports]) if reports else np.zeros(1)
    records = sum(r.records for r in reports)
    # Where a batch's time goes: each phase's mean over the batches (the table phases run side
    # by side, so they add up to more than `tables`, their wall time).
    names = sorted({name for r in reports for name in r.phases})
    phases = {name: round(sum(r.phases.get(name, 0.0) for r in reports) / len(reports), 2) for name in names}
    return {"count": len(reports), "records": records, "records_mean": round(records / max(1, len(reports)), 1),
            "seconds_mean": round(float(seconds.mean()), 2), "seconds_p50": round(float(np.median(seconds)), 2),
            "seconds_max": round(float(seconds.max()), 2),
            "phases_mean": dict(sorted(phases.items(), key=lambda kv: -kv[1]))}


def _wait(probe: LagProbe, ingest: subprocess.Popen, log: Path, samples: list[tuple[float, dict[str, int]]],
          done: Callable[[dict[str, int]], bool], timeout: float, what: str) -> None:
    """Sample the lag every second until `done(lag)`; fail naming the log if the ingest dies or time runs out."""
    deadline = time.monotonic() + timeout
    last_said = 0.0
    while True:
        lag = probe.lag()
        now = time.monotonic()
        samples.append((now, lag))
        if done(lag):
            return
        if ingest.poll() is not None:
            raise click.ClickException(f"ingest exited ({ingest.returncode}) while {what}; log {log}:\n"
                                       + log.read_text(errors="replace")[-3000:])
        if now > deadline:
            raise click.ClickException(f"no end to {what} after {timeout:.0f}s (lag {lag}); log {log}")
        if now - last_said >= 15:
            say(f"{what}: lag {lag['total']} records")
            last_said = now
        time.sleep(max(0.0, _SAMPLE_SECONDS - (time.monotonic() - now)))


def _covers(held: Offsets, end: Offsets) -> bool:
    return all(held.get(tp, 0) >= o for tp, o in end.items())


def _stop(ingest: subprocess.Popen) -> None:
    """SIGTERM (the CLI stops its query), then the whole process group if it does not exit."""
    if ingest.poll() is None:
        ingest.send_signal(signal.SIGTERM)
        try:
            ingest.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(ingest.pid, signal.SIGKILL)
            ingest.wait()


def run(minutes: float, rate: float, trigger_seconds: float, seed: int, warmup_minutes: float = 0.0,
        snapshot_rows: int = SNAPSHOT_ROWS, on_cluster: bool = False) -> dict[str, Any]:
    """Steady production for `warmup_minutes` then `minutes` at `rate` records/s into a running ingest; the
    figures of the changes produced in the last `minutes`, and apart those of the warm-up, saved and plotted.

    The warm-up is the JVM's: a new ingest JVM spends its first minutes compiling Spark's and
    Hudi's code (the JIT's compile time fell from 35 s per 30 s to 16 by the fourth minute of a
    run at 2,000 records/s, and the batches from about 11 s to 8), where a production stream
    runs for days. Both windows are reported; the production never pauses between them.

    `on_cluster`: the stream runs on a Spark standalone cluster of its own (bench/common.py,
    spark_cluster) instead of local[2]; figures saved as `freshness_cluster`.
    """
    name = f"{NAME}_cluster" if on_cluster else NAME
    out = bench_dir() / name
    root, log = out / "lake", out / "ingest.log"
    shutil.rmtree(root, ignore_errors=True)
    log.unlink(missing_ok=True)
    samples: list[tuple[float, dict[str, int]]] = []
    with broker(name, sinks=("kafka",)) as node:
        source = ShopSource(seed)
        say(f"snapshot: {snapshot_rows:,} rows")
        produce_snapshot(source, node.bootstrap, snapshot_rows, seed)
        env = {**os.environ, "LAKEHOUSE_ROOT": str(root), "KAFKA_BOOTSTRAP_SERVERS": node.bootstrap,
               "LAKEHOUSE_ERASURE_KEY_FILE": str(out / "erasure.key"), "TZ": WRITER_TZ}
        with ExitStack() as stack:
            if on_cluster:
                env |= stack.enter_context(spark_cluster(out))
            probe = LagProbe(node.bootstrap, str(root))
            stack.callback(probe.close)
            with log.open("ab") as sink:
                ingest = subprocess.Popen([sys.executable, "-m", "pipelines.cli", "ingest", "--trigger-seconds",
                                           str(trigger_seconds)], env=env, stdout=sink, stderr=subprocess.STDOUT,
                                          start_new_session=True)
            stack.callback(_stop, ingest)
            say(f"ingest started (pid {ingest.pid}, trigger {trigger_seconds}s); waiting for the snapshot in bronze")
            # Until the stream finished the snapshot's batch, not only committed it: the steady
            # phase's batches are then the only ones after `before_batch`.
            snapshot_end = probe.kafka_end()
            _wait(probe, ingest, log, samples, lambda _: _covers(stream_done(str(root))[1], snapshot_end),
                  _SETTLE_TIMEOUT, "ingesting the snapshot")
            before_batch, _ = stream_done(str(root))
            messages = steady_messages(source, round(rate * (warmup_minutes + minutes) * 60), seed)
            start = probe.kafka_end()
            failure: list[BaseException] = []

            def producer() -> None:
                try:
                    produce(messages, node.bootstrap, rate=rate)
                except BaseException as exc:  # reported by the main thread
                    failure.append(exc)

            say(f"steady phase: {len(messages):,} records at {rate:g}/s for {warmup_minutes + minutes:g} min, "
                f"the first {warmup_minutes:g} of them the JVM's warm-up")
            thread = threading.Thread(target=producer, name="freshness-producer", daemon=True)
            steady_t0 = time.monotonic()
            # Kafka record timestamps are the producer's clock in whole milliseconds: a change counts when
            # it entered Kafka at or after this (floored, so that a record sent right after it is counted).
            measured_from = math.floor((time.time() + warmup_minutes * 60) * 1000) / 1000
            thread.start()
            warm_batch = before_batch
            if warmup_minutes:
                _wait(probe, ingest, log, samples, lambda _: time.time() >= measured_from or not thread.is_alive(),
                      warmup_minutes * 60 + _SETTLE_TIMEOUT, "warming up")
                warm_batch, _ = stream_done(str(root))
            _wait(probe, ingest, log, samples, lambda _: not thread.is_alive(), minutes * 60 + _SETTLE_TIMEOUT,
                  "producing")
            thread.join()
            steady_seconds = time.monotonic() - steady_t0
            if failure:
                raise click.ClickException(f"producing failed: {failure[0]}")
            end = probe.kafka_end()
            _wait(probe, ingest, log, samples, lambda lag: lag["total"] == 0, _SETTLE_TIMEOUT + 10 * steady_seconds,
                  "catching up")
            caught_up = time.monotonic() - steady_t0
            say(f"caught up {caught_up - steady_seconds:.1f}s after the last record")
            # Stopped only once the stream finished that batch (table services after its commits
            # included): a clean stop, and every batch in the log's figures.
            _wait(probe, ingest, log, samples, lambda _: _covers(stream_done(str(root))[1], end), _SETTLE_TIMEOUT,
                  "finishing the last batch")
            say("stopping ingest")
    every = visibility(str(root), start, end)
    changes = [v for v in every if v.kafka_ts >= measured_from]
    warm = [v for v in every if v.kafka_ts < measured_from]
    figures = {
        "rate_records_per_s": rate, "minutes": minutes, "warmup_minutes": warmup_minutes,
        "snapshot_rows": snapshot_rows, "trigger_seconds": trigger_seconds, "seed": seed,
        "source_time": "Kafka record timestamp (producer time, when the event entered Kafka), not source.ts_ms: "
                       "the generator's clock is simulated",
        "visible": "completion time of the bronze main table's delta commit of the event's batch "
                   "(the change log's commit for a delete of a key main no longer held)",
        "counted": "changes bronze applied from the records that entered Kafka after the warm-up (rows of "
                   "bronze/_changelog); replays, changes superseded within their batch, tombstones and noise "
                   "change nothing",
        "kafka_records": sum(end[tp] - start.get(tp, 0) for tp in end),
        "steady_seconds": round(steady_seconds, 1), "caught_up_seconds": round(caught_up, 1),
        "warmup_seconds": round(warmup_minutes * 60, 1), "counted_from": measured_from,
        "events": len(changes), "delay_seconds": _delays(changes),
        "warmup_events": len(warm), "warmup_delay_seconds": _delays(warm),
        "batches": batch_summary(log, warm_batch),
        "warmup_batches": batch_summary(log, before_batch, until=warm_batch),
        "steady_offsets": {tp: [start.get(tp, 0), end[tp]] for tp in sorted(end)},
        "lag": [{"t": round(at - steady_t0, 2), **lag} for at, lag in samples],
        "ingest_log": str(log),
    }
    if on_cluster:
        figures["cluster_tasks"] = cluster_tasks(env)
    figures["plot"] = str(freshness_chart(figures, [v.delay for v in changes], bench_dir() / f"{name}.png",
                                          [v.delay for v in warm]))
    save(name, figures)
    return figures


def report(figures: dict[str, Any]) -> str:
    """The results table (stdout of `lakehouse bench freshness`)."""
    d, b = figures["delay_seconds"], figures["batches"]
    row = {"records/s": f"{figures['rate_records_per_s']:g}", "trigger s": f"{figures['trigger_seconds']:g}",
           "changes": f"{figures['events']:,}", "p50 s": d["p50"], "p95 s": d["p95"], "p99 s": d["p99"],
           "max s": d["max"],
           "max lag": max(s["total"] for s in figures["lag"] if s["t"] >= figures.get("warmup_seconds", 0.0)),
           "batches": b["count"], "batch s (mean)": b["seconds_mean"]}
    phases = b.get("phases_mean") or {}
    where = ("\nwhere a batch's time goes (mean s per batch; table phases run side by side): "
             + " ".join(f"{k}={v:g}" for k, v in phases.items())) if phases else ""
    if figures.get("warmup_seconds"):
        w, wb = figures["warmup_delay_seconds"], figures["warmup_batches"]
        where += (f"\nnot counted, the first {figures['warmup_minutes']:g} min (JVM warm-up): "
                  f"{figures['warmup_events']:,} changes, p50 {w['p50']}s, p95 {w['p95']}s, max {w['max']}s, "
                  f"{wb['count']} batches of {wb['seconds_mean']}s (mean)")
    if tasks := figures.get("cluster_tasks"):
        where += (f"\non the cluster: {tasks['tasks']} tasks ({tasks['failed_tasks']} failed), per executor "
                  f"{tasks['tasks_per_executor']}; task seconds "
                  + " ".join(f"{k}={v}" for k, v in tasks["task_seconds"].items())
                  + f"; shuffle read {tasks['shuffle_mb']} MB")
    return table([row], list(row)) + where


def compare(local: dict[str, Any], cluster: dict[str, Any]) -> str:
    """Cluster against local[2], same session: the ratios of the delays and of the mean batch."""
    pairs = {f"{p} s": (local["delay_seconds"][p], cluster["delay_seconds"][p]) for p in ("p50", "p95", "p99")}
    pairs["batch s (mean)"] = (local["batches"]["seconds_mean"], cluster["batches"]["seconds_mean"])
    rows = [{"figure": k, "local[2]": a, "cluster": b, "cluster / local": round(b / a, 2) if a else "-"}
            for k, (a, b) in pairs.items()]
    return table(rows, ["figure", "local[2]", "cluster", "cluster / local"])
