"""When bronze shows a change: its timelines and the stream's checkpoint, read without a JVM.

The freshness benchmarks (`bench freshness` on the shop, `bench tables` on any declared tables)
measure a running ingest from outside, so these readers add no JVM
beside the one they measure: timelines and commit metadata through hudi-rs, the change log
through `read_table`, the stream's checkpoint as plain files.

- **Visibility** of a change = completion time of the bronze commit that made it visible. A
  change is visible in a snapshot query of `bronze/<table>` once the main table's delta commit
  of its batch completes (Hudi 1.0 records that completion time in the instant's file name).
  It is computed exactly after the run, not polled: every row of the change log
  `bronze/_changelog/<table>` is one change a batch applied, with its `_kafka_ts`; the
  change-log commit that wrote it names the batch (`_lakehouse.batch_id`), and so does the
  main table's commit of the same batch. With per-table cadence (pipelines.ingest.cadence) that is
  the batch that committed the table's waiting changes, which may come a few batches after the
  one that read them: the delay includes the wait. A delete of a key the main table no longer held
  changes only the change log: its commit counts. Records that changed nothing (replays of
  older events, changes superseded by a newer one of the same key in the same batch,
  tombstones, logical messages, malformed records) have no change-log row.
- **Consumer lag** = Kafka end offsets − what the lake holds: per partition, the highest
  position (`_lakehouse.kafka_positions`) among the completed delta commits of the
  partition's table, or the stream's own checkpoint when that is further: a batch whose
  records changed nothing in a table (a trailing tombstone) makes no commit there, yet is done.

Hudi writes instant times in the writer's local zone (`hoodie.table.timeline.timezone=LOCAL`,
the default): the measured ingest runs with TZ=WRITER_TZ, and each completion time is checked
against the ingest time the batch stamped on its rows.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import click
from hudi import HudiTableBuilder
from kafka import KafkaConsumer, TopicPartition

from pipelines.lake.declaration import Declaration
from pipelines.lake.layout import BATCH_ID_META, POSITIONS_META, changelog_path, ingest_checkpoint_path, main_path
from pipelines.lake.table_stats import read_table
from pipelines.runtime.declared import read_declaration

log = logging.getLogger(__name__)

# The writer runs with TZ=UTC, so a timeline in Hudi's default zone (LOCAL) holds UTC times.
WRITER_TZ = "UTC"

Offsets = dict[str, int]  # "topic/partition" -> next offset
Topics = dict[str, str]  # the lake's name of a table -> its topic


def topics_of(declaration: Declaration | None = None) -> Topics:
    """Each declared table's topic (default: the declaration in force): what the probes watch."""
    d = declaration or read_declaration()
    return {t: d.topic(t) for t in d.names}


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
    # LOCAL is the writer's zone, which the benchmark pins to WRITER_TZ (UTC).
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
    try:
        position = json.loads((folder / "offsets" / str(last)).read_text().splitlines()[2])
    except FileNotFoundError:  # a starting query removes the checkpoint (pipelines.ingest.bronze): none yet
        return None, {}
    return last, {f"{t}/{p}": o for t, parts in position.items() for p, o in parts.items()}


class LagProbe:
    """Consumer lag per table: what is on Kafka and not yet visible in bronze.

    With per-table cadence (pipelines.ingest.cadence) a table's changes may wait in the stream
    for a few batches after its checkpoint moved past them: the lag then counts them as held.
    """

    def __init__(self, bootstrap: str, root: str, topics: Topics | None = None) -> None:
        self.root = root
        self.topics = topics or topics_of()
        self.consumer = KafkaConsumer(bootstrap_servers=bootstrap)
        self.partitions = [TopicPartition(name, p) for name in self.topics.values()
                           for p in sorted(self.consumer.partitions_for_topic(name) or ())]
        if len({tp.topic for tp in self.partitions}) != len(self.topics):
            raise click.ClickException(f"Kafka at {bootstrap} does not list the source topics' partitions")
        self.mains = {t: CommitLog(main_path(t, root), "deltacommit") for t in self.topics}

    def kafka_end(self) -> Offsets:
        return {f"{tp.topic}/{tp.partition}": o for tp, o in self.consumer.end_offsets(self.partitions).items()}

    def lake(self) -> Offsets:
        """Per partition, how far the lake holds it: its table's commits, or the stream's checkpoint."""
        _, held = stream_done(self.root)
        for t, commits in self.mains.items():
            for c in commits.refresh():
                for tp, o in c.offsets.items():
                    if tp.startswith(f"{self.topics[t]}/"):
                        held[tp] = max(held.get(tp, 0), o)
        return held

    def lag(self) -> dict[str, int]:
        end, held = self.kafka_end(), self.lake()
        per_table = {t: sum(max(0, o - held.get(tp, 0)) for tp, o in end.items() if tp.startswith(f"{name}/"))
                     for t, name in self.topics.items()}
        return {**per_table, "total": sum(per_table.values())}

    def close(self) -> None:
        self.consumer.close()


@dataclass(frozen=True, slots=True)  # slots: a soak's half hour holds millions of them
class Visibility:
    """One change bronze applied: where it was on Kafka, when it got there, when bronze showed it, and when the
    source committed it (Debezium's `source.ts_ms`: the real source's commit time, the generator's simulated clock)."""

    table: str
    partition: int
    offset: int
    batch_id: int
    kafka_ts: float
    visible_at: float
    source_ts: float | None = None

    @property
    def delay(self) -> float:
        return self.visible_at - self.kafka_ts


def visibility(root: str, start: Offsets, end: Offsets, topics: Topics | None = None) -> list[Visibility]:
    """Every change applied from the Kafka records in [start, end) of `topics`' tables (default: the declared
    ones), with the completion that made it visible.

    Raises when a change has no commit of its batch, or when a completion precedes the
    change's own ingest time: either would mean the timeline was misread (for example its zone).
    """
    found = []
    for t, name in (topics or topics_of()).items():
        batch_of = {c.requested: c.batch_id for c in CommitLog(changelog_path(t, root), "commit").refresh()}
        visible = {**CommitLog(changelog_path(t, root), "commit").batch_completions(),
                   **CommitLog(main_path(t, root), "deltacommit").batch_completions()}
        rows = read_table(changelog_path(t, root), ["_hoodie_commit_time", "_kafka_partition", "_kafka_offset",
                                                    "_kafka_ts", "_ingested_at", "_source_ts"]).to_pylist()
        for r in rows:
            tp = f"{name}/{r['_kafka_partition']}"
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
                                    r["_kafka_ts"].timestamp(), at,
                                    r["_source_ts"].timestamp() if r["_source_ts"] is not None else None))
    return found
