"""Freshness (issue 6, part 2): from an event entering Kafka to its visibility in bronze, at a steady rate.

The real continuous ingest (`lakehouse ingest --trigger-seconds T`, its own process and JVM)
runs against a private broker while the generator produces change events at a steady rate.

- **Delay** of an event = completion time of the bronze commit that made it visible − the
  event's source time. The source time is the Kafka record timestamp (`_kafka_ts`, set by
  the producer when the event entered Kafka): the generator's `source.ts_ms` is a simulated
  clock, not this machine's. An event is visible in a snapshot query of `bronze/<table>`
  once the main table's delta commit of its batch completes (Hudi 1.0 records that
  completion time in the instant's file name). It is computed exactly after the run, not
  polled: every row of the change log `bronze/_changelog/<table>` is one change a batch
  applied, with its `_kafka_ts`; the change-log commit that wrote it names the batch
  (`_lakehouse.batch_id`), and so does the main table's commit of the same batch. A delete
  of a key the main table no longer held changes only the change log: its commit counts.
  Records that changed nothing (replays of older events, changes superseded by a newer one
  of the same key in the same batch, tombstones, logical messages, malformed records) have
  no change-log row and no delay.
- **Consumer lag** (sampled every second) = Kafka end offsets − what the lake holds: per
  partition, the highest position (`_lakehouse.kafka_positions`) among the completed delta
  commits of the partition's table, or the stream's own checkpoint when that is further: a batch whose
  records changed nothing in a table (a trailing tombstone) makes no commit there, yet is done.

- **Warm-up**: the production starts `--warmup-minutes` before the counted minutes and runs
  on without a pause; changes that entered Kafka during the warm-up (by their record
  timestamp) and its batches are reported apart. A new JVM compiles Spark's and Hudi's code
  during its first minutes, a cost a stream that runs for days pays once.

The rate is Kafka records per second, the contract's noise included (tombstones, replays,
malformed records: about a fifth of the records). Hudi writes instant times in the writer's
local zone (`hoodie.table.timeline.timezone=LOCAL`, the default): the ingest runs with TZ=UTC,
and each completion time is checked against the ingest time the batch stamped on its rows.
Timelines and the change log are read with hudi-rs and plain files, so the measuring process
adds no JVM beside the one it measures. Run: `lakehouse bench freshness --help`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import numpy as np
from hudi import HudiTableBuilder
from kafka import KafkaConsumer, TopicPartition

from pipelines.contract import TABLES, topic
from pipelines.devtools.bench.common import DELETE_FRACTION, bench_dir, broker, produce_snapshot, save, say, table
from pipelines.devtools.generator import Message, ShopSource, WorkloadConfig, produce
from pipelines.ingest.state import BATCH_ID_META, POSITIONS_META
from pipelines.ingest.writer import BatchReport
from pipelines.settings import changelog_path, ingest_checkpoint_path, main_path
from pipelines.table_stats import read_table

log = logging.getLogger(__name__)

NAME = "freshness"
# Rows of the source's snapshot, loaded before the steady phase: a small lake by default, which the
# steady phase grows (to about 170,000 live rows in 8 minutes); `--snapshot-rows` starts from a large one.
SNAPSHOT_ROWS = 2000
# Changes per generator call: each call may re-deliver a run of older records (a connector
# restart), so calls are kept the size of a few seconds of a busy source, not one per event.
_CHUNK_CHANGES = 2000
_SAMPLE_SECONDS = 1.0
_SETTLE_TIMEOUT = 900.0  # JVM start plus the snapshot's batch, or the catch-up, on a busy machine
# The writer runs with TZ=UTC, so a timeline in Hudi's default zone (LOCAL) holds UTC times.
WRITER_TZ = "UTC"

Offsets = dict[str, int]  # "topic/partition" -> next offset


@dataclass(frozen=True)
class Commit:
    """A completed Hudi instant: when it was requested and completed, and what the batch consumed."""

    requested: str
    completed: float  # epoch seconds
    batch_id: int | None
    offsets: Offsets


def _instant_seconds(instant: str, zone: str) -> float:
    """Epoch seconds of a Hudi instant time (yyyyMMddHHmmssSSS) in the table's timeline zone."""
    if zone not in ("UTC", "LOCAL"):
        raise ValueError(f"unknown hoodie.table.timeline.timezone {zone!r}")
    # LOCAL is the writer's zone, which run() pins to WRITER_TZ (UTC).
    return datetime.strptime(instant, "%Y%m%d%H%M%S%f").replace(tzinfo=UTC).timestamp()


class CommitLog:
    """The completed commits of one action on one Hudi table, from its timeline (no JVM), each decoded once.

    Hudi 1.0 names a completed instant `<requested>_<completed>.<action>` under `.hoodie/timeline/`;
    its commit metadata is Avro, which hudi-rs decodes.
    """

    def __init__(self, path: str, action: str) -> None:
        self.path = path
        self.action = action
        self._commits: dict[str, Commit] = {}

    def _zone(self) -> str:
        props = Path(self.path, ".hoodie", "hoodie.properties").read_text()
        found = re.search(r"^hoodie\.table\.timeline\.timezone=(\w+)", props, re.MULTILINE)
        return found.group(1) if found else "LOCAL"

    def refresh(self) -> list[Commit]:
        """Every completed commit so far, oldest completion first."""
        folder = Path(self.path, ".hoodie", "timeline")
        names = [p.name for p in folder.iterdir()] if folder.is_dir() else []
        done = dict(n.removesuffix(f".{self.action}").split("_") for n in names
                    if n.endswith(f".{self.action}") and "_" in n)
        new = set(done) - set(self._commits)
        if new:
            zone = self._zone()
            try:
                timeline = HudiTableBuilder.from_base_uri(self.path).build().get_timeline()
                listed = (timeline.get_completed_deltacommits() if self.action == "deltacommit"
                          else timeline.get_completed_commits())
            except Exception as exc:
                # The writer may be writing a completed instant's file right now (not atomic on a
                # local disk): this sample goes without it, the next refresh decodes it.
                log.debug("%s: timeline not readable yet (%s)", self.path, exc)
                return sorted(self._commits.values(), key=lambda c: c.completed)
            for instant in listed:
                if instant.timestamp in new:
                    try:
                        metadata = json.loads(timeline.get_instant_metadata_in_json(instant))
                    except Exception as exc:
                        log.debug("%s: %s not readable yet (%s)", self.path, instant.timestamp, exc)
                        continue
                    extra = metadata.get("extraMetadata") or {}
                    batch = extra.get(BATCH_ID_META)
                    self._commits[instant.timestamp] = Commit(
                        instant.timestamp, _instant_seconds(done[instant.timestamp], zone),
                        int(batch) if batch is not None else None,
                        json.loads(extra.get(POSITIONS_META) or "{}"))
        return sorted(self._commits.values(), key=lambda c: c.completed)

    def batch_completions(self) -> dict[int, float]:
        """Batch id -> completion of its first commit (a re-run batch's second commit shows nothing new)."""
        found: dict[int, float] = {}
        for c in self.refresh():
            if c.batch_id is not None:
                found.setdefault(c.batch_id, c.completed)
        return found


def stream_done(root: str) -> tuple[int | None, Offsets]:
    """The newest batch the ingest stream completed, and the Kafka offsets it had read up to.

    Structured Streaming writes `offsets/<n>` when it plans batch n and `commits/<n>` when the
    batch function returned; the offsets file's third line is the Kafka source's position.
    """
    folder = Path(ingest_checkpoint_path(root))
    batches = [int(p.name) for p in (folder / "commits").glob("[0-9]*") if p.name.isdigit()]
    if not batches:
        return None, {}
    last = max(batches)
    position = json.loads((folder / "offsets" / str(last)).read_text().splitlines()[2])
    return last, {f"{t}/{p}": o for t, parts in position.items() for p, o in parts.items()}


class LagProbe:
    """Consumer lag per table: what is on Kafka and not yet visible in bronze."""

    def __init__(self, bootstrap: str, root: str) -> None:
        self.root = root
        self.consumer = KafkaConsumer(bootstrap_servers=bootstrap)
        self.partitions = [TopicPartition(topic(t), p) for t in TABLES
                           for p in sorted(self.consumer.partitions_for_topic(topic(t)) or ())]
        if len({tp.topic for tp in self.partitions}) != len(TABLES):
            raise click.ClickException(f"Kafka at {bootstrap} does not list the source topics' partitions")
        self.mains = {t: CommitLog(main_path(t, root), "deltacommit") for t in TABLES}

    def kafka_end(self) -> Offsets:
        return {f"{tp.topic}/{tp.partition}": o for tp, o in self.consumer.end_offsets(self.partitions).items()}

    def lake(self) -> Offsets:
        """Per partition, how far the lake holds it: its table's commits, or the stream's checkpoint."""
        _, held = stream_done(self.root)
        for t, commits in self.mains.items():
            for c in commits.refresh():
                for tp, o in c.offsets.items():
                    if tp.startswith(f"{topic(t)}/"):
                        held[tp] = max(held.get(tp, 0), o)
        return held

    def lag(self) -> dict[str, int]:
        end, held = self.kafka_end(), self.lake()
        per_table = {t: sum(max(0, o - held.get(tp, 0)) for tp, o in end.items() if tp.startswith(f"{topic(t)}/"))
                     for t in TABLES}
        return {**per_table, "total": sum(per_table.values())}

    def close(self) -> None:
        self.consumer.close()


@dataclass(frozen=True)
class Visibility:
    """One change bronze applied: where it was on Kafka, when it got there, when bronze showed it."""

    table: str
    partition: int
    offset: int
    batch_id: int
    kafka_ts: float
    visible_at: float

    @property
    def delay(self) -> float:
        return self.visible_at - self.kafka_ts


def visibility(root: str, start: Offsets, end: Offsets) -> list[Visibility]:
    """Every change applied from the Kafka records in [start, end), with the completion that made it visible.

    Raises when a change has no commit of its batch, or when a completion precedes the
    change's own ingest time: either would mean the timeline was misread (for example its zone).
    """
    found = []
    for t in TABLES:
        batch_of = {c.requested: c.batch_id for c in CommitLog(changelog_path(t, root), "commit").refresh()}
        visible = {**CommitLog(changelog_path(t, root), "commit").batch_completions(),
                   **CommitLog(main_path(t, root), "deltacommit").batch_completions()}
        rows = read_table(changelog_path(t, root), ["_hoodie_commit_time", "_kafka_partition", "_kafka_offset",
                                                    "_kafka_ts", "_ingested_at"]).to_pylist()
        for r in rows:
            tp = f"{topic(t)}/{r['_kafka_partition']}"
            if not start.get(tp, 0) <= r["_kafka_offset"] < end.get(tp, 0):
                continue
            batch = batch_of.get(r["_hoodie_commit_time"])
            at = visible.get(batch) if batch is not None else None
            if at is None:
                raise RuntimeError(f"{t} change at {tp}@{r['_kafka_offset']}: no completed commit of batch {batch}")
            lead = at - r["_ingested_at"].timestamp()
            if not 0 <= lead < 1200:
                raise RuntimeError(f"{t} batch {batch} completed {lead:.0f}s after its ingest time: "
                                   "timeline time zone misread?")
            found.append(Visibility(t, r["_kafka_partition"], r["_kafka_offset"], batch,
                                    r["_kafka_ts"].timestamp(), at))
    return found


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
        snapshot_rows: int = SNAPSHOT_ROWS) -> dict[str, Any]:
    """Steady production for `warmup_minutes` then `minutes` at `rate` records/s into a running ingest; the
    figures of the changes produced in the last `minutes`, and apart those of the warm-up, saved and plotted.

    The warm-up is the JVM's: a new ingest JVM spends its first minutes compiling Spark's and
    Hudi's code (the JIT's compile time fell from 35 s per 30 s to 16 by the fourth minute of a
    run at 2,000 records/s, and the batches from about 11 s to 8), where a production stream
    runs for days. Both windows are reported; the production never pauses between them.
    """
    out = bench_dir() / NAME
    root, log = out / "lake", out / "ingest.log"
    shutil.rmtree(root, ignore_errors=True)
    log.unlink(missing_ok=True)
    samples: list[tuple[float, dict[str, int]]] = []
    with broker(NAME, sinks=("kafka",)) as node:
        source = ShopSource(seed)
        say(f"snapshot: {snapshot_rows:,} rows")
        produce_snapshot(source, node.bootstrap, snapshot_rows, seed)
        env = {**os.environ, "LAKEHOUSE_ROOT": str(root), "KAFKA_BOOTSTRAP_SERVERS": node.bootstrap,
               "LAKEHOUSE_ERASURE_KEY_FILE": str(out / "erasure.key"), "TZ": WRITER_TZ}
        with ExitStack() as stack:
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
    figures["plot"] = str(plot(figures, [v.delay for v in changes], bench_dir() / f"{NAME}.png",
                               [v.delay for v in warm]))
    save(NAME, figures)
    return figures


def plot(figures: dict[str, Any], delays: list[float], path: Path, warmup_delays: list[float] | None = None) -> Path:
    """Two panels: consumer lag over time (steady phase and warm-up shaded), and the delay CDF with p50/p95/p99."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (lag_ax, cdf_ax) = plt.subplots(2, 1, figsize=(9, 8))
    # From the last sample before the steady phase (the snapshot in bronze, lag 0): the
    # snapshot's load is not what is measured, and its lag would set the scale.
    before = [i for i, s in enumerate(figures["lag"]) if s["t"] < 0]
    shown = figures["lag"][before[-1] if before else 0:]
    for key in (*TABLES, "total"):
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
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


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
    return table([row], list(row)) + where
