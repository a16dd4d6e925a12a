"""Where the stream and each bronze table stand in Kafka, as their commits record them: read once from the
tables' newest ingest commits, then kept up to date by the writer's own commits.

Every commit of a batch records the stream's position after it (`POSITIONS_META`): a batch that a
table's newest commit already covers is a replay, and main ahead of its change log is a crash between
their side-by-side commits.
"""

from __future__ import annotations

from pyspark.sql import Row

from pipelines.ingest.held_letters import stored_through
from pipelines.ingest.state import positions_in
from pipelines.lake.declaration import Declaration
from pipelines.lake.layout import BATCH_ID_META, changelog_path, dead_letter_path, main_path


def _reaches(applied: dict[str, int], ends: dict[str, int]) -> bool:
    """True when the positions `applied` are at or past `ends` in every partition `ends` names."""
    return all(applied.get(tp, 0) >= o for tp, o in ends.items())


def end_offsets(tally: list[Row]) -> list[tuple[str, int, int, int, int]]:
    """(topic, partition, first offset, last offset, records) of the batch: what it consumed.

    `tally`: the batch's rows of `survey.tally`, a handful per Kafka partition.
    """
    found: dict[tuple[str, int], tuple[int, int, int]] = {}
    for g in tally:
        first, last, n = found.get((g["kafka_topic"], g["kafka_partition"]), (g["first"], g["last"], 0))
        found[(g["kafka_topic"], g["kafka_partition"])] = (min(first, g["first"]), max(last, g["last"]), n + g["n"])
    return [(t, p, a, o, n) for (t, p), (a, o, n) in found.items()]


class PositionLedger:
    """The Kafka positions a writer keeps between batches, each `{"topic/partition": next offset}`.

    `decl`: the declaration of the stream's query, whose tables' commits say where the stream stands.
    """

    def __init__(self, root: str, decl: Declaration) -> None:
        self.root = root
        self.decl = decl
        # The stream's position (None until `start`).
        self.position: dict[str, int] | None = None
        # Per table path (main, change log, the dead-letter store), the position its newest commit records.
        self.applied: dict[str, dict[str, int]] = {}
        # The stream's position up to which every dead letter is in the store: behind `position`
        # while the writer holds letters back (pipelines.ingest.held_letters).
        self.through: dict[str, int] = {}
        self.last_batch: int | None = None  # the newest batch committed

    @property
    def started(self) -> bool:
        return self.position is not None

    def start(self, newest: dict[str, dict[str, str]]) -> None:
        """Where things stand, from the newest ingest commit of every main table, change log and of the store.

        `newest`: by path, each one's commit metadata (`state.ingest_meta`).
        """
        mains = [main_path(t, self.root) for t in self.decl.names]
        logs = [changelog_path(t, self.root) for t in self.decl.names]
        store = dead_letter_path(self.root)
        self.applied = {path: positions_in(meta) for path, meta in newest.items()}
        self.position = {}
        for path in [*mains, store]:
            for tp, o in self.applied[path].items():
                self.position[tp] = max(self.position.get(tp, 0), o)
        self.through = stored_through([newest[p] for p in [*mains, *logs]], newest[store])
        self.last_batch = max((int(newest[p][BATCH_ID_META]) for p in [*mains, store]
                               if BATCH_ID_META in newest[p]), default=None)

    def after(self, ends: dict[str, int]) -> dict[str, int]:
        """The stream's position after a batch that read up to `ends`, in every partition it has consumed from."""
        assert self.position is not None
        return {tp: max(self.position.get(tp, 0), ends.get(tp, 0)) for tp in {*self.position, *ends}}

    def advance(self, position: dict[str, int], batch_id: int) -> None:
        """The batch `batch_id` is committed: the stream stands at `position`."""
        self.position, self.last_batch = position, batch_id

    def covered(self, path: str, ends: dict[str, int]) -> bool:
        """True when the newest commit of `path` was made at or after these end offsets: a replayed batch."""
        applied = self.applied[path]
        return bool(applied) and _reaches(applied, ends)

    def log_behind(self, table: str) -> bool:
        """True when main's newest commit covers a position the change log's does not.

        Every batch that commits to main also commits to the change log (what main gets, the
        change log gets), with the same positions, and the two commits run side by side: so this
        is a crash between them, and the batch main holds is missing from the change log.
        """
        return not _reaches(self.applied[changelog_path(table, self.root)], self.applied[main_path(table, self.root)])

    def committed(self, path: str, meta: dict[str, str]) -> None:
        """A commit with the metadata `meta` is made at `path`."""
        self.applied[path] = positions_in(meta)
