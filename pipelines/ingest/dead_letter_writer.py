"""The dead-letter writer: a batch's dead letters that the store lacks, held back for a later batch's commit
or written in one commit (pipelines.ingest.held_letters says when), with the batch's Kafka position.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipelines.ingest.batch import BatchReport, BatchSpan, append
from pipelines.ingest.erasures import Erased
from pipelines.ingest.held_letters import HeldLetters, hold_limits
from pipelines.ingest.parse import dead_letters
from pipelines.ingest.positions import PositionLedger
from pipelines.lake.catalog import bronze_options
from pipelines.lake.frames import materialized, union_all
from pipelines.lake.layout import BATCH_ID_META, DEAD_LETTERS_META, POSITIONS_META, dead_letter_path

log = logging.getLogger(__name__)


@dataclass
class StorePart:
    """A batch's part in the dead-letter store: the job that runs beside its tables' commits (None: nothing to
    run), and the letters that job staged to hold back, with their count (None: not counted yet)."""

    job: Callable[[], None] | None = None
    staged: list[tuple[DataFrame, int | None]] = field(default_factory=list)


class DeadLetterWriter:
    """The dead letters of a stream's batches into the store, a commit for several batches' letters."""

    def __init__(self, root: str, ledger: PositionLedger) -> None:
        self.root = root
        self.ledger = ledger  # the store's position, and up to where every dead letter is in it
        self.held = HeldLetters(hold_limits())

    @property
    def holding(self) -> bool:
        return bool(self.held.pieces)

    def stage(self, parsed: dict[str, DataFrame], dead: int, span: BatchSpan, *, meta: dict[str, str],
              report: BatchReport, erased: Erased | None) -> StorePart:
        """What the batch (where it stands in Kafka: `span`) does with its `dead` letters (the surveys' count) and
        with those held back.

        A batch without any (nearly every batch of a real Debezium source) runs no job for the store,
        and one with a few holds them back. `meta`, the batch's commit metadata, gets what its commits
        say of the store (`DEAD_LETTERS_META`), which holds whatever becomes of the store's own commit.
        """
        starts = span.starts
        letters, exact = (self._letters(parsed, span.batch_id, starts) if dead and
                          not self.ledger.covered(dead_letter_path(self.root), span.ends) else (None, False))
        if letters is not None or self.held.pieces:
            # Letters held: `through` must name every partition they may come from. One the stream reads for the
            # first time (on a new lake, before the store's first commit names any) is stored up to this batch's
            # first offset in it; left out, a writer killed while holding its letters would leave the next one no
            # position to read them again from (writer.BronzeBatchWriter.start), and they would be lost.
            self.ledger.through = {**starts, **self.ledger.through}
        hold = letters is not None and self.held.keep(dead, report.records)
        flush = (letters is not None and not hold) or (bool(self.held.pieces) and not self.held.keep(0, report.records))
        meta[DEAD_LETTERS_META] = json.dumps(
            self.ledger.through if letters is not None or self.held.pieces else span.position, sort_keys=True)
        part = StorePart()
        if flush:
            pieces, held_rows = list(self.held.pieces), self.held.rows
            count: int | None = held_rows
            if letters is not None:
                pieces.append(letters)
                count = held_rows + dead if exact else None
            part.job = functools.partial(self.write, union_all(pieces), count, meta, report, erased)
        elif hold and letters is not None:  # holding implies letters
            held, n = letters, dead if exact else None
            part.job = lambda: part.staged.append((materialized(held), n))
        return part

    def settle(self, part: StorePart, position: dict[str, int], report: BatchReport) -> None:
        """The batch has committed at `position`: the letters it staged are held; holding none, the store has
        every dead letter up to there."""
        if part.staged:
            piece, n = part.staged[0]
            self.held.add(piece, n if n is not None else piece.count())
            report.counts.setdefault("dead_letters", {})["held"] = self.held.rows
        if not self.held.pieces:
            self.ledger.through = position

    def _letters(self, parsed: dict[str, DataFrame], batch_id: int, starts: dict[str, int]) -> tuple[DataFrame, bool]:
        """The batch's dead letters that the store lacks, and whether they are all the batch's (the surveys' count).

        The store is written with bulk inserts (no index lookup, whose cost grows with the store):
        what an earlier commit already holds, a batch re-run after a crash, is left out here.
        """
        path = dead_letter_path(self.root)
        rows = union_all([dead_letters(events, batch_id) for events in parsed.values()])
        stored = [(F.col("kafka_topic") == tp.rsplit("/", 1)[0])
                  & (F.col("kafka_partition") == int(tp.rsplit("/", 1)[1])) & (F.col("kafka_offset") < o)
                  for tp, o in self.ledger.applied[path].items() if o > starts.get(tp, o)]
        if stored:
            rows = rows.filter(~functools.reduce(lambda a, b: a | b, stored))
        return rows, not stored

    def write(self, rows: DataFrame, n: int | None, meta: dict[str, str], report: BatchReport,
              erased: Erased | None) -> None:
        """`rows` (`n` of them, None: not counted yet), the held letters among them, into the store in one commit."""
        if erased is not None:
            rows, n = erased.dead_letters(rows), None
        with report.phase("dead_letters"):
            # Nearly every batch is neither a re-run nor filtered by the registry: its count is the
            # surveys', and its rows are computed once, by the write.
            n = rows.count() if n is None else n
            report.counts.setdefault("dead_letters", {})["written"] = n
            if n:
                path = dead_letter_path(self.root)
                append(rows, path, bronze_options("dead_letters", "bronze_dead_letters", **meta), n)
                self.ledger.committed(path, meta)
        # In the store now, whatever becomes of the batch's other commits: not to be written again.
        self.held.clear()

    def flush(self, erased: Erased | None) -> None:
        """Write the dead letters held back (the stream is stopping): the store then holds every one."""
        position = self.ledger.position
        assert position is not None
        report = BatchReport(self.ledger.last_batch if self.ledger.last_batch is not None else -1)
        said = json.dumps(position, sort_keys=True)
        meta = {BATCH_ID_META: str(report.batch_id), POSITIONS_META: said, DEAD_LETTERS_META: said}
        self.write(union_all(self.held.pieces), self.held.rows, meta, report, erased)
        self.ledger.through = dict(position)
        log.info("dead letters held back, written as the stream stops: %d", report.counts["dead_letters"]["written"])
