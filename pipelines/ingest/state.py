"""What the bronze tables hold, as the writer needs it: their Hudi options, and the `(id, _lsn)`
state of main and of the deletes, read once per stream and then kept by the writer's own commits
(`KnownRows`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import hudi_configs
from pipelines.lake import storage
from pipelines.lake.frames import materialized, release, union_all
from pipelines.lake.hudi_timeline import latest_extra
from pipelines.lake.layout import POSITIONS_META, changelog_path, ledger_path
from pipelines.lake.table_stats import has_completed_commit

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- writing

def discard_unborn(path: str) -> None:
    """Remove a table whose creation a crash cut short: `.hoodie/` there, but no `hoodie.properties`
    (nor Hudi's `.backup` of it) naming the table. Hudi creates the folders, then writes the
    properties file, then the first instant; a SIGKILL in between (the folders without the file,
    or an empty file) leaves a table Hudi can neither load, nor write to, nor roll back, and every
    later ingest would fail on it. Such a table holds nothing
    committed. One with a completed commit is never removed: its properties went missing some
    other way, and Hudi's own error says so.
    """
    meta = f"{path}/.hoodie"
    names = storage.list_dir(meta)
    if not names:
        return
    for name in ("hoodie.properties", "hoodie.properties.backup"):
        if name in names and "hoodie.table.name=" in storage.read_text(f"{meta}/{name}"):
            return
    if has_completed_commit(path):
        log.error("%s: hoodie.properties is missing or incomplete, yet the table has completed commits", path)
        return
    log.warning("%s: its creation was cut short (no complete hoodie.properties); removed, to be created again", path)
    storage.remove_tree(path)


def _empty_state(spark: SparkSession, key: dict[str, str]) -> DataFrame:
    return spark.createDataFrame([], ", ".join([*(f"`{c}` {t}" for c, t in key.items()), "_lsn bigint"]))


def read_state(spark: SparkSession, path: str, key: dict[str, str]) -> DataFrame:
    """(key columns, _lsn) of every row of a bronze table; empty if the table has no commit yet.

    `key`: the key's columns with their types (what an empty table's frame is typed as).
    """
    if not has_completed_commit(path):
        return _empty_state(spark, key)
    return spark.read.format("hudi").options(**hudi_configs.section("bronze", "state_read")).load(path) \
        .select(*key, "_lsn")


def read_deletes(spark: SparkSession, table: str, root: str, key: dict[str, str]) -> DataFrame:
    """(key columns, _lsn) of every delete applied to `table`: the change log's and the ledger's (a key may repeat).

    The change log is read first and at once: expiry writes a day's deletes to the ledger and
    only then drops the day, so a ledger read after the change-log read misses nothing.
    """
    path = changelog_path(table, root)
    if has_completed_commit(path):
        log_deletes = materialized(spark.read.format("hudi").options(**hudi_configs.section("bronze", "state_read"))
                                   .load(path).filter(F.col("_op") == "d").select(*key, "_lsn"))
    else:
        log_deletes = _empty_state(spark, key)
    return log_deletes.unionByName(read_state(spark, ledger_path(table, root), key))


def ingest_meta(spark: SparkSession, path: str) -> dict[str, str]:
    """The commit metadata of the newest ingest commit of `path` (the newest with a position; {} if none)."""
    return (latest_extra(spark, path, POSITIONS_META) or {}) if has_completed_commit(path) else {}


def positions_in(meta: dict[str, str]) -> dict[str, int]:
    """The Kafka position an ingest commit's metadata records ({} if none)."""
    return json.loads(meta.get(POSITIONS_META) or "{}")


def positions_of(spark: SparkSession, path: str) -> dict[str, int]:
    """The Kafka position recorded by the newest ingest commit of `path` ({} if none)."""
    return positions_in(ingest_meta(spark, path))


def known_rows(key: Sequence[str], main: DataFrame | None = None, deletes: DataFrame | None = None) -> DataFrame:
    """Rows a writer knows, in the one shape `KnownRows` keeps: (key columns, _lsn, _live, _delete).

    `main`: (key, _lsn, _live) of main's rows (`_live` false for a delete main applied);
    `deletes`: (key, _lsn) of deletes applied (change log, ledger).
    """
    frames = []
    if main is not None:
        frames.append(main.select(*key, "_lsn", "_live", F.lit(False).alias("_delete")))
    if deletes is not None:
        frames.append(deletes.select(*key, "_lsn", F.lit(False).alias("_live"), F.lit(True).alias("_delete")))
    return union_all(frames)


def known_state(rows: DataFrame, key: Sequence[str]) -> DataFrame:
    """Known rows -> per key, what the plan compares with: (key columns, _m_lsn, _t_lsn).

    `_m_lsn`: the LSN of main's row, null when main does not hold the key (its newest main row
    is a delete, or it has none); `_t_lsn`: the newest delete applied, null if none.
    """
    return _newest(rows, key).select(*key, F.when(F.col("_m._live"), F.col("_m._lsn")).alias("_m_lsn"), "_t_lsn")


def _newest(rows: DataFrame, key: Sequence[str]) -> DataFrame:
    """Known rows -> per key, main's newest row (`_m`: struct of _lsn, _live; null if none) and the newest delete."""
    is_main = ~F.col("_delete")
    return rows.groupBy(*key).agg(
        F.max_by(F.struct("_lsn", "_live"), F.when(is_main, F.col("_lsn"))).alias("_m"),  # nulls are skipped
        F.max(F.when(F.col("_delete"), F.col("_lsn"))).alias("_t_lsn"))


def _held(state: DataFrame, key: Sequence[str]) -> DataFrame:
    """`known_state` -> (key, _lsn) of the rows main holds."""
    return state.filter(F.col("_m_lsn").isNotNull()).select(*key, F.col("_m_lsn").alias("_lsn"))


def _compacted(rows: DataFrame, key: Sequence[str]) -> DataFrame:
    """Known rows -> at most two per key (main's newest row, the newest delete) that say the same.

    Main's newest row stays when it is a delete (`_live` false): an older piece may hold the key's
    live row, which that row hides.
    """
    newest = _newest(rows, key)
    return known_rows(key, newest.filter(F.col("_m").isNotNull()).select(*key, "_m._lsn", "_m._live"),
                      newest.filter(F.col("_t_lsn").isNotNull()).select(*key, F.col("_t_lsn").alias("_lsn")))


class KnownRows:
    """What one table's writer knows of main and of the deletes: read from the tables once, then grown by its batches.

    The stream is the only writer that adds to what main and the change log hold (erasure only
    takes keys away, and those never return: their events are filtered out before planning),
    so what it read at start plus what it wrote since is exact. A batch then looks up only its
    own keys, in cached rows (a broadcast semi-join: no Hudi read, no shuffle of the table),
    where reading main's `(id, _lsn)` every batch would merge every file slice of the table, a
    plan phase that grows with the table. Main's rows and
    the deletes are kept together (`known_rows`), so that a lookup is one scan and one fold.

    Each batch adds a piece, and the pieces are merged size-tiered, as a log-structured store
    merges its runs: a piece of n rows is in tier log_FAN_IN(n), and once FAN_IN pieces at the
    newest piece's tier or below follow each other at the end, they become one. A merge takes the
    rows of the pieces it covers, a row is merged about once per tier (a handful: tier 6 holds 262k
    to 2.1M rows), and a lookup scans at most FAN_IN - 1 pieces per tier. Merging every piece, the
    table's included, every few batches would make those batches pay for the whole table; merging
    by the count of batches would merge the initial snapshot's rows again into an early batch's.
    """

    FAN_IN = 8

    def __init__(self, load: Callable[[], DataFrame], key: Sequence[str]) -> None:
        self._load = load  # known_rows(...) of the tables
        self.key = tuple(key)
        self._pieces: list[tuple[DataFrame, int]] | None = None  # oldest first, each with its rows
        # Nothing known: the tables were empty when read and nothing was added since (a new lake's
        # first batch, the initial snapshot: the largest batch a stream ever gets).
        self._nothing = False

    @property
    def loaded(self) -> bool:
        return self._pieces is not None

    @property
    def sizes(self) -> list[int]:
        """The rows of each piece, oldest first (a merged piece counts the rows it took in)."""
        return [n for _, n in self._pieces or []]

    def load(self) -> None:
        """Read the tables now (the stream's first batch of the table pays for it, once)."""
        self._rows()

    def main(self) -> DataFrame:
        """(key, _lsn) of every row main holds."""
        return _held(known_state(self._rows(), self.key), self.key)

    def lookup(self, keys: DataFrame) -> DataFrame:
        """`known_state` of `keys` (a frame of the key's columns); a key nothing is known of has no row.

        When nothing is known the answer is an empty relation Spark's optimizer sees as one, so
        the plan's join with it disappears: no broadcast of the batch's keys, no join.
        """
        rows = self._rows()
        if self._nothing:
            return known_state(rows, self.key).limit(0)
        return known_state(rows.join(F.broadcast(keys), list(self.key), "left_semi"), self.key)

    def add(self, rows: DataFrame, n: int) -> None:
        """`known_rows` this writer has just committed, `n` of them (materialized now: they may derive from
        a cache about to go)."""
        self._rows()
        assert self._pieces is not None
        if not n:
            return
        self._nothing = False
        # One partition per piece: a lookup scans every partition of every piece, and a batch's
        # rows arrive in as many partitions as its shuffles made (4 locally, 64 on EMR), most of
        # them tiny.
        self._pieces.append((materialized(rows.coalesce(1)), n))
        while True:
            tier = self._tier(self._pieces[-1][1])
            run = 0
            while run < len(self._pieces) and self._tier(self._pieces[-1 - run][1]) <= tier:
                run += 1
            if run < self.FAN_IN:
                return
            merging = self._pieces[-run:]
            merged = materialized(_compacted(union_all([frame for frame, _ in merging]), self.key).coalesce(1))
            self._pieces[-run:] = [(merged, sum(size for _, size in merging))]
            for frame, _ in merging:  # merged now (the checkpoint is eager): their blocks go at once
                release(frame)

    @classmethod
    def _tier(cls, n: int) -> int:
        tier = 0
        while n >= cls.FAN_IN:
            n, tier = n // cls.FAN_IN, tier + 1
        return tier

    def _rows(self) -> DataFrame:
        if self._pieces is None:
            rows = materialized(self._load())
            self._pieces = [(rows, rows.count())]
            self._nothing = self._pieces[0][1] == 0
        return union_all([frame for frame, _ in self._pieces])
