"""The bronze stream as a service: its heartbeat, the stop request it obeys, one writer per checkpoint.

A stream that runs for weeks needs an outside judge: is it alive, is it moving, may another
copy start? Spark's checkpoint says none of that (an idle stream writes nothing), so the job
writes a small heartbeat beside its checkpoint (`_checkpoints/ingest.heartbeat.json`) every
few seconds: who runs it (host, pid), when its last trigger completed, whether a batch is in
progress and since when. Supervisors (`lakehouse stream`, the `bronze_ingest_stream` DAG,
locally or on EMR) judge health from it with the limits of hudi_configs/stream.toml, and ask
the stream to stop by writing `_checkpoints/ingest.stop`, which the job polls between
batches: the batch in progress commits whole, then the stream ends with exit 0. That works
where a signal cannot reach the driver (an EMR step in cluster mode). The request stays
after the stream has stopped: it holds the stream stopped, so that a scheduled `ensure`
does not start it again until an operator runs `start`, `restart` or `upgrade`.

The heartbeat is also the lease that keeps one writer per checkpoint: a stream that finds a
live heartbeat of another owner waits for it to go stale (dead_after_seconds) and gives up
if it does not. A heartbeat of a process on this host that is gone (pid and its start time
no longer match) is stale at once, so a restart after a crash does not wait.

A stream whose Kafka does not answer (the broker down, the network to it cut) waits for it, up to
stream.toml's `[kafka] wait_seconds`, and says so in its heartbeat: `waiting for Kafka at host:port
since T` and why (what its probe, `local_process.kafka_unanswered`, met). Such a stream is "waiting",
not stalled: it is alive and a restart would only wait again, so supervisors leave it running.

Pure Python (no Spark): Airflow's environment imports it. Files are local paths or S3
objects, through pipelines.lake.storage like every other file beside the tables.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any, Literal

import hudi_configs
from pipelines.errors import AnotherStreamRunning
from pipelines.lake import storage
from pipelines.runtime.config import KafkaSettings
from pipelines.runtime.kafka_clients import python_options
from pipelines.runtime.local_process import process_started

log = logging.getLogger(__name__)

HEARTBEAT = "_checkpoints/ingest.heartbeat.json"
STOP_REQUEST = "_checkpoints/ingest.stop"


@dataclass(frozen=True)
class Limits:
    heartbeat_seconds: float
    dead_after_seconds: float
    stalled_after_seconds: float
    start_timeout_seconds: float
    stop_timeout_seconds: float
    kill_timeout_seconds: float


@dataclass(frozen=True)
class KafkaWait:
    """stream.toml's [kafka]: how the stream probes its Kafka, and how long it waits for one that does not answer."""

    probe_seconds: float
    wait_seconds: float
    restarts: int


def kafka_wait() -> KafkaWait:
    values = hudi_configs.section("stream", "kafka")
    return KafkaWait(float(values["probe_seconds"]), float(values["wait_seconds"]), int(values["restarts"]))


def limits() -> Limits:
    """hudi_configs/stream.toml, with the deployment's overrides (LAKEHOUSE_HUDI_OVERRIDES)."""
    values = hudi_configs.section("stream", "health") | hudi_configs.section("stream", "supervisor")
    return Limits(**{k: float(v) for k, v in values.items()})


class ControlFiles:
    """The stream's two small files under the lake root, on a local disk or an object store (pipelines.lake.storage)."""

    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/")

    def read(self, name: str) -> bytes | None:
        try:
            return storage.read_bytes(f"{self.root}/{name}")
        except FileNotFoundError:
            return None

    def write(self, name: str, data: bytes) -> None:
        storage.write_bytes(f"{self.root}/{name}", data)

    def delete(self, name: str) -> None:
        storage.delete(f"{self.root}/{name}")

    def heartbeat(self) -> Heartbeat | None:
        data = self.read(HEARTBEAT)
        return Heartbeat(**json.loads(data)) if data else None

    def stop_request(self) -> dict | None:
        """The standing stop request, {"by", "at"}: it also holds the stream stopped (`ensure` leaves it)."""
        data = self.read(STOP_REQUEST)
        return json.loads(data) if data else None

    def request_stop(self, by: str) -> None:
        self.write(STOP_REQUEST, json.dumps({"by": by, "at": time.time()}).encode())

    def clear_stop(self) -> None:
        self.delete(STOP_REQUEST)


@dataclass
class Heartbeat:
    owner: str
    host: str
    pid: int
    pid_started: float | None
    started_at: float
    written_at: float
    state: Literal["running", "stopped"]
    batch: int | None = None  # the newest trigger Spark reported
    last_progress_at: float | None = None  # when that trigger completed (epoch seconds)
    trigger_since: float | None = None  # a batch in progress since (epoch seconds), None between batches
    # Per declared table: its freshness target, how many changes wait for its commit and the age of the
    # oldest of them at `written_at` (pipelines.ingest.cadence.Cadence.freshness).
    tables: dict[str, dict] | None = None
    # Where the newest batch ended on Kafka, {topic: {partition: next offset}} (Spark's progress): with the
    # tables' waiting changes, what `caught_up` compares with the topics' ends.
    read_to: dict[str, dict[str, int]] | None = None
    # What the stream waits for ("Kafka at 127.0.0.1:9092"), since when (epoch seconds) and why; None while
    # nothing outside holds it up.
    waiting_for: str | None = None
    waiting_since: float | None = None
    waiting_why: str | None = None

    def behind(self) -> dict[str, tuple[float, float]]:
        """Tables whose oldest waiting change is older than their target: (age, target) in seconds."""
        return {t: (f["age"], f["target"]) for t, f in (self.tables or {}).items()
                if f.get("age") is not None and f["age"] > f["target"]}


class StreamState(StrEnum):
    """What the stream's heartbeat says of it (`judge`); `lakehouse stream status` prints it as it is."""

    ABSENT = "absent"  # no heartbeat: never ran on this lake
    STOPPED = "stopped"
    HEALTHY = "healthy"
    WAITING = "waiting"  # alive, held up by what it reads from (Kafka)
    STALLED = "stalled"  # alive, no trigger completed in time
    DEAD = "dead"  # its process gone, or its heartbeat too old


@dataclass(frozen=True)
class Health:
    state: StreamState
    why: str

    @property
    def live(self) -> bool:
        """A process that may still write: another copy must not start beside it."""
        return self.state in (StreamState.HEALTHY, StreamState.WAITING, StreamState.STALLED)

    @property
    def running(self) -> bool:
        """Nothing a supervisor can mend: healthy, or waiting for what a restart would wait for too."""
        return self.state in (StreamState.HEALTHY, StreamState.WAITING)


def judge(hb: Heartbeat | None, lim: Limits, now: float | None = None) -> Health:
    """Health of the stream from its heartbeat (see the module docstring for the rules)."""
    now = time.time() if now is None else now
    if hb is None:
        return Health(StreamState.ABSENT, "no heartbeat: the stream never ran on this lake")
    who = f"pid {hb.pid} on {hb.host}"
    if hb.state == "stopped":
        return Health(StreamState.STOPPED, f"{who} stopped {now - hb.written_at:.0f} s ago")
    if hb.host == socket.gethostname() and process_started(hb.pid) != hb.pid_started:
        return Health(StreamState.DEAD, f"{who} is gone (last heartbeat {now - hb.written_at:.0f} s ago)")
    if now - hb.written_at > lim.dead_after_seconds:
        return Health(StreamState.DEAD, f"{who}: no heartbeat for {now - hb.written_at:.0f} s "
                                        f"(limit {lim.dead_after_seconds:.0f} s)")
    if hb.waiting_for is not None:
        since = hb.waiting_since or hb.written_at
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(since))
        batch = "no batch yet" if hb.batch is None else f"last batch {hb.batch}"
        return Health(StreamState.WAITING, f"{who}: waiting for {hb.waiting_for} since {at} UTC ({now - since:.0f} s): "
                                           f"{hb.waiting_why}; {batch}")
    if hb.trigger_since is not None and now - hb.trigger_since > lim.stalled_after_seconds:
        return Health(StreamState.STALLED, f"{who}: batch {hb.batch} running for {now - hb.trigger_since:.0f} s "
                                           f"(limit {lim.stalled_after_seconds:.0f} s)")
    last = hb.last_progress_at or hb.started_at
    if hb.trigger_since is None and now - last > lim.stalled_after_seconds:
        return Health(StreamState.STALLED, f"{who}: no trigger completed for {now - last:.0f} s "
                                           f"(limit {lim.stalled_after_seconds:.0f} s)")
    batch = "no batch yet" if hb.batch is None else f"batch {hb.batch}"
    busy = f", a batch running for {now - hb.trigger_since:.0f} s" if hb.trigger_since is not None else ""
    behind = hb.behind()
    late = ("; behind their freshness target: " + ", ".join(
        f"{t} ({age:.0f} s, target {target:.0f} s)" for t, (age, target) in sorted(behind.items()))) if behind else ""
    return Health(StreamState.HEALTHY, f"{who}: {batch}, last trigger {now - last:.0f} s ago{busy}{late}")


class StreamLease:
    """The running job's side: claim the checkpoint, beat, obey a stop request, release."""

    def __init__(self, root: str, lim: Limits | None = None) -> None:
        self.files = ControlFiles(root)
        self.lim = lim or limits()
        pid = os.getpid()
        now = time.time()
        self.hb = Heartbeat(owner=uuid.uuid4().hex, host=socket.gethostname(), pid=pid,
                            pid_started=process_started(pid), started_at=now, written_at=now, state="running")

    def claim(self) -> None:
        """Become the checkpoint's one writer, waiting for a previous owner's heartbeat to go stale."""
        deadline = time.monotonic() + self.lim.dead_after_seconds + self.lim.heartbeat_seconds
        while True:
            other = self.files.heartbeat()
            health = judge(other, self.lim)
            if other is None or not health.live:
                break
            # On this host the owner's process is known to be there: no point waiting.
            if other.host == self.hb.host or time.monotonic() > deadline:
                raise AnotherStreamRunning(f"another ingest stream writes this lake's checkpoint: {health.why}; "
                                           "stop it first (`lakehouse stream stop`)")
            log.warning("waiting for the previous stream's heartbeat to go stale: %s", health.why)
            time.sleep(self.lim.heartbeat_seconds)
        self._write()
        # Two claims racing: the one whose heartbeat was overwritten gives way.
        time.sleep(0.2)
        now = self.files.heartbeat()
        if now is None or now.owner != self.hb.owner:
            raise AnotherStreamRunning("another ingest stream claimed this lake's checkpoint at the same time")

    def beat(self, progress: dict | None, trigger_active: bool, tables: dict[str, dict] | None = None) -> None:
        now = time.time()
        if tables is not None:
            self.hb.tables = tables
        if progress:
            if progress.get("batchId") != self.hb.batch:
                # A batch completed since the last beat: the trigger running now is the next one. Under steady
                # load the batches run back to back and Spark's trigger never reads inactive between them, so
                # the trigger's start is the newest batch's, not the run's: counted from the run's, a stream of
                # healthy batches would be judged stalled once it had run longer than the stall limit.
                self.hb.trigger_since = None
            self.hb.read_to = kafka_offsets(progress, "endOffset") or self.hb.read_to
            self.hb.batch = progress.get("batchId")
            self.hb.last_progress_at = _epoch(progress.get("timestamp")) or self.hb.last_progress_at
        if not trigger_active:
            self.hb.trigger_since = None
        elif self.hb.trigger_since is None:
            self.hb.trigger_since = now
        self._write(now)

    def waiting(self, what: str, why: str | None) -> None:
        """Record (with the next beat) that the stream waits for `what` because of `why`; `why` None: it does not.

        The wait's start stays that of its first report, so the heartbeat says for how long.
        """
        if why is None:
            self.hb.waiting_for = self.hb.waiting_since = self.hb.waiting_why = None
            return
        if self.hb.waiting_for != what:
            self.hb.waiting_for, self.hb.waiting_since = what, time.time()
        self.hb.waiting_why = why

    def stop_requested(self) -> bool:
        """A stop request made since this stream started (an older one was for a stream before it)."""
        request = self.files.stop_request()
        return request is not None and request["at"] >= self.hb.started_at

    def release(self) -> None:
        current = self.files.heartbeat()
        if current is None or current.owner == self.hb.owner:
            # A stopped stream has committed what its tables let wait (or left it to the next stream to read).
            self.hb.state, self.hb.trigger_since, self.hb.tables = "stopped", None, None
            self.waiting("", None)
            self._write()

    def _write(self, now: float | None = None) -> None:
        self.hb.written_at = time.time() if now is None else now
        self.files.write(HEARTBEAT, json.dumps(asdict(self.hb)).encode())


def kafka_offsets(progress: dict[str, Any] | None, which: str) -> dict[str, dict[str, int]] | None:
    """The Kafka source's `which` offsets (latestOffset, endOffset) in a Spark progress, {topic: {partition:
    offset}}; None before the first batch is planned. Spark gives them as JSON text or parsed."""
    sources = (progress or {}).get("sources") or []
    value = sources[0].get(which) if sources else None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if not isinstance(value, dict):
        return None
    return {t: {str(p): int(o) for p, o in parts.items()} for t, parts in value.items() if isinstance(parts, dict)}


def kafka_ends(brokers: KafkaSettings, topics: list[str]) -> dict[str, dict[str, int]]:
    """Where each partition of `topics` ends on Kafka now, {topic: {partition: next offset}}."""
    from kafka import KafkaConsumer, TopicPartition  # here: Airflow's environment imports this module

    consumer = KafkaConsumer(**python_options(brokers))
    try:
        parts = [TopicPartition(t, p) for t in topics for p in sorted(consumer.partitions_for_topic(t) or ())]
        ends: dict[str, dict[str, int]] = {t: {} for t in topics}
        for tp, offset in consumer.end_offsets(parts).items():
            ends[tp.topic][str(tp.partition)] = offset
        return ends
    finally:
        consumer.close()


def not_caught_up(hb: Heartbeat | None, ends: dict[str, dict[str, int]]) -> str | None:
    """Why the stream has not yet committed everything up to `ends` (`kafka_ends`), None once it has.

    Read up to the ends, no batch running, and no change left waiting for its table's commit (the
    cadence's): then every record before the ends is in bronze or a dead letter.
    """
    if hb is None or hb.state != "running":
        return "no stream is running" + (f" (it {hb.state})" if hb else "")
    if hb.waiting_for:
        return f"it waits for {hb.waiting_for}: {hb.waiting_why}"
    if hb.trigger_since is not None:
        return f"batch {hb.batch} is running"
    unread = sum(max(0, end - (hb.read_to or {}).get(t, {}).get(p, 0))
                 for t, parts in ends.items() for p, end in parts.items())
    if unread:
        return f"{unread} records on Kafka not read yet (as of its heartbeat {time.time() - hb.written_at:.0f} s ago)"
    if waiting := {t: f["waiting"] for t, f in (hb.tables or {}).items() if f.get("waiting")}:
        return "changes waiting for their table's commit: " + ", ".join(f"{t} {n}" for t, n in sorted(waiting.items()))
    return None


def _epoch(timestamp: str | None) -> float | None:
    """Spark's progress timestamp ("2026-11-25T10:00:00.123Z") as epoch seconds."""
    if not timestamp:
        return None
    from datetime import datetime

    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()
