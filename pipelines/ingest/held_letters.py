"""Dead letters held back from the store for a while, so that a batch with a malformed record does not
make a Hudi commit of its own for it.

A commit costs about the same whatever it holds (a dozen Spark jobs, the metadata table, markers),
and a source that sends malformed records now and then would make every batch pay one more commit,
beside the tables', for a handful of rows. The writer keeps a batch's dead letters
in memory instead, and writes what it holds in one commit when the oldest has waited
`max_seconds`, when it holds `max_rows`, in a large batch (a catch-up: one commit among much work),
and when the stream stops (`ingest --once` done, SIGTERM, a stop request).

What keeps held letters safe is the stream's position, as the tables' own commits record it: each
commit of a batch says up to where every dead letter is in the store (`DEAD_LETTERS_META`). A writer
that starts (after a SIGKILL, say) on a lake where that position is behind the stream's reads the
Kafka records in between again (the topics keep them; a gap fails the job, `failOnDataLoss`): its
stream starts there (`BronzeBatchWriter.start`). Main and the change log hold them already, so by the
LSN rule they change nothing there, and the store gets exactly the letters it lacks (the writer leaves
out the positions the store's commits cover).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from pyspark.sql import DataFrame

import hudi_configs
from pipelines.lake.frames import release
from pipelines.lake.layout import DEAD_LETTERS_META, POSITIONS_META


@dataclass(frozen=True)
class HoldLimits:
    max_seconds: float
    max_rows: int
    max_batch_records: int


def hold_limits() -> HoldLimits:
    """bronze.toml `[dead_letter_hold]`, with the deployment's overrides."""
    values = hudi_configs.section("bronze", "dead_letter_hold")
    return HoldLimits(float(values["max_seconds"]), int(values["max_rows"]), int(values["max_batch_records"]))


@dataclass
class HeldLetters:
    """The dead letters of committed batches that the store does not have yet (materialized frames)."""

    limits: HoldLimits
    pieces: list[DataFrame] = field(default_factory=list)
    rows: int = 0
    since: float | None = None  # when the oldest was held (time.monotonic)

    def add(self, piece: DataFrame, rows: int) -> None:
        self.pieces.append(piece)
        self.rows += rows
        self.since = self.since if self.since is not None else time.monotonic()

    def keep(self, new_rows: int, batch_records: int) -> bool:
        """True when a batch's `new_rows` letters may wait for a later batch's commit."""
        if batch_records >= self.limits.max_batch_records or self.rows + new_rows >= self.limits.max_rows:
            return False
        return self.since is None or time.monotonic() - self.since < self.limits.max_seconds

    def clear(self) -> None:
        """Forget what was held (once it is in the store) and free its blocks."""
        for piece in self.pieces:
            release(piece)
        self.pieces, self.rows, self.since = [], 0, None


def stored_through(tables: list[dict[str, str]], store: dict[str, str]) -> dict[str, int]:
    """The stream's position up to which every dead letter is in the store, per topic partition.

    From the newest ingest commits' metadata (`state.ingest_meta`) of the tables and of the store:
    the newest of what the tables' commits say (their `DEAD_LETTERS_META`; a commit without it, of a
    writer that held nothing, says its own position) and the store's own position.
    """
    through: dict[str, int] = {}
    for said in [*(meta.get(DEAD_LETTERS_META) or meta.get(POSITIONS_META) for meta in tables),
                 store.get(POSITIONS_META)]:
        for tp, offset in json.loads(said or "{}").items():
            through[tp] = max(through.get(tp, 0), offset)
    return through


EARLIEST = -2  # Kafka's "earliest" in startingOffsets: a partition the store's position does not name yet
