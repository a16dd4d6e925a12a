"""What every part of a micro-batch shares: its report (counts, and where its time went), running its
tables' commits side by side, and one Hudi commit of rows.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NamedTuple

from pyspark import SparkContext
from pyspark.sql import DataFrame

from pipelines.metastore import catalog_sync
from pipelines.monitoring.lineage import named_for_lineage
from pipelines.runtime.hudi_writes import save

_BATCH_LINE = re.compile(r"batch (\d+): (\d+) records in ([\d.]+)s")


class TableRead(NamedTuple):
    """What a batch read of one table's topic: what the stream's exporter counts per table (the line has the total)."""

    records: int  # Kafka records
    bytes: int  # bytes of their values (a tombstone's none)
    dead_letters: int  # those that became dead letters (the surveys' count: malformed, or of a shape not applied)


@dataclass(frozen=True)
class BatchSpan:
    """Where a batch stands in Kafka, per topic partition ("topic/partition"): the first offset it read (`starts`),
    the offset after its last (`ends`), and the stream's position once it is committed (`position`)."""

    batch_id: int
    starts: dict[str, int]
    ends: dict[str, int]
    position: dict[str, int]


# The outcomes of a table's counts that its commits wrote (`tables.TableWriter.apply`): a table with either
# had its change log and main committed; `stale`, `waiting`, `dead`, ... alone mean no commit.
COMMITTED_OUTCOMES = ("upsert", "delete")


@dataclass
class BatchReport:
    """What a batch did and where its time went (the phases are what tuning starts from)."""

    batch_id: int
    seconds: float = 0.0
    records: int = 0
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)
    # Per table whose topic the batch read; empty for the commits made between batches (they read nothing).
    read: dict[str, TableRead] = field(default_factory=dict)

    def committed(self) -> list[str]:
        """The tables whose change log and main this report's commits wrote (the line's upsert= and delete=)."""
        return [t for t, c in self.counts.items() if any(c.get(k) for k in COMMITTED_OUTCOMES)]

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block; its Spark jobs carry the phase's name (Spark UI, event log) where Hudi names none."""
        started = time.monotonic()
        context = SparkContext._active_spark_context
        if context is not None:  # a thread's own property (pinned threads): side-by-side phases keep theirs
            context.setJobDescription(f"batch {self.batch_id}: {name}")
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.monotonic() - started

    @classmethod
    def parse(cls, line: str) -> BatchReport | None:
        """The batch id, records, seconds, counts and phases of a logged `line()`; None for any other log line."""
        found = _BATCH_LINE.search(line)
        if not found:
            return None
        timing = line.rsplit("| seconds: ", 1)[1].split() if "| seconds: " in line else []
        counts = {}
        for part in line[found.end():].rpartition("| seconds: ")[0].split(" | "):
            name, said, items = part.strip(" |").partition(": ")
            if said:
                counts[name] = {k: int(v) for k, _, v in (item.partition("=") for item in items.split())}
        return cls(int(found[1]), float(found[3]), int(found[2]), counts,
                   phases={k: float(v) for k, _, v in (item.partition("=") for item in timing)})

    def line(self) -> str:
        """The line the batch is logged with, which `parse` reads back (the benchmarks sum its phases)."""
        parts = [f"{t}: " + " ".join(f"{k}={v}" for k, v in sorted(c.items())) for t, c in self.counts.items()]
        timing = " ".join(f"{k}={v:.1f}" for k, v in self.phases.items())
        return (f"batch {self.batch_id}: {self.records} records in {self.seconds:.1f}s | " + " | ".join(parts)
                + f" | seconds: {timing}")


def run_together(jobs: list[Callable[[], None]], *, parallel: bool = True, at_most: int | None = None) -> None:
    """Run `jobs` in threads of their own, `at_most` at once; when all are done, raise the first failure.

    The change logs, the main tables and the dead letters are independent Hudi tables, and most
    of a commit's time is single-threaded driver work (timeline, markers, the commit's metadata;
    `lakehouse dev bench commits`): one table's commit path runs while the other's tasks use the
    cores. A crash leaves some of them committed and others not, which the re-run handles table
    by table (each commit records the positions it covers). `at_most` bounds the threads when a
    batch commits many tables: each table's commits hold their batch's rows and Spark jobs at once.
    """
    if len(jobs) <= 1 or not parallel:
        for job in jobs:
            job()
        return
    workers = len(jobs) if at_most is None else max(1, min(at_most, len(jobs)))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="bronze-table") as pool:
        futures = [pool.submit(job) for job in jobs]
    errors = [e for f in futures if (e := f.exception()) is not None]
    if errors:
        raise errors[0]


# Rows per file of a bulk insert (change log, dead letters): a streaming batch's rows make one file.
ROWS_PER_FILE = 100_000


def in_files(rows: DataFrame, n: int, options: dict[str, str]) -> DataFrame:
    """`rows` (`n` of them) in as many Spark partitions as a bulk insert of them should write files.

    Hudi 1.0.2's row writer, in sort mode NONE, writes a file per non-empty partition of its input,
    whatever `hoodie.bulkinsert.shuffle.parallelism` says (the datasource does not enforce it): a
    change log of 4 shuffle partitions gets 4 files per commit, the dead-letter store one per
    Kafka partition. One file per ROWS_PER_FILE rows, at most that parallelism; no shuffle.
    """
    files = min(int(options.get("hoodie.bulkinsert.shuffle.parallelism", "1")), -(-n // ROWS_PER_FILE))
    return rows.coalesce(max(1, files))


def append(rows: DataFrame, path: str, options: dict[str, str], n: int | None = None) -> None:
    """One Hudi commit of `rows` at `path`; a bulk insert of `n` rows in as few files as `in_files` says."""
    if n is not None:
        rows = in_files(rows, n, options)
    save(rows, path, named_for_lineage(path, options))
    catalog_sync.committed(rows.sparkSession, path, options)
