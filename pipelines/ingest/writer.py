"""The micro-batch writer: parse, the schema decision, which tables are due (`cadence`), plan, then the due
tables' change logs and main tables and the dead letters, their commits side by side, with the batch's
Kafka position in every commit.

Each job has a part of its own, which the batch flow (`BronzeBatchWriter`) composes: the schema survey
(`survey`), the tables' writes (`tables`), the dead-letter writer (`dead_letter_writer`), the position
ledger (`positions`) and the erasure registry (`erasures`).
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from pyspark.sql import DataFrame, Row
from pyspark.sql import functions as F

from pipelines.ingest.batch import BatchReport, BatchSpan, TableRead, run_together
from pipelines.ingest.cadence import BatchRecords, Cadence
from pipelines.ingest.dead_letter_writer import DeadLetterWriter
from pipelines.ingest.erasures import Erased, ErasureRegistry
from pipelines.ingest.exporter import StreamExporter
from pipelines.ingest.held_letters import EARLIEST
from pipelines.ingest.parse import parse_topics
from pipelines.ingest.positions import PositionLedger, end_offsets
from pipelines.ingest.state import discard_unborn, ingest_meta
from pipelines.ingest.survey import SchemaSurvey, Survey, tally
from pipelines.ingest.tables import TableWriter
from pipelines.lake.buckets import check_buckets
from pipelines.lake.catalog import main_writer_options
from pipelines.lake.frames import materialized
from pipelines.lake.layout import (
    BATCH_ID_META,
    BUCKETS_META,
    DEAD_LETTERS_META,
    POSITIONS_META,
    REGISTRY_META,
    changelog_path,
    dead_letter_path,
    main_path,
)
from pipelines.lake.timeline_repair import repair_torn_timeline
from pipelines.runtime.lake import Lake
from pipelines.runtime.settings import unavailable_placeholder

log = logging.getLogger(__name__)

# Tables whose newest commits a starting stream reads at once: reading a timeline is mostly waiting
# on the file system and the JVM's metadata client, not a core's work.
START_READERS = 8


class BronzeBatchWriter:
    """The `foreachBatch` function of the ingest stream: one query's, on `lake` under the declaration it runs with.

    `lake.declaration` is kept for the writer's life, its batches and the stream's threads alike (`decl`): a
    query reads one set of topics, and the stream moves to a changed declaration with a new query and a new
    writer (pipelines.ingest.bronze).
    """

    def __init__(self, lake: Lake, *, trigger_seconds: float, eager: bool, parallel: bool = True,
                 exporter: StreamExporter | None = None) -> None:
        self.lake = lake
        self.spark = spark = lake.spark
        self.root = root = lake.root
        self.decl = decl = lake.declaration
        # Each batch's report, and each commit's between batches, to Prometheus (None: the stream exports nothing).
        self.exporter = exporter
        # The tables' commits side by side (`run_together`); False only for a benchmark's reference.
        self.parallel = parallel
        self.placeholder = unavailable_placeholder()
        self.positions = PositionLedger(root, decl)
        self.schema = SchemaSurvey(root, decl)
        self.registry = ErasureRegistry(lake)
        self.dead_letters = DeadLetterWriter(root, self.positions)
        self.tables = TableWriter(spark, root, decl, self.positions, self.schema, self.placeholder)
        # Which tables a batch commits (every table with changes when `eager`: `ingest --once`).
        self.cadence = Cadence(decl, trigger_seconds, eager=eager)
        # Spark numbers a query's batches from 0, and every query starts afresh from the tables'
        # positions (`start`): the batch ids the commits record go on from the newest one there.
        self.first_batch = 0
        self._cut: int | None = None  # a batch that started and did not end (it failed, or was stopped)
        # What the last failed batch raised: the query's own failure carries only its text across py4j, this keeps
        # its Java throwable, by which the stream tells a failure Kafka caused (`kafka_failures.kafka_caused`).
        self.failure: Exception | None = None
        # One batch or between-batch commit at a time (Spark's batch thread, the stream's own thread).
        self._lock = threading.Lock()
        # Only this writer creates these tables (one stream per lake): an unborn one is a crash's.
        paths = [*(f(t, root) for t in decl.names for f in (main_path, changelog_path)), dead_letter_path(root)]
        with ThreadPoolExecutor(max_workers=START_READERS, thread_name_prefix="bronze-start") as pool:
            list(pool.map(_readable, paths))

    def start(self) -> dict[str, int]:
        """Where the tables and the dead-letter store stand, from their newest ingest commits (one read each, side by
        side): the position to read each topic partition from, {"topic/partition": offset}.

        A table's topic is read from the oldest of its main table's and its change log's positions
        (they differ only after a crash between their side-by-side commits: the batch main holds is
        read, and logged, again: `positions.PositionLedger.log_behind`), and from no later than where
        the dead-letter store holds every letter (letters a killed writer held back are read again).
        Everything a table has not committed, its waiting changes included, is read again.
        """
        mains = [main_path(t, self.root) for t in self.decl.names]
        logs = [changelog_path(t, self.root) for t in self.decl.names]
        paths = [*mains, *logs, dead_letter_path(self.root)]
        with ThreadPoolExecutor(max_workers=START_READERS, thread_name_prefix="bronze-start") as pool:
            newest = dict(zip(paths, pool.map(functools.partial(ingest_meta, self.spark), paths), strict=True))
        # Main's newest ingest commit also records the table's shape, and the bucket count its keys were hashed with.
        self.schema.start({t: newest[path] for t, path in zip(self.decl.names, mains, strict=True)})
        for t, path in zip(self.decl.names, mains, strict=True):
            check_buckets(f"bronze/{t}", path, main_writer_options(self.decl, t), newest[path].get(BUCKETS_META))
        self.tables.start()
        ledger = self.positions
        ledger.start(newest)
        self.first_batch = 0 if ledger.last_batch is None else ledger.last_batch + 1
        start: dict[str, int] = {}
        for table in self.decl.names:
            # A commit records the stream's position in every topic: a table's own topic is the one it speaks for.
            mine = self.decl.topic(table) + "/"
            applied = [ledger.applied[where(table, self.root)] for where in (main_path, changelog_path)]
            for tp in {tp for a in applied for tp in a if tp.startswith(mine)}:
                start[tp] = min(a.get(tp, EARLIEST) for a in applied)
        if behind := {tp: o for tp, o in ledger.through.items() if o < start.get(tp, o)}:
            log.warning("dead letters held by a writer that stopped without writing them: reading the records "
                        "since %s again", json.dumps(behind, sort_keys=True))
            start |= behind
        return start

    def __call__(self, batch: DataFrame, query_batch: int) -> None:
        with self._lock:
            try:
                self._batch(batch, query_batch)
            except Exception as exc:
                self.failure = exc
                raise

    def _batch(self, batch: DataFrame, query_batch: int) -> None:
        started = time.monotonic()
        batch_id = self.first_batch + query_batch
        log.info("batch %d: started", batch_id)
        self._cut = batch_id
        report = BatchReport(batch_id)
        # The batch's records parsed in one pass and kept while its tables are written, and after
        # that while a table still holds changes among them (`cadence`), each table's a filter of it;
        # the raw batch is not kept (a wrapped envelope is kilobytes of schema, parsed away here).
        with report.phase("read+parse"):
            every = self._parse(batch)
        records = BatchRecords(every)
        parsed = {t: every.filter(F.col("kafka_topic") == self.decl.topic(t)) for t in self.decl.names}
        try:
            with report.phase("read+parse"):
                groups = tally(every)
            span = self._span(batch_id, groups, report)
            commit_meta = {BATCH_ID_META: str(batch_id), POSITIONS_META: json.dumps(span.position, sort_keys=True)}
            with report.phase("registry"):
                erased = self.registry.erased()
            if erased:
                commit_meta[REGISTRY_META] = erased.version
            with report.phase("schema"):
                surveys = self.schema.survey_batch(parsed, groups, batch_id)
            parsed = {t: survey.events for t, survey in surveys.items()}
            # The surveys counted the dead letters.
            dead = sum(s.kinds.get("dead", 0) for s in surveys.values())
            store = self.dead_letters.stage(parsed, dead, span, meta=commit_meta, report=report, erased=erased)
            self._hold(surveys, groups, span, records, report)
            jobs: list[Callable[[], None]] = [store.job] if store.job is not None else []
            self._commit(self.cadence.due(), jobs, commit_meta, report, erased)
            for table, waiting in self.cadence.waiting.items():
                report.counts[table] = {"waiting": waiting.changes}
            self.positions.advance(span.position, batch_id)
            self.dead_letters.settle(store, span.position, report)
            self.schema.keep_declared(surveys)
        finally:
            if records.holders == 0:
                records.release()
        report.seconds = time.monotonic() - started
        self.cadence.batch_done(report.seconds)
        self._cut = None
        log.info(report.line())
        if self.exporter is not None:
            self.exporter.batch(report)

    def _span(self, batch_id: int, groups: list[Row], report: BatchReport) -> BatchSpan:
        """Step: where the batch stands in Kafka, from its tally (`groups`); the report counts its records."""
        offsets = end_offsets(groups)
        report.records = sum(n for *_, n in offsets)
        ends = {f"{t}/{p}": o + 1 for t, p, _, o, _ in offsets}
        starts = {f"{t}/{p}": o for t, p, o, _, _ in offsets}
        return BatchSpan(batch_id, starts, ends, self.positions.after(ends))

    def _hold(self, surveys: dict[str, Survey], groups: list[Row], span: BatchSpan, records: BatchRecords,
              report: BatchReport) -> None:
        """Step: each table's part of the batch handed to the cadence, which commits it when due; a part already
        applied, or with nothing to commit, is only counted."""
        for table, survey in surveys.items():
            topic = self.decl.topic(table)
            mine = [g for g in groups if g["kafka_topic"] == topic]
            if not mine:
                continue
            report.read[table] = TableRead(sum(g["n"] for g in mine), sum(g["bytes"] or 0 for g in mine),
                                           survey.kinds.get("dead", 0))
            spans = {tp: o for tp, o in span.ends.items() if tp.startswith(topic + "/")}
            if all(self.positions.covered(where(table, self.root), spans) for where in (main_path, changelog_path)):
                report.counts[table] = {"already_applied": sum(g["n"] for g in mine)}
                continue
            changes = sum(g["n"] for g in mine if g["kind"] in ("row", "truncate"))
            if changes or table in self.cadence.waiting:
                oldest = min((g["oldest"] for g in mine if g["kind"] in ("row", "truncate")), default=None)
                self.cadence.hold(table, survey, records, changes, oldest.timestamp() if oldest is not None else None)
            else:  # tombstones, logical messages, dead letters: nothing for the table to commit
                report.counts[table] = {k: n for k, n in survey.kinds.items() if n}

    def _parse(self, batch: DataFrame) -> DataFrame:
        """The batch's records read, decoded and classified in one pass, by each topic's table (`parse.parse_topics`),
        materialized. One expression serves every declared table: an idle one costs its entry in a lookup."""
        # As many partitions as the cores: the batch has one per Kafka partition (150 at 50 tables of
        # 3), and every later job over it would run that many tasks.
        cores = self.spark.sparkContext.defaultParallelism
        return materialized(parse_topics(batch, self.schema.parses(), self.decl, self.placeholder).coalesce(cores))

    def _commit(self, tables: list[str], jobs: list[Callable[[], None]], meta: dict[str, str], report: BatchReport,
                erased: Erased | None, *, budget: bool = True) -> None:
        """The waiting changes of `tables` into their change logs and main tables, beside `jobs`; each commit
        with `meta`, `cadence.limits.parallel_tables` tables at once, within the batch's time `budget`."""
        quiet = self.cadence.quiet_budget(self.cadence.limits.budget_seconds if budget else float("inf"))
        done: list[str] = []

        def commit(table: str) -> None:
            if not quiet.allows(table):
                return  # it waits for the next batch (the budget: `cadence`)
            survey = self.cadence.waiting[table].survey()
            self.tables.apply(table, survey, meta, report, erased, parallel=self.parallel)
            done.append(table)

        # Started in the order `due` gives (urgent, then the oldest waiting), `parallel_tables` at once.
        jobs += [functools.partial(commit, table) for table in tables]
        with report.phase("tables"):
            run_together(jobs, parallel=self.parallel, at_most=self.cadence.limits.parallel_tables)
        for table in done:
            self.cadence.committed(table)

    def flush(self) -> None:
        """The stream is stopping: every table's waiting changes, and the dead letters held back, are written."""
        with self._lock:
            if not self.positions.started:
                return
            erased = self.registry.erased()
            if self._cut is not None:
                # What the batch left waiting is not known to be whole: the next stream reads it again.
                log.warning("batch %d did not end: the tables' waiting changes are left to the next stream (%s)",
                            self._cut, ", ".join(sorted(self.cadence.waiting)) or "none")
            elif self.cadence.waiting:
                self._commit_between(list(self.cadence.waiting), erased, "written as the stream stops", budget=False)
            if self.dead_letters.holding:
                self.dead_letters.flush(erased)

    def commit_due(self) -> None:
        """Between batches: the tables whose waiting changes have come due. Structured Streaming runs no batch
        while no record arrives, and a quiet table's changes would otherwise wait for the next record."""
        if not self._lock.acquire(blocking=False):
            return  # a batch runs: it commits what is due
        try:
            if self._cut is None and self.positions.started and (due := self.cadence.due()):
                self._commit_between(due, self.registry.erased(), "due between batches")
        finally:
            self._lock.release()

    def _commit_between(self, tables: list[str], erased: Erased | None, why: str, *, budget: bool = True) -> None:
        """`tables`' waiting changes committed outside a batch, with the position and id of the newest batch."""
        ledger = self.positions
        assert ledger.position is not None and ledger.last_batch is not None
        report = BatchReport(ledger.last_batch)
        meta = {BATCH_ID_META: str(ledger.last_batch), POSITIONS_META: json.dumps(ledger.position, sort_keys=True),
                DEAD_LETTERS_META: json.dumps(ledger.through, sort_keys=True)}
        if erased:
            meta[REGISTRY_META] = erased.version
        started = time.monotonic()
        self._cut = ledger.last_batch  # an interrupt in these commits leaves what waited to the next stream
        self._commit(tables, [], meta, report, erased, budget=budget)
        self._cut = None
        report.seconds = time.monotonic() - started
        log.info("the waiting changes, %s: %s", why, report.line())
        if self.exporter is not None:
            self.exporter.batch(report, between=True)

    def freshness(self) -> dict[str, dict[str, float | int | None]]:
        """Per declared table, its target and what waits (the heartbeat's)."""
        return self.cadence.freshness()


def _readable(path: str) -> None:
    discard_unborn(path)
    repair_torn_timeline(path)
