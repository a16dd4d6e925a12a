"""Records Kafka deleted before the stream read them: the stream stops, naming them, rather than skip them.

A table's position in a partition (the next offset to read, from its commits) below the partition's log start
offset means that records it never read are gone: retention deleted their segments while the stream was stopped
or behind, or a delete-records request moved the log start. Spark's Kafka source would fail such a query only
inside its first batch, naming one offset and no way back ("Cannot fetch offset ..."), after the stream had
already started it again as a Kafka failure (`bronze._restart_after`). So `check` compares every stored position
with its partition's log start and end offsets before a query starts, and raises `RecordsLost` naming each lost
range, its table and the way back; nothing is read or written, no position moves. A position above the end
offset is the other way offsets vanish (the topic was recreated or truncated: what the lake applied is not in
it any more): the stream stops too, rather than read the new topic from a position it never had.

Only the log start offset says that records are gone: log compaction (the erasure sets it on the source topics,
`pipelines.gdpr.tombstones.kafka_tombstones`) removes records from inside the log and leaves the offsets of the
others and the log start where they were, and Spark's source reads over such gaps while the offset it asks for
is at or past the log start. A partition without a stored position (never read) starts at its earliest offset,
as it should.

An operator who has read the refusal may start the stream past the loss (`lakehouse ingest --accept-lost`): each
lost range is written to `<lake>/_source/lost.jsonl` (`accept`), and from then on a start that finds a partition
still at the position a range was lost from starts it at the range's end, the log start, with or without the
flag, until the table's next commit records a position of its own. What the ranges held comes back by
`lakehouse reconcile --heal`, through the source.

While a query runs, retention can still overtake it; Spark then fails the query with its failOnDataLoss
message ("Some data may have been lost ..."), which `translated` turns into the same error, the range taken
from Spark's message where it names one, else the query's partitions named.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime

from pipelines.errors import RecordsLost
from pipelines.lake import storage
from pipelines.lake.declaration import Declaration
from pipelines.lake.layout import lost_path
from pipelines.runtime.config import KafkaSettings
from pipelines.runtime.kafka_clients import python_options

log = logging.getLogger(__name__)

HEAL = "lakehouse reconcile --table {table} --heal"
SECTION = 'docs/reconcile.md, "Records deleted before the stream read them"'
# What Spark's Kafka source adds to every data loss it fails a query for (failOnDataLoss true); not the option's
# name alone, which a message that prints the source's options names too.
SPARK_DATA_LOSS = "Some data may have been lost because they are not available in Kafka any more"
_TP = r"\(GroupId: [^,]*, TopicPartition: (?P<topic>\S+)-(?P<partition>\d+)\)"
# Spark's messages that name where records went missing (its KafkaDataConsumer and offset readers).
_FROM = re.compile(r"Cannot fetch offset (?P<first>\d+) " + _TP)
_RANGE = re.compile(r"Cannot fetch records in \[(?P<first>\d+), (?P<end>\d+)\) " + _TP)
_CHANGED = re.compile(r"Partition (?P<topic>\S+)-(?P<partition>\d+)'s offset was changed from (?P<first>\d+) "
                      r"to (?P<end>\d+)")
# A line of Spark's message that says what went missing, to quote when it names no range.
_SAID = re.compile(r"Cannot fetch|missed|is gone|reset to")
_ADDED = re.compile(r"Added partition (?P<topic>\S+)-(?P<partition>\d+) starts from (?P<end>\d+) instead of 0")


@dataclass(frozen=True)
class Gap:
    """A partition whose records from `first` on (the table's next offset) Kafka does not hold: lost up to `end`
    (exclusive: the log start offset; None: not known), or, `recreated`, a partition that now ends at `end`, below
    what the lake has read."""

    topic: str
    partition: int
    first: int
    end: int | None
    recreated: bool = False

    def line(self, table: str) -> str:
        where = f"{self.topic}[{self.partition}]"
        if self.recreated:
            return (f"{where} ends at offset {self.end}, below offset {self.first} that table {table} has read up "
                    "to: the topic was recreated or truncated, and offsets the lake has applied no longer exist")
        if self.end is None:
            return (f"{where} offsets from {self.first} on were deleted by the topic's retention before the stream "
                    f"read them (table {table})")
        return (f"{where} offsets {self.first}..{self.end - 1} ({self.end - self.first} records) were deleted by "
                f"the topic's retention before the stream read them (table {table})")


def bounds(brokers: KafkaSettings, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, int]]:
    """Each partition's log start and end offsets, as the brokers have them now."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(**python_options(brokers), request_timeout_ms=30000)
    try:
        tps = [TopicPartition(t, p) for t, p in partitions]
        beginning, end = consumer.beginning_offsets(tps), consumer.end_offsets(tps)
        return {(tp.topic, tp.partition): (beginning[tp], end[tp]) for tp in tps}
    finally:
        consumer.close()


def gaps(start: dict[str, int], found: dict[tuple[str, int], tuple[int, int]]) -> list[Gap]:
    """The partitions of `found` (log start and end offsets) whose position in `start` ({"topic/partition": next
    offset}; none or negative: never read) Kafka no longer holds."""
    lost = []
    for (topic, partition), (beginning, end) in sorted(found.items()):
        position = start.get(f"{topic}/{partition}", -1)
        if 0 <= position < beginning:
            lost.append(Gap(topic, partition, position, beginning))
        elif position > end:
            lost.append(Gap(topic, partition, position, end, recreated=True))
    return lost


def check(brokers: KafkaSettings, decl: Declaration, start: dict[str, int], partitions: dict[str, list[int]],
          root: str, accept: bool = False) -> dict[str, int]:
    """The positions a query reading `partitions` starts from: `start` ({"topic/partition": next offset}), each
    past the ranges of the lake's `root` accepted as lost. `RecordsLost` if Kafka no longer holds a record from
    such a position on, unless `accept`: then the ranges are accepted (logged, kept) and the positions moved to
    their log start. No request to Kafka when no partition has a position."""
    start = past_accepted(start, accepted(root))
    read = [(t, p) for t, ps in partitions.items() for p in ps if start.get(f"{t}/{p}", -1) >= 0]
    found = bounds(brokers, read) if read else {}
    if not (lost := gaps(start, found)):
        return start
    if not accept:
        raise records_lost(decl, lost)
    tables = {decl.topic(t): t for t in decl.names}
    entries = [{"topic": g.topic, "partition": g.partition, "from": g.first, "to": found[(g.topic, g.partition)][0],
                "table": tables.get(g.topic), "recreated": g.recreated,
                "accepted_at": datetime.now(UTC).isoformat(timespec="seconds")} for g in lost]
    for gap, entry in zip(lost, entries, strict=True):
        log.warning("accepted as lost (--accept-lost): %s; the stream starts the partition at its log start, "
                    "offset %s", gap.line(tables.get(gap.topic, gap.topic)), entry["to"])
    storage.append_text(lost_path(root), "".join(json.dumps(e) + "\n" for e in entries))
    return past_accepted(start, accepted(root))


def accepted(root: str) -> dict[tuple[str, int], dict[int, int]]:
    """The ranges accepted as lost in the lake at `root`: (topic, partition) -> {position lost from: log start}."""
    path = lost_path(root)
    ranges: dict[tuple[str, int], dict[int, int]] = {}
    for line in (storage.read_text(path).splitlines() if storage.exists(path) else []):
        entry = json.loads(line)
        ranges.setdefault((entry["topic"], int(entry["partition"])), {})[int(entry["from"])] = int(entry["to"])
    return ranges


def past_accepted(start: dict[str, int], ranges: dict[tuple[str, int], dict[int, int]]) -> dict[str, int]:
    """`start` with each position that a range was accepted as lost from moved to that range's end (again, while
    a later range was accepted from there)."""
    moved = dict(start)
    for (topic, partition), by_start in ranges.items():
        key = f"{topic}/{partition}"
        seen = set()
        while key in moved and moved[key] in by_start and moved[key] not in seen:
            seen.add(moved[key])
            moved[key] = by_start[moved[key]]
    return moved


def records_lost(decl: Declaration, lost: list[Gap], why: str = "", topics: tuple[str, ...] = ()) -> RecordsLost:
    """The error naming every gap of `lost`, its table, and the way back for those tables and the tables of
    `topics` (the command that ran the stream prints it whole, and logs it with its trace)."""
    tables = {decl.topic(t): t for t in decl.names}
    names = sorted({tables.get(t, t) for t in [*(g.topic for g in lost), *topics]})
    lines = [f"  {g.line(tables.get(g.topic, g.topic))}" for g in lost]
    message = "\n".join([
        "the stream stops: Kafka no longer holds records that bronze has not applied; nothing of them was written "
        "and no position moved" + (f" ({why})" if why else ""), *lines,
        "The way back: lakehouse ingest --once --accept-lost (the ranges kept as lost, the stream started past "
        "them; later starts start there too), then " + "; ".join(HEAL.format(table=t) for t in names)
        + f" with the stream running ({SECTION})."])
    return RecordsLost(message, tables=tuple(names))


def _named(text: str) -> list[Gap]:
    """The gaps Spark's failure message `text` names (none when it names none)."""
    found = [Gap(m["topic"], int(m["partition"]), int(m["first"]), int(m["end"])) for m in _RANGE.finditer(text)]
    found += [Gap(m["topic"], int(m["partition"]), int(m["first"]), None) for m in _FROM.finditer(text)]
    found += [Gap(m["topic"], int(m["partition"]), int(m["first"]), int(m["end"]), recreated=True)
              for m in _CHANGED.finditer(text)]
    found += [Gap(m["topic"], int(m["partition"]), 0, int(m["end"])) for m in _ADDED.finditer(text)]
    return list(dict.fromkeys(found))  # a message repeats its cause's text


def translated(exc: BaseException, brokers: KafkaSettings, decl: Declaration,
               partitions: dict[str, list[int]]) -> RecordsLost | None:
    """`RecordsLost` for a query's failure `exc` that is Spark's failOnDataLoss (None for any other): the ranges its
    message names (an open range closed at the partition's log start, asked now), else every partition the query
    read (`partitions`), the range unknown."""
    texts: list[str] = []
    error: BaseException | None = exc
    while error is not None and len(texts) < 10:
        texts.append(str(error))
        error = error.__cause__ or error.__context__
    text = "\n".join(texts)
    if SPARK_DATA_LOSS not in text:
        return None
    named = _named(text)
    if not named:
        said = next((line.strip() for line in text.splitlines() if _SAID.search(line)), text.strip()[:200])
        read = ", ".join(f"{t}[{p}]" for t, ps in sorted(partitions.items()) for p in ps)
        return records_lost(decl, [], f"Spark's Kafka source failed the query for data loss in one of {read}: "
                            f"{said}", topics=tuple(partitions))
    opened = [(g.topic, g.partition) for g in named if g.end is None]
    try:
        now = bounds(brokers, opened) if opened else {}
    except Exception as why:  # Kafka gone as well: the range stays open
        log.warning("the log start offsets of %s could not be read: %s", opened, why)
        now = {}
    closed = [Gap(g.topic, g.partition, g.first, now[(g.topic, g.partition)][0])
              if g.end is None and now.get((g.topic, g.partition), (-1, 0))[0] > g.first else g for g in named]
    return records_lost(decl, closed, "Spark's Kafka source failed the query for data loss")


def raise_translated(exc: BaseException, brokers: KafkaSettings, decl: Declaration,
                     partitions: dict[str, list[int]]) -> None:
    """Raise `translated`'s `RecordsLost` from `exc` when the query failed for data loss: not Kafka failing, so
    that the stream does not start the query again as it does after Kafka failed (`bronze._restart_after`)."""
    if (gone := translated(exc, brokers, decl, partitions)) is not None:
        raise gone from exc
