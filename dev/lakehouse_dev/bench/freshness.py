"""Freshness: from an event entering Kafka to its visibility in bronze, at a steady rate.

The real continuous ingest (`lakehouse ingest --trigger-seconds T`, its own process and JVM)
runs against a private broker while the generator produces change events at a steady rate.

- **Delay** of an event = completion time of the bronze commit that made it visible − the
  event's source time. The source time is the Kafka record timestamp (`_kafka_ts`, set by
  the producer when the event entered Kafka): the generator's `source.ts_ms` is a simulated
  clock, not this machine's. When a change became visible is read from bronze's timelines
  and change log after the run (`lakehouse_dev.bench.visibility`); records that changed
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
timelines are read in. Run: `lakehouse dev bench freshness --help`.

The run itself (`steady`) takes any `Workload`, the tables it declares and the records it makes:
the shop's here, many declared tables' in `bench tables` (lakehouse_dev.bench.tables).
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import numpy as np

from lakehouse_dev.bench.common import (
    DELETE_FRACTION,
    bench_dir,
    broker,
    cluster_tasks,
    launch_ingest,
    peak_memory,
    produce_snapshot,
    save,
    say,
    spark_cluster,
    table,
)
from lakehouse_dev.bench.plots import freshness_chart
from lakehouse_dev.bench.visibility import (
    WRITER_TZ,
    LagProbe,
    Offsets,
    Visibility,
    stream_done,
    topics_of,
    visibility,
)
from lakehouse_dev.generator.kafka import produce
from lakehouse_dev.generator.source import ShopSource
from lakehouse_dev.generator.values import Message, WorkloadConfig
from pipelines.ingest.batch import BatchReport
from pipelines.ingest.stream import ControlFiles
from pipelines.lake import declaration
from pipelines.lake.declaration import Declaration

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


def delay_figures(changes: list[Visibility]) -> dict[str, float]:
    """p50/p95/p99, max, min and mean of the changes' delays (zeros when there are none)."""
    delays = np.array([v.delay for v in changes]) if changes else np.zeros(1)
    p50, p95, p99 = (round(float(np.percentile(delays, q)), 3) for q in (50, 95, 99))
    return {"p50": p50, "p95": p95, "p99": p99, "max": round(float(delays.max()), 3),
            "min": round(float(delays.min()), 3), "mean": round(float(delays.mean()), 3)}


def batch_reports(log: Path) -> list[BatchReport]:
    """The batches an ingest logged, the first line of each batch id: a stream that stops commits the
    changes still waiting (pipelines.ingest.cadence) in a line of its own under the last batch's id."""
    found: dict[int, BatchReport] = {}
    for r in filter(None, map(BatchReport.parse, log.read_text(errors="replace").splitlines())):
        found.setdefault(r.batch_id, r)
    return list(found.values())


def batch_summary(log: Path, after: int | None, until: int | None = None) -> dict[str, Any]:
    """Batches after `after` (and up to `until`) as the ingest job logged them (its own wall time per batch)."""
    reports = [r for r in batch_reports(log)
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
            "phases_mean": dict(sorted(phases.items(), key=lambda kv: -kv[1])),
            "phases_batches": {name: sum(name in r.phases for r in reports) for name in names}}


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


@dataclass(frozen=True)
class Workload:
    """What a steady run produces and watches. The shop's two tables (`bench freshness`) and any declared
    tables (`bench tables`) differ only in this: the run, its probes and its figures are one."""

    name: str  # the run's folder under the bench dir (lake, broker, log) and its JSON
    declaration: Declaration  # the tables the ingest reads (LAKEHOUSE_TABLES) and the probes watch
    snapshot: Callable[[str], int]  # produce the source's snapshot to a broker; records sent
    changes: Callable[[int], list[Message]]  # exactly n Kafka records of changes, generated ahead
    env: dict[str, str] = field(default_factory=dict)  # the ingest's environment beyond the lake's


@dataclass
class SteadyRun:
    """A steady run's figures, and its changes with their visibility: counted, and of the warm-up."""

    figures: dict[str, Any]
    changes: list[Visibility]
    warm: list[Visibility]


def shop_workload(name: str, seed: int, snapshot_rows: int = SNAPSHOT_ROWS) -> Workload:
    """The contract's shop (its generator, noise included), whatever LAKEHOUSE_TABLES says in this shell."""
    source = ShopSource(seed)
    path = str(Path(declaration.__file__).with_name(declaration.SHOP))

    def snapshot(bootstrap: str) -> int:
        say(f"snapshot: {snapshot_rows:,} rows")
        return produce_snapshot(source, bootstrap, snapshot_rows, seed)

    return Workload(name, declaration.load(path), snapshot, lambda n: steady_messages(source, n, seed),
                    {declaration.DECLARATION_VARIABLE: path})


def run(minutes: float, rate: float, trigger_seconds: float, seed: int, warmup_minutes: float = 0.0,
        snapshot_rows: int = SNAPSHOT_ROWS, on_cluster: bool = False, name: str | None = None) -> dict[str, Any]:
    """The shop's freshness (`steady`), saved as `name` (default `freshness`, or `freshness_cluster` when
    `on_cluster`) and plotted.

    `on_cluster`: the stream runs on a Spark standalone cluster of its own (bench/common.py,
    spark_cluster) instead of local[2]. `name`: another benchmark's reference run saves apart
    (`bench tables`), so that the session's `freshness.json` stays the freshness benchmark's.
    """
    name = name or (f"{NAME}_cluster" if on_cluster else NAME)
    done = steady(shop_workload(name, seed, snapshot_rows), minutes, rate, trigger_seconds, warmup_minutes,
                  on_cluster=on_cluster)
    figures = {**done.figures, "snapshot_rows": snapshot_rows, "seed": seed}
    figures["plot"] = str(freshness_chart(figures, [v.delay for v in done.changes], bench_dir() / f"{name}.png",
                                          [v.delay for v in done.warm]))
    save(name, figures)
    return figures


def steady(workload: Workload, minutes: float, rate: float, trigger_seconds: float, warmup_minutes: float = 0.0,
           *, cooldown_seconds: float = 0.0, on_cluster: bool = False, restart_records: int = 0) -> SteadyRun:
    """Steady production for `warmup_minutes` then `minutes` at `rate` records/s into a running ingest; the
    figures of the changes produced in the last `minutes`, and apart those of the warm-up.

    The warm-up is the JVM's: a new ingest JVM spends its first minutes compiling Spark's and
    Hudi's code (at 2,000 records/s the JIT's compile time halves and the batches shorten by a
    quarter over the first four minutes), where a production stream runs for days. Both windows
    are reported; the production never pauses between them.

    `cooldown_seconds`: production goes on this long after the counted minutes, its changes not
    counted. With per-table cadence a quiet table's last counted changes wait up to its target for
    their commit: without records after them they would be committed by a stream that has stopped
    receiving any (or by its stop), which is not the steady state measured. Production past the
    window keeps its end as steady as its middle. The batch figures are then those of the steady
    production after the warm-up, the cool-down's included, without the catch-up's.

    `restart_records`: then, with the stream stopped, this many more records, and a new ingest on
    the lake it built: how long it takes to start on that many tables (`restart`). Also measured:
    the peak memory of the ingest's processes (`peak_memory`) and its first start (`start`).
    """
    out = bench_dir() / workload.name
    root, log = out / "lake", out / "ingest.log"
    shutil.rmtree(root, ignore_errors=True)
    log.unlink(missing_ok=True)
    samples: list[tuple[float, dict[str, int]]] = []
    topics = topics_of(workload.declaration)
    with broker(workload.name, sinks=("kafka",), topics=topics.values()) as node:
        workload.snapshot(node.bootstrap)
        env = {**os.environ, **workload.env, "LAKEHOUSE_ROOT": str(root), "KAFKA_BOOTSTRAP_SERVERS": node.bootstrap,
               "LAKEHOUSE_ERASURE_KEY_FILE": str(out / "erasure.key"), "TZ": WRITER_TZ}
        with ExitStack() as stack:
            if on_cluster:
                env |= stack.enter_context(spark_cluster(out))
            probe = LagProbe(node.bootstrap, str(root), topics)
            stack.callback(probe.close)
            launched = time.time()
            ingest = launch_ingest(env, log, trigger_seconds)
            stack.callback(_stop, ingest)
            say(f"ingest started (pid {ingest.pid}, trigger {trigger_seconds}s, {len(topics)} tables); "
                "waiting for the snapshot in bronze")
            # Until the stream finished the snapshot's batch, not only committed it: the steady
            # phase's batches are then the only ones after `before_batch`.
            snapshot_end = probe.kafka_end()
            _wait(probe, ingest, log, samples, lambda _: _covers(stream_done(str(root))[1], snapshot_end),
                  _SETTLE_TIMEOUT, "ingesting the snapshot")
            start = _started(root, launched, "snapshot_seconds")
            before_batch = _logged_batch(log)
            messages = workload.changes(round(rate * ((warmup_minutes + minutes) * 60 + cooldown_seconds)))
            start_offsets = probe.kafka_end()
            failure: list[BaseException] = []

            def producer() -> None:
                try:
                    produce(messages, node.bootstrap, rate=rate)
                except BaseException as exc:  # reported by the main thread
                    failure.append(exc)

            say(f"steady phase: {len(messages):,} records at {rate:g}/s for {warmup_minutes + minutes:g} min, "
                f"the first {warmup_minutes:g} of them the JVM's warm-up"
                + (f", then {cooldown_seconds:g}s not counted" if cooldown_seconds else ""))
            thread = threading.Thread(target=producer, name="freshness-producer", daemon=True)
            steady_t0 = time.monotonic()
            # Kafka record timestamps are the producer's clock in whole milliseconds: a change counts when
            # it entered Kafka at or after this (floored, so that a record sent right after it is counted).
            measured_from = math.floor((time.time() + warmup_minutes * 60) * 1000) / 1000
            measured_until = measured_from + minutes * 60 if cooldown_seconds else math.inf
            thread.start()
            warm_batch = before_batch
            if warmup_minutes:
                _wait(probe, ingest, log, samples, lambda _: time.time() >= measured_from or not thread.is_alive(),
                      warmup_minutes * 60 + _SETTLE_TIMEOUT, "warming up")
                warm_batch = _logged_batch(log)
            _wait(probe, ingest, log, samples, lambda _: time.time() >= measured_until or not thread.is_alive(),
                  minutes * 60 + _SETTLE_TIMEOUT, "producing")
            _wait(probe, ingest, log, samples, lambda _: not thread.is_alive(), cooldown_seconds + _SETTLE_TIMEOUT,
                  "cooling down")
            # The batches of a cool-down are of the same steady production (a short counted window may end
            # before a slow batch does); those of the catch-up after it are not.
            counted_batch = _logged_batch(log) if cooldown_seconds else None
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
            memory = peak_memory(ingest.pid)
            say("stopping ingest")
            _stop(ingest)
            restart = _restart(workload, node.bootstrap, probe, env, log, root, trigger_seconds, restart_records) \
                if restart_records else None
    every = visibility(str(root), start_offsets, end, topics)
    changes = [v for v in every if measured_from <= v.kafka_ts < measured_until]
    warm = [v for v in every if v.kafka_ts < measured_from]
    figures = {
        "tables": len(topics), "rate_records_per_s": rate, "minutes": minutes, "warmup_minutes": warmup_minutes,
        "cooldown_seconds": cooldown_seconds, "trigger_seconds": trigger_seconds,
        "source_time": "Kafka record timestamp (producer time, when the event entered Kafka), not source.ts_ms: "
                       "the generator's clock is simulated",
        "visible": "completion time of the bronze main table's delta commit of the event's batch "
                   "(the change log's commit for a delete of a key main no longer held)",
        "counted": "changes bronze applied from the records that entered Kafka after the warm-up (rows of "
                   "bronze/_changelog); replays, changes superseded within their batch, tombstones and noise "
                   "change nothing",
        "kafka_records": sum(end[tp] - start_offsets.get(tp, 0) for tp in end),
        "steady_seconds": round(steady_seconds, 1), "caught_up_seconds": round(caught_up, 1),
        "warmup_seconds": round(warmup_minutes * 60, 1), "counted_from": measured_from,
        "counted_until": measured_until if cooldown_seconds else None,
        "events": len(changes), "delay_seconds": delay_figures(changes),
        "warmup_events": len(warm), "warmup_delay_seconds": delay_figures(warm),
        "batches": batch_summary(log, warm_batch, until=counted_batch),
        "warmup_batches": batch_summary(log, before_batch, until=warm_batch),
        "start": start, "peak_memory_mib": memory, "restart": restart,
        "steady_offsets": {tp: [start_offsets.get(tp, 0), end[tp]] for tp in sorted(end)},
        "lag": [{"t": round(at - steady_t0, 2), **lag} for at, lag in samples],
        "ingest_log": str(log),
    }
    if on_cluster:
        figures["cluster_tasks"] = cluster_tasks(env)
    return SteadyRun(figures, changes, warm)


def _started(root: Path, launched: float, done: str) -> dict[str, float | None]:
    """How long a stream launched at `launched` (epoch) took to start: until its session was up (its
    heartbeat's start, after the JVM and Spark) and until its first batch was done (`done`, now)."""
    now = time.time()
    beat = ControlFiles(str(root)).heartbeat()
    session = beat.started_at - launched if beat is not None and beat.started_at >= launched else None
    return {"session_seconds": round(session, 1) if session is not None else None, done: round(now - launched, 1)}


def _restart(workload: Workload, bootstrap: str, probe: LagProbe, env: dict[str, str], log: Path, root: Path,
             trigger_seconds: float, records: int) -> dict[str, Any]:
    """`records` more records, then the stream started again on the lake it built: it reads every table's
    newest commits before its first batch, so this is what idle tables cost a start."""
    produce(workload.changes(records), bootstrap)
    end = probe.kafka_end()
    launched = time.time()
    ingest = launch_ingest(env, log, trigger_seconds)
    try:
        say(f"restarted ingest (pid {ingest.pid}) on the lake of {len(probe.topics)} tables; waiting for its "
            "first batch")
        _wait(probe, ingest, log, [], lambda _: _covers(stream_done(str(root))[1], end), _SETTLE_TIMEOUT,
              "restarting")
        figures: dict[str, Any] = {"records": records, **_started(root, launched, "first_batch_seconds")}
        figures["peak_memory_mib"] = peak_memory(ingest.pid)
    finally:
        _stop(ingest)
    say(f"restart: session up after {figures['session_seconds']}s, first batch done after "
        f"{figures['first_batch_seconds']}s")
    return figures


def _logged_batch(log: Path) -> int | None:
    """The newest batch id the ingest logged: the stream's own numbering (which goes on across restarts,
    where Structured Streaming's checkpoint starts again from 0)."""
    return max((r.batch_id for r in batch_reports(log)), default=None)


def report(figures: dict[str, Any]) -> str:
    """The results table (stdout of `lakehouse dev bench freshness`)."""
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
