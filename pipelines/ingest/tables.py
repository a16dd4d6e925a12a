"""A batch's writes to one source table's bronze tables: the plan of what each key still needs, against what
the writer knows main and the deletes hold, then the change log's commit and main's, side by side.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.storagelevel import StorageLevel

import hudi_configs
from pipelines.ingest.batch import BatchReport, append, run_together
from pipelines.ingest.erasures import Erased
from pipelines.ingest.plan import change_rows, newest_per_key, plan, truncate_deletes
from pipelines.ingest.positions import PositionLedger
from pipelines.ingest.schema import COLUMNS_META
from pipelines.ingest.state import KnownRows, known_rows, read_deletes, read_state
from pipelines.ingest.survey import SchemaSurvey, Survey
from pipelines.lake.buckets import NUM_BUCKETS
from pipelines.lake.catalog import bronze_options, keyed_options, main_options, main_writer_options
from pipelines.lake.declaration import Declaration
from pipelines.lake.frames import materialized, release
from pipelines.lake.layout import BUCKETS_META, DECLARED_META, DELETED_FLAG, META_COLUMNS, changelog_path, main_path
from pipelines.lake.table_stats import has_completed_commit

log = logging.getLogger(__name__)


class TableWriter:
    """The change logs and main tables of a stream's batches, and what the writer knows they hold.

    `decl`: the declaration of the stream's query: the tables it writes for all the query's batches.
    """

    def __init__(self, spark: SparkSession, root: str, decl: Declaration, ledger: PositionLedger,
                 shapes: SchemaSurvey, placeholder: str) -> None:
        self.spark = spark
        self.root = root
        self.decl = decl
        self.ledger = ledger  # each table's position, kept up to date by the commits made here
        self.shapes = shapes  # each table's shape, kept up to date by main's commits made here
        self.placeholder = placeholder
        # Main tables with a completed commit; a table without one gets its first batch by bulk insert.
        self._born: set[str] = set()
        # Per table, what main holds and every delete applied: read once, then kept up to date
        # by this writer's own commits (KnownRows).
        self._known: dict[str, KnownRows] = {}

    def start(self) -> None:
        """Which main tables have a completed commit."""
        self._born = {t for t in self.decl.names if has_completed_commit(main_path(t, self.root))}

    def _known_rows(self, table: str, key: dict[str, str]) -> KnownRows:
        """What main holds and the deletes applied, for `table`; `key`: its key's columns and their types."""
        if table not in self._known:
            main = main_path(table, self.root)
            self._known[table] = KnownRows(lambda: known_rows(
                tuple(key), read_state(self.spark, main, key).withColumn("_live", F.lit(True)),
                read_deletes(self.spark, table, self.root, key)), tuple(key))
        return self._known[table]

    def _fill_unavailable(self, newest: DataFrame, changes: DataFrame, table: str, columns: list[str],
                          state: DataFrame, key: tuple[str, ...]) -> DataFrame:
        """Placeholders (an unchanged TOASTed value) replaced by the value the source still holds.

        That value is the one of the newest event before it: among the batch's events of the key
        (a replayed older one does not count when main holds a newer row), else main's row, read
        for the keys that still need one only. `state`: `known_state` of the batch's keys.
        """
        ph = self.placeholder
        def real(c: str) -> Column:  # the LSN of an event carrying a real value of `c` (null is one)
            return F.when(~F.col(c).eqNullSafe(ph), F.col("_lsn"))

        on = list(key)
        known = changes.filter(F.col("_op") != "d").groupBy(*key).agg(*[
            agg for c in columns for agg in (F.max_by(F.col(c), real(c)).alias(f"_batch_{c}"),
                                             F.max(real(c)).alias(f"_found_{c}"))])
        stored_lsn = F.coalesce(F.col("_m_lsn"), F.lit(-1))

        def need(c: str) -> Column:
            return F.col(c).eqNullSafe(ph) & F.coalesce(F.col(f"_found_{c}") < stored_lsn, F.lit(True))

        filled = newest.join(known, on, "left").join(state.select(*key, "_m_lsn"), on, "left").select(*[
            F.when(F.col(c) == ph, F.col(f"_batch_{c}")).otherwise(F.col(c)).alias(c) if c in columns else F.col(c)
            for c in newest.columns], *[need(c).alias(f"_need_{c}") for c in columns])
        any_need = functools.reduce(lambda a, b: a | b, [F.col(f"_need_{c}") for c in columns]) & (F.col("_op") != "d")
        main = main_path(table, self.root)
        stored_columns = [c for c in columns if c in self.shapes.shape(table).columns]
        if has_completed_commit(main) and stored_columns:
            keys = filled.filter(any_need).select(*key).distinct()
            stored = self.spark.read.format("hudi").options(**hudi_configs.section("bronze", "unavailable_read")) \
                .load(main).join(F.broadcast(keys), on, "left_semi") \
                .select(*key, *[F.col(c).alias(f"_stored_{c}") for c in stored_columns])
            filled = filled.join(stored, on, "left")
        return filled.select(*[
            F.when(F.col(f"_need_{c}"), F.col(f"_stored_{c}") if c in stored_columns else F.lit(None).cast("string"))
            .otherwise(F.col(c)).alias(c) if c in columns else F.col(c) for c in newest.columns])

    def apply(self, table: str, survey: Survey, meta: dict[str, str], report: BatchReport,
              erased: Erased | None, *, parallel: bool = True) -> None:
        """The batch's events of `table` (`survey.events`) into its change log and main, each commit with `meta`.

        `parallel`: the two commits side by side (a truncate's never are).
        """
        counts = report.counts.setdefault(table, {})
        kinds = survey.kinds
        for kind in ("tombstone", "ignored", "truncate", "dead"):
            if kinds.get(kind):
                counts[kind] = kinds[kind]
        if not kinds.get("row") and not kinds.get("truncate"):
            return
        batch = _TableBatch(table, survey, meta, report)
        planned, known, truncating = self._plan(batch, erased)
        try:
            tally = _tally(batch, planned)
            # Side by side: main's commit, which makes the changes visible, no longer waits for the
            # change log's. A crash between them is re-planned from main's rows (`relog`), except
            # a truncate's: its deletes name keys that only main's rows before it know, so there
            # the change log commits first, as a write-ahead log.
            run_together(self._writes(batch, planned, tally), parallel=parallel and not truncating)
            self._committed(batch, planned, tally, known)
        finally:
            release(planned)

    def _plan(self, batch: _TableBatch, erased: Erased | None) -> tuple[DataFrame, KnownRows, bool]:
        """Step: what each key of the batch still needs, against what main and the deletes hold (materialized).

        Returns the plan, what the writer knows of the table, and whether the batch truncates it.
        """
        table, survey, report = batch.table, batch.survey, batch.report
        events, shape = survey.events, survey.shape
        key = shape.key
        known = self._known_rows(table, {k: shape.columns[k].type if k in shape.columns else "string" for k in key})
        if not known.loaded:  # the stream's first batch of this table: one read of the tables
            with report.phase(f"{table}.load_state"):
                known.load()
        changes = change_rows(events, shape)
        if erased is not None:  # events of erased customers and their orders never reach the lake again
            changes = erased.changes(changes, table)
        # A truncate deletes every key the table holds: the one plan that needs them all.
        synthetic = truncate_deletes(events, known.main(), shape) if survey.kinds.get("truncate") else None
        if synthetic is not None:
            changes = changes.unionByName(synthetic)
        newest = newest_per_key(changes, key)
        if survey.toast:
            newest = self._fill_unavailable(newest, changes, table, [c for c in survey.toast if c in shape.columns],
                                            known.lookup(newest.select(*key)), key)
        newest = newest.persist(StorageLevel.MEMORY_AND_DISK)
        keys = newest.select(*key)
        relog = self.ledger.log_behind(table)
        if relog:
            log.warning("bronze/%s: main holds a batch its change log lacks (a crash between their commits): "
                        "that batch's changes are logged again from main's rows", table)
        try:
            with report.phase(f"{table}.plan"):
                planned = materialized(plan(newest, known.lookup(keys), key, relog=relog))
        finally:
            newest.unpersist()
        return planned, known, synthetic is not None

    def _writes(self, batch: _TableBatch, planned: DataFrame, tally: _Tally) -> list[Callable[[], None]]:
        """Step: the change log's commit and main's, as jobs to run together (only those with rows to write)."""
        table, survey, meta, report = batch.table, batch.survey, batch.meta, batch.report
        shape = survey.shape
        key = shape.key
        # One instant for the batch's writes: a key's change-log row and its bronze row
        # say the same about when it was ingested.
        now = F.lit(datetime.now(UTC)).cast("timestamp").alias("_ingested_at")
        meta_columns = [c for c in META_COLUMNS if c != "_ingested_at"]
        # Every write carries every column of the shape, the declared ones first and those added
        # since last, after the metadata (Hudi adds a column at the end only; a table declared
        # without columns has them all there); a dropped column is written null.
        fixed, extras = shape.fixed, shape.extras

        main_opts = main_options(self.decl.table(table))
        buckets = main_writer_options(self.decl, table)[NUM_BUCKETS]
        main_meta = meta | {COLUMNS_META: shape.to_meta(), DECLARED_META: self.shapes.declared_meta(table, survey),
                            BUCKETS_META: buckets}

        def save(rows: DataFrame, part: str, name: str, path: str, options: dict[str, str],
                 n: int | None = None) -> None:
            with report.phase(f"{table}.{part}"):
                append(rows, path, bronze_options(part, name, **options), n)

        writes: list[Callable[[], None]] = []
        if to_log := tally.to_log:
            writes.append(functools.partial(save, planned.filter("to_log").select(
                *fixed, *meta_columns, now, F.date_format(now, "yyyy-MM-dd").alias("_ingest_date"), *extras,
            ), "changelog", f"bronze_changelog_{table}", changelog_path(table, self.root),
                meta | keyed_options(key, "changelog"), to_log))
        if tally.to_main:
            if table not in self._born:
                # Main has nothing yet, so nothing known says it holds a key: every row planned
                # for it is an upsert (a delete reaches main only where main holds a row), one
                # per key, and a bulk insert writes exactly what an upsert would.
                main_meta |= hudi_configs.section("bronze", "table_first_commit")
            writes.append(functools.partial(save, planned.filter("to_main").select(
                *fixed, *meta_columns, now, (F.col("_op") == "d").alias(DELETED_FLAG), *extras,
            ), "table", f"bronze_{table}", main_path(table, self.root), main_meta | main_opts))
        return writes

    def _committed(self, batch: _TableBatch, planned: DataFrame, tally: _Tally, known: KnownRows) -> None:
        """Step: what the writer knows after the commits: each table's position, main's rows and deletes, the shape."""
        table, meta, shape = batch.table, batch.meta, batch.survey.shape
        key = shape.key
        if tally.to_log:
            self.ledger.committed(changelog_path(table, self.root), meta)
        if tally.to_main:
            self.ledger.committed(main_path(table, self.root), meta)
            self._born.add(table)
        with batch.report.phase(f"{table}.known"):
            known.add(known_rows(
                key, main=planned.filter("to_main").select(*key, "_lsn", (F.col("_op") != "d").alias("_live")),
                deletes=planned.filter("to_log AND _op = 'd'").select(*key, "_lsn")), tally.known_added)
        self.shapes.keep(table, shape)


@dataclass(frozen=True)
class _TableBatch:
    """One table's part of one batch as `TableWriter.apply` writes it: built once per call, passed to its steps."""

    table: str
    survey: Survey
    meta: dict[str, str]  # every commit's metadata: the batch's id, the stream's position, the registry's version
    report: BatchReport


@dataclass(frozen=True)
class _Tally:
    """The plan's rows counted by where they go (`to_main`, `to_log`) and their op: a handful of rows, collected."""

    rows: list[Row]

    @property
    def to_log(self) -> int:
        return sum(r["count"] for r in self.rows if r["to_log"])

    @property
    def to_main(self) -> bool:
        return any(r["to_main"] for r in self.rows)

    @property
    def known_added(self) -> int:
        """Rows the commits add to what the writer knows: a delete main applies is a row of each part."""
        return sum(r["count"] for r in self.rows if r["to_main"]) \
            + sum(r["count"] for r in self.rows if r["to_log"] and r["_op"] == "d")


def _tally(batch: _TableBatch, planned: DataFrame) -> _Tally:
    """Step: the plan counted, and its outcomes (upserts, deletes, stale events) added to the batch's report."""
    counts = batch.report.counts[batch.table]
    with batch.report.phase(f"{batch.table}.plan"):
        tally = _Tally(planned.groupBy("to_main", "to_log", "_op").count().collect())
    for row in tally.rows:
        outcome = "stale" if not row["to_log"] else "delete" if row["_op"] == "d" else "upsert"
        counts[outcome] = counts.get(outcome, 0) + row["count"]
    return tally
