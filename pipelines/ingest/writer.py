"""The micro-batch writer: parse, the schema decision, plan, then the change logs, the main tables and
the dead letters, all their commits side by side, with the batch's Kafka position in every commit.

Each job has a part of its own, which the batch flow (`BronzeBatchWriter`) composes: the schema survey
(`survey`), the tables' writes (`tables`), the dead-letter writer (`dead_letter_writer`), the position
ledger (`positions`) and the erasure registry (`erasures`).
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.declaration import declared
from pipelines.hudi_timeline import repair_torn_timeline
from pipelines.ingest.batch import BatchReport, run_together
from pipelines.ingest.dead_letter_writer import DeadLetterWriter
from pipelines.ingest.erasures import ErasureRegistry
from pipelines.ingest.held_letters import kafka_range
from pipelines.ingest.parse import parse_topics
from pipelines.ingest.positions import PositionLedger, end_offsets
from pipelines.ingest.state import (
    BATCH_ID_META,
    POSITIONS_META,
    REGISTRY_META,
    discard_unborn,
    ingest_meta,
    materialized,
    release,
)
from pipelines.ingest.survey import SchemaSurvey, tally
from pipelines.ingest.tables import TableWriter
from pipelines.settings import changelog_path, dead_letter_path, main_path, unavailable_placeholder

log = logging.getLogger(__name__)


class BronzeBatchWriter:
    """The `foreachBatch` function of the ingest stream."""

    def __init__(self, spark: SparkSession, root: str, bootstrap: str, *, parallel: bool = True) -> None:
        self.spark = spark
        self.root = root
        # Where the records are read again that dead letters held back by a killed writer came from.
        self.bootstrap = bootstrap
        # The tables' commits side by side (`run_together`); False only for a benchmark's reference.
        self.parallel = parallel
        self.placeholder = unavailable_placeholder()
        self.positions = PositionLedger(root)
        self.schema = SchemaSurvey(root)
        self.registry = ErasureRegistry(spark, root)
        self.dead_letters = DeadLetterWriter(root, self.positions)
        self.tables = TableWriter(spark, root, self.positions, self.schema, self.placeholder)
        self._recovering = False
        # Only this writer creates these tables (one stream per lake): an unborn one is a crash's.
        for path in [*(f(t, root) for t in declared().names for f in (main_path, changelog_path)),
                     dead_letter_path(root)]:
            discard_unborn(path)
            repair_torn_timeline(path)

    def _start(self) -> None:
        """Where the tables and the dead-letter store stand, from their newest ingest commits (one read each)."""
        mains = [main_path(t, self.root) for t in declared().names]
        logs = [changelog_path(t, self.root) for t in declared().names]
        newest = {path: ingest_meta(self.spark, path) for path in [*mains, *logs, dead_letter_path(self.root)]}
        # Main's newest ingest commit also records the table's shape.
        self.schema.start({t: newest[path] for t, path in zip(declared().names, mains, strict=True)})
        self.tables.start()
        self.positions.start(newest)

    def recover(self) -> None:
        """Before the stream starts: the dead letters a killed writer held back, read again from Kafka and stored.

        The records since the store's position run as one batch under the newest batch id the
        tables record: main and the change log hold them already (nothing to write, by the LSN
        rule), and the store gets the letters it lacks, in one commit.
        """
        self._start()
        ledger = self.positions
        assert ledger.position is not None
        behind = kafka_range(self.spark, self.bootstrap, ledger.through, ledger.position)
        if behind is None:
            return
        last = ledger.last_batch if ledger.last_batch is not None else 0
        log.warning("dead letters held by a writer that stopped without writing them: reading the records since %s "
                    "again (as batch %d)", json.dumps(ledger.through, sort_keys=True), last)
        self._recovering = True
        self(behind, last)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        log.info("batch %d: started", batch_id)
        report = BatchReport(batch_id)
        recovering, self._recovering = self._recovering, False
        if not self.positions.started:
            self._start()
        # The batch's records parsed in one pass and kept while its tables are written, each
        # table's a filter of it; the raw batch is not kept (a wrapped envelope is kilobytes of
        # schema, parsed away here).
        with report.phase("read+parse"):
            every = materialized(parse_topics(batch, self.schema.parses(), self.placeholder))
        parsed = {t: every.filter(F.col("kafka_topic") == declared().topic(t)) for t in declared().names}
        try:
            with report.phase("read+parse"):
                groups = tally(every)
            offsets = end_offsets(groups)
            report.records = sum(n for *_, n in offsets)
            ends = {f"{t}/{p}": o + 1 for t, p, _, o, _ in offsets}
            starts = {f"{t}/{p}": o for t, p, o, _, _ in offsets}
            position = self.positions.after(ends)
            commit_meta = {BATCH_ID_META: str(batch_id), POSITIONS_META: json.dumps(position, sort_keys=True)}
            with report.phase("registry"):
                erased = self.registry.erased()
            if erased:
                commit_meta[REGISTRY_META] = erased.version
            with report.phase("schema"):
                surveys = self.schema.survey_batch(parsed, groups, batch_id)
            parsed = {t: survey.events for t, survey in surveys.items()}
            # The surveys counted the dead letters.
            dead = sum(s.kinds.get("dead", 0) for s in surveys.values())
            store = self.dead_letters.stage(parsed, dead, batch_id, starts, ends, position, recovering=recovering,
                                            meta=commit_meta, report=report, erased=erased)
            jobs: list[Callable[[], None]] = [store.job] if store.job is not None else []
            for table, events in parsed.items():
                mine = {tp: o for tp, o in ends.items() if tp.startswith(declared().topic(table) + "/")}
                if mine and all(self.positions.covered(where(table, self.root), mine)
                                for where in (main_path, changelog_path)):
                    report.counts[table] = {"already_applied": sum(n for t, _, _, _, n in offsets
                                                                   if t == declared().topic(table))}
                    continue
                jobs.append(functools.partial(self.tables.apply, table, events, surveys[table], commit_meta, report,
                                              erased, parallel=self.parallel))
            with report.phase("tables"):
                run_together(jobs, parallel=self.parallel)
            self.positions.advance(position, batch_id)
            self.dead_letters.settle(store, position, report)
            self.schema.keep_declared(surveys)
        finally:
            release(every)
        report.seconds = time.monotonic() - started
        log.info(report.line())

    def flush(self) -> None:
        """Write the dead letters held back (the stream is stopping): the store then holds every one."""
        if not self.dead_letters.holding or not self.positions.started:
            return
        self.dead_letters.flush(self.registry.erased())
