"""The micro-batch writer: parse, the schema decision, plan, then the change logs, the main tables and
the dead letters, all their commits side by side, with the batch's Kafka position in every commit.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pyspark import SparkContext
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.storagelevel import StorageLevel

import hudi_configs
from pipelines import contract
from pipelines.gdpr.registry import dead_letters_without_erased, read_registry, registry_path, without_erased
from pipelines.gdpr.request import erasure_key
from pipelines.hudi_timeline import latest_completion, repair_torn_timeline
from pipelines.ingest.held_letters import HeldLetters, hold_limits, kafka_range, stored_through
from pipelines.ingest.parse import TableParse, dead_letters, literal_array, parse_topics
from pipelines.ingest.plan import change_rows, newest_per_key, plan, truncate_deletes
from pipelines.ingest.schema import COLUMNS_META, SCHEMA_REASON, Shape, decide, infer_type, read_accepted
from pipelines.ingest.state import (
    BATCH_ID_META,
    DEAD_LETTERS_META,
    DECLARED_META,
    DELETED_FLAG,
    KEY,
    META_COLUMNS,
    POSITIONS_META,
    REGISTRY_META,
    KnownRows,
    discard_unborn,
    has_commits,
    hudi_options,
    ingest_meta,
    known_rows,
    materialized,
    positions_in,
    read_deletes,
    read_state,
    release,
    union_all,
)
from pipelines.settings import changelog_path, dead_letter_path, main_path, unavailable_placeholder

log = logging.getLogger(__name__)


_BATCH_LINE = re.compile(r"batch (\d+): (\d+) records in ([\d.]+)s")


@dataclass
class BatchReport:
    """What a batch did and where its time went (the phases are what tuning starts from)."""

    batch_id: int
    seconds: float = 0.0
    records: int = 0
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    phases: dict[str, float] = field(default_factory=dict)

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
        """The batch id, records, seconds and phases of a logged `line()`; None for any other log line."""
        found = _BATCH_LINE.search(line)
        if not found:
            return None
        timing = line.rsplit("| seconds: ", 1)[1].split() if "| seconds: " in line else []
        return cls(int(found[1]), float(found[3]), int(found[2]),
                   phases={k: float(v) for k, _, v in (item.partition("=") for item in timing)})

    def line(self) -> str:
        parts = [f"{t}: " + " ".join(f"{k}={v}" for k, v in sorted(c.items())) for t, c in self.counts.items()]
        timing = " ".join(f"{k}={v:.1f}" for k, v in self.phases.items())
        return (f"batch {self.batch_id}: {self.records} records in {self.seconds:.1f}s | " + " | ".join(parts)
                + f" | seconds: {timing}")


def run_together(jobs: list[Callable[[], None]], *, parallel: bool = True) -> None:
    """Run `jobs` in threads of their own; when all are done, raise the first failure.

    The change logs, the main tables and the dead letters are independent Hudi tables, and most
    of a commit's time is single-threaded driver work (timeline, metadata table, markers;
    `lakehouse bench commits`): one table's commit path runs while the other's tasks use the
    cores. A crash leaves some of them committed and others not, which the re-run handles table
    by table (each commit records the positions it covers).
    """
    if len(jobs) <= 1 or not parallel:
        for job in jobs:
            job()
        return
    with ThreadPoolExecutor(max_workers=len(jobs), thread_name_prefix="bronze-table") as pool:
        futures = [pool.submit(job) for job in jobs]
    errors = [e for f in futures if (e := f.exception()) is not None]
    if errors:
        raise errors[0]


def _reaches(applied: dict[str, int], ends: dict[str, int]) -> bool:
    """True when the positions `applied` are at or past `ends` in every partition `ends` names."""
    return all(applied.get(tp, 0) >= o for tp, o in ends.items())


class BronzeBatchWriter:
    """The `foreachBatch` function of the ingest stream."""

    def __init__(self, spark: SparkSession, root: str, bootstrap: str, *, parallel: bool = True) -> None:
        self.spark = spark
        self.root = root
        # Where the records are read again that dead letters held back by a killed writer came from.
        self.bootstrap = bootstrap
        # The tables' commits side by side (`run_together`); False only for a benchmark's reference.
        self.parallel = parallel
        self._registry: tuple[DataFrame, str, str] | None = None
        # The stream's position, and each table's, as its newest commit records them (read
        # once, then kept up to date by this writer's own commits).
        self._position: dict[str, int] | None = None
        self._applied: dict[str, dict[str, int]] = {}
        # Dead letters held back from the store (pipelines.ingest.held_letters), the stream's
        # position up to which every dead letter is in the store, and the newest batch committed.
        self._held = HeldLetters(hold_limits())
        self._through: dict[str, int] = {}
        self._last_batch: int | None = None
        self._main_meta: dict[str, dict[str, str]] = {}
        # Main tables with a completed commit; a table without one gets its first batch by bulk insert.
        self._born: set[str] = set()
        self._recovering = False
        # Per table, what main holds and every delete applied: read once, then kept up to date
        # by this writer's own commits (KnownRows).
        self._known: dict[str, KnownRows] = {}
        # Per table, its shape (columns, pipelines.ingest.schema) and the hashes of the declared
        # shapes already applied: read from main's newest commit once, then kept by this writer.
        self._shapes: dict[str, Shape] = {}
        self._declared: dict[str, set[int]] = {}
        self.placeholder = unavailable_placeholder()
        # Only this writer creates these tables (one stream per lake): an unborn one is a crash's.
        for path in [*(f(t, root) for t in contract.TABLES for f in (main_path, changelog_path)),
                     dead_letter_path(root)]:
            discard_unborn(path)
            repair_torn_timeline(path)

    def _start(self) -> None:
        """Where the tables and the dead-letter store stand, from their newest ingest commits (one read each)."""
        mains = [main_path(t, self.root) for t in contract.TABLES]
        logs = [changelog_path(t, self.root) for t in contract.TABLES]
        store = dead_letter_path(self.root)
        newest = {path: ingest_meta(self.spark, path) for path in [*mains, *logs, store]}
        # Main's newest ingest commit also records the table's shape (`_shape`).
        self._main_meta = {t: newest[path] for t, path in zip(contract.TABLES, mains, strict=True)}
        self._born = {t for t, path in zip(contract.TABLES, mains, strict=True) if has_commits(self.spark, path)}
        self._applied = {path: positions_in(meta) for path, meta in newest.items()}
        self._position = {}
        for path in [*mains, store]:
            for tp, o in self._applied[path].items():
                self._position[tp] = max(self._position.get(tp, 0), o)
        self._through = stored_through([newest[p] for p in [*mains, *logs]], newest[store])
        self._last_batch = max((int(newest[p][BATCH_ID_META]) for p in [*mains, store]
                                if BATCH_ID_META in newest[p]), default=None)

    def recover(self) -> None:
        """Before the stream starts: the dead letters a killed writer held back, read again from Kafka and stored.

        The records since the store's position run as one batch under the newest batch id the
        tables record: main and the change log hold them already (nothing to write, by the LSN
        rule), and the store gets the letters it lacks, in one commit.
        """
        self._start()
        assert self._position is not None
        behind = kafka_range(self.spark, self.bootstrap, self._through, self._position)
        if behind is None:
            return
        last = self._last_batch if self._last_batch is not None else 0
        log.warning("dead letters held by a writer that stopped without writing them: reading the records since %s "
                    "again (as batch %d)", json.dumps(self._through, sort_keys=True), last)
        self._recovering = True
        self(behind, last)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        log.info("batch %d: started", batch_id)
        report = BatchReport(batch_id)
        recovering, self._recovering = self._recovering, False
        if self._position is None:
            self._start()
        # The batch's records parsed in one pass and kept while its tables are written, each
        # table's a filter of it; the raw batch is not kept (a wrapped envelope is kilobytes of
        # schema, parsed away here).
        with report.phase("read+parse"):
            every = materialized(parse_topics(batch, {t: TableParse(self._shape(t), tuple(sorted(self._declared[t])))
                                                      for t in contract.TABLES}, self.placeholder))
        parsed = {t: every.filter(F.col("kafka_topic") == contract.topic(t)) for t in contract.TABLES}
        try:
            with report.phase("read+parse"):
                tally = self._tally(every)
            offsets = self._end_offsets(tally)
            report.records = sum(n for *_, n in offsets)
            ends = {f"{t}/{p}": o + 1 for t, p, _, o, _ in offsets}
            starts = {f"{t}/{p}": o for t, p, o, _, _ in offsets}
            position = {tp: max(self._position.get(tp, 0), ends.get(tp, 0)) for tp in {*self._position, *ends}}
            commit_meta = {BATCH_ID_META: str(batch_id), POSITIONS_META: json.dumps(position, sort_keys=True)}
            with report.phase("registry"):
                erased = self._erased()
            if erased:
                commit_meta[REGISTRY_META] = erased[2]
            surveys: dict[str, Survey] = {}
            with report.phase("schema"):
                accepted = read_accepted(self.root)
                for table in contract.TABLES:
                    groups = [g for g in tally if g["kafka_topic"] == contract.topic(table)]
                    surveys[table] = self._survey(table, parsed[table], groups, accepted, batch_id)
                    parsed[table] = surveys[table].events
            jobs: list[Callable[[], None]] = []
            # The surveys counted the dead letters: a batch without any (nearly every batch of a
            # real Debezium source) runs no job for the store, and one with a few holds them back.
            dead = sum(s.kinds.get("dead", 0) for s in surveys.values())
            letters, exact = (self._letters(parsed, batch_id, starts) if dead and
                              not self._covered(dead_letter_path(self.root), ends) else (None, False))
            hold = letters is not None and not recovering and self._held.keep(dead, report.records)
            flush = (letters is not None and not hold) or (bool(self._held.pieces) and (
                recovering or not self._held.keep(0, report.records)))
            # What this batch's commits say of the store holds whatever becomes of its own commit.
            commit_meta[DEAD_LETTERS_META] = json.dumps(
                self._through if letters is not None or self._held.pieces else position, sort_keys=True)
            staged: list[DataFrame] = []
            if flush:
                pieces, count = list(self._held.pieces), self._held.rows
                if letters is not None:
                    pieces.append(letters)
                    count = count + dead if exact else None
                jobs.append(functools.partial(self._write_dead_letters, union_all(pieces), count, commit_meta, report,
                                              erased))
            elif hold:
                jobs.append(lambda: staged.append(materialized(letters)))
            for table, events in parsed.items():
                mine = {tp: o for tp, o in ends.items() if tp.startswith(contract.topic(table) + "/")}
                if mine and all(self._covered(where(table, self.root), mine) for where in (main_path, changelog_path)):
                    report.counts[table] = {"already_applied": sum(n for t, _, _, _, n in offsets
                                                                   if t == contract.topic(table))}
                    continue
                jobs.append(functools.partial(self._apply, table, events, surveys[table], commit_meta, report, erased))
            with report.phase("tables"):
                run_together(jobs, parallel=self.parallel)
            self._position, self._last_batch = position, batch_id
            if staged:
                self._held.add(staged[0], dead if exact else staged[0].count())
                report.counts.setdefault("dead_letters", {})["held"] = self._held.rows
            if not self._held.pieces:
                self._through = position
            for table, survey in surveys.items():
                self._declared[table] |= survey.applied_declared
        finally:
            release(every)
        report.seconds = time.monotonic() - started
        log.info(report.line())

    def _known_rows(self, table: str) -> KnownRows:
        """What main holds and the deletes applied, for `table`."""
        if table not in self._known:
            main = main_path(table, self.root)
            self._known[table] = KnownRows(lambda: known_rows(
                read_state(self.spark, main).withColumn("_live", F.lit(True)),
                read_deletes(self.spark, table, self.root)))
        return self._known[table]

    def _covered(self, path: str, ends: dict[str, int]) -> bool:
        """True when the newest commit of `path` was made at or after these end offsets: a replayed batch."""
        applied = self._applied[path]
        return bool(applied) and _reaches(applied, ends)

    def _log_behind(self, table: str) -> bool:
        """True when main's newest commit covers a position the change log's does not.

        Every batch that commits to main also commits to the change log (what main gets, the
        change log gets), with the same positions, and the two commits run side by side: so this
        is a crash between them, and the batch main holds is missing from the change log.
        """
        return not _reaches(self._applied[changelog_path(table, self.root)],
                            self._applied[main_path(table, self.root)])

    def _committed(self, path: str, meta: dict[str, str]) -> None:
        self._applied[path] = positions_in(meta)

    def _erased(self) -> tuple[DataFrame, str, str] | None:
        """The erasure registry, the key of its pseudonyms and the registry's version; None before any erasure.

        Looked up every batch (an erasure may have added to it), read again only when it changed.
        """
        path = registry_path(self.root)
        version = latest_completion(self.spark, path) if has_commits(self.spark, path) else None
        if version is None:
            return None
        if self._registry is None or self._registry[2] != version:
            self._registry = (read_registry(self.spark, self.root).localCheckpoint(), erasure_key(), version)
        return self._registry

    @staticmethod
    def _tally(every: DataFrame) -> list[Row]:
        """One aggregation of the parsed batch: per Kafka partition, kind and Connect schema (a handful of
        groups), the offsets and what the schema decision needs (`_survey`)."""
        def distinct(column: str) -> Column:
            return F.collect_set(F.when(F.size(column) > 0, F.col(column)))

        # A record of each new Connect schema comes along, whose `after` fields the decision reads.
        return every.groupBy("kafka_topic", "kafka_partition", "kind", "_decl_hash").agg(
            F.min("kafka_offset").alias("first"), F.max("kafka_offset").alias("last"), F.count("*").alias("n"),
            F.first(F.when(F.col("_decl_new"), F.col("value")), ignorenulls=True).alias("sample"),
            distinct("_missing").alias("missing"), distinct("_badcast").alias("badcast"),
            F.array_distinct(F.flatten(F.collect_set("_new_keys"))).alias("new_keys"),
            F.array_distinct(F.flatten(F.collect_set("_toast"))).alias("toast")).collect()

    @staticmethod
    def _end_offsets(tally: list[Row]) -> list[tuple[str, int, int, int, int]]:
        """(topic, partition, first offset, last offset, records) of the batch: what it consumed."""
        found: dict[tuple[str, int], tuple[int, int, int]] = {}
        for g in tally:
            first, last, n = found.get((g["kafka_topic"], g["kafka_partition"]), (g["first"], g["last"], 0))
            found[(g["kafka_topic"], g["kafka_partition"])] = (min(first, g["first"]), max(last, g["last"]), n + g["n"])
        return [(t, p, a, o, n) for (t, p), (a, o, n) in found.items()]

    def _letters(self, parsed: dict[str, DataFrame], batch_id: int, starts: dict[str, int]) -> tuple[DataFrame, bool]:
        """The batch's dead letters that the store lacks, and whether they are all the batch's (the surveys' count).

        The store is written with bulk inserts (no index lookup, whose cost grows with the store):
        what an earlier commit already holds, a batch re-run after a crash, is left out here.
        """
        path = dead_letter_path(self.root)
        rows = union_all([dead_letters(events, batch_id) for events in parsed.values()])
        stored = [(F.col("kafka_topic") == tp.rsplit("/", 1)[0])
                  & (F.col("kafka_partition") == int(tp.rsplit("/", 1)[1])) & (F.col("kafka_offset") < o)
                  for tp, o in self._applied[path].items() if o > starts.get(tp, o)]
        if stored:
            rows = rows.filter(~functools.reduce(lambda a, b: a | b, stored))
        return rows, not stored

    def _write_dead_letters(self, rows: DataFrame, n: int | None, meta: dict[str, str], report: BatchReport,
                            erased: tuple[DataFrame, str, str] | None) -> None:
        """`rows` (`n` of them, None: not counted yet), the held letters among them, into the store in one commit."""
        if erased is not None:  # a malformed record of an erased customer is not kept either
            rows, n = dead_letters_without_erased(rows, *erased[:2]), None
        with report.phase("dead_letters"):
            # Nearly every batch is neither a re-run nor filtered by the registry: its count is the
            # surveys', and its rows are computed once, by the write.
            n = rows.count() if n is None else n
            report.counts.setdefault("dead_letters", {})["written"] = n
            if n:
                path = dead_letter_path(self.root)
                append(rows, path, hudi_options("dead_letters", "bronze_dead_letters", **meta), n)
                self._committed(path, meta)
        # In the store now, whatever becomes of the batch's other commits: not to be written again.
        self._held.clear()

    def flush(self) -> None:
        """Write the dead letters held back (the stream is stopping): the store then holds every one."""
        if not self._held.pieces or self._position is None:
            return
        report = BatchReport(self._last_batch if self._last_batch is not None else -1)
        position = json.dumps(self._position, sort_keys=True)
        meta = {BATCH_ID_META: str(report.batch_id), POSITIONS_META: position, DEAD_LETTERS_META: position}
        self._write_dead_letters(union_all(self._held.pieces), self._held.rows, meta, report, self._erased())
        self._through = dict(self._position)
        log.info("dead letters held back, written as the stream stops: %d", report.counts["dead_letters"]["written"])

    def _shape(self, table: str) -> Shape:
        """The table's columns as its newest ingest commit of main records them (read by `_start`)."""
        if table not in self._shapes:
            meta = self._main_meta[table]
            self._shapes[table] = Shape.from_meta(table, meta.get(COLUMNS_META))
            self._declared[table] = set(json.loads(meta.get(DECLARED_META) or "[]"))
        return self._shapes[table]

    def _survey(self, table: str, events: DataFrame, groups: list[Row], accepted: set[str], batch_id: int) -> Survey:
        """The batch's kinds and shapes for `table`: its new shape, and its events of a shape it cannot apply
        turned into dead letters (reason `schema: ...`). `groups`: the table's rows of the batch's `_tally`;
        the rest runs only when a shape is new."""
        kinds: dict[str, int] = {}
        for g in groups:
            kinds[g["kind"]] = kinds.get(g["kind"], 0) + g["n"]
        row = [g for g in groups if g["kind"] == "row"]
        shape = self._shapes[table]
        survey = Survey(events, kinds, shape)
        if not row:
            return survey

        def union(column: str) -> list:
            return sorted({tuple(v) if isinstance(v, list) else v for g in row for v in g[column]})

        survey.toast = union("toast")
        declared = self._declared_fields(table, {g["_decl_hash"]: g["sample"] for g in row if g["sample"]})
        missing = [list(m) for m in union("missing")]
        badcast = [list(b) for b in union("badcast")]
        new_keys = [k for k in union("new_keys") if not any(k in dict(f) for f in declared.values())]
        if not (declared or missing or badcast or new_keys):
            return survey
        inferred = {k: self._infer(events, k) for k in new_keys}
        decision = decide(shape, list(declared.values()), missing, inferred, accepted, batch_id)
        survey.shape, survey.changed = decision.shape, decision.changed
        held_declared = {h: decision.held_declared[tuple(f)] for h, f in declared.items()
                         if tuple(f) in decision.held_declared}
        survey.applied_declared = set(declared) - set(held_declared)
        holds: list[tuple[Column, str]] = [(F.col("_decl_hash") == h, reason) for h, reason in held_declared.items()]
        holds += [(F.col("_missing") == literal_array(list(m)), reason) for m, reason in decision.held_missing.items()]
        for cast_failed in badcast:
            # (a column this batch widens holds the values now)
            gone = [c for c in cast_failed if f"{table}.{c}" not in accepted
                    and survey.shape.columns[c].type == shape.columns[c].type]
            if gone:
                holds.append((F.col("_badcast") == literal_array(cast_failed),
                              f"{SCHEMA_REASON}{table}.{','.join(gone)}: values that do not fit bronze's type "
                              + ", ".join(shape.columns[c].type for c in gone)))
        if holds:
            is_row = F.col("kind") == "row"
            reason = functools.reduce(lambda acc, h: acc.when(is_row & h[0], F.lit(h[1])),
                                      holds[1:], F.when(is_row & holds[0][0], F.lit(holds[0][1])))
            held = reason.isNotNull()
            survey.events = events.withColumn("reason", F.when(held, reason).otherwise(F.col("reason"))) \
                .withColumn("kind", F.when(held, F.lit("dead")).otherwise(F.col("kind")))
            survey.kinds = {r["kind"]: r["count"] for r in survey.events.groupBy("kind").count().collect()}
            log.warning("bronze/%s held: %s", table, "; ".join(sorted({h[1] for h in holds})))
        if survey.changed:
            log.warning("bronze/%s changes shape: %s", table, ", ".join(
                f"{c.name} {c.type}" for c in survey.shape.columns.values() if shape.columns.get(c.name) != c))
        return survey

    @staticmethod
    def _declared_fields(table: str, samples: dict[int, bytes]) -> dict[int, list[tuple[str, str]]]:
        """Per new Connect schema (by hash), `after`'s declared (field, type) list, read from one of its records."""
        declared = {}
        for digest, value in samples.items():
            schema = json.loads(value).get("schema") or {}
            after = next((f for f in schema.get("fields") or [] if isinstance(f, dict) and f.get("field") == "after"),
                         None)
            if after is None or not isinstance(after.get("fields"), list):
                log.warning("bronze/%s: a Connect schema (hash %s) has no field list for `after`: the columns its "
                            "records add are not typed from it", table, digest)
                continue
            declared[digest] = [(f.get("field"), f.get("type")) for f in after["fields"]]
        return declared

    @staticmethod
    def _infer(events: DataFrame, column: str, sample: int = 200) -> str | None:
        """The type of a column new to the table, from the JSON values of the bare images that carry it."""
        rows = events.filter((F.col("kind") == "row") & F.col("_decl_hash").isNull()
                             & F.col("_image")[column].isNotNull()).select("value").limit(sample).collect()
        values = []
        for r in rows:
            doc = json.loads(r["value"])
            envelope = doc.get("payload", doc) if "schema" in doc else doc
            image = envelope.get("after") or envelope.get("before") or {}
            values.append(image.get(column))
        return infer_type(values)

    def _fill_unavailable(self, newest: DataFrame, changes: DataFrame, table: str, columns: list[str],
                          state: DataFrame) -> DataFrame:
        """Placeholders (an unchanged TOASTed value) replaced by the value the source still holds.

        That value is the one of the newest event before it: among the batch's events of the key
        (a replayed older one does not count when main holds a newer row), else main's row, read
        for the keys that still need one only. `state`: `known_state` of the batch's keys.
        """
        ph = self.placeholder
        def real(c: str) -> Column:  # the LSN of an event carrying a real value of `c` (null is one)
            return F.when(~F.col(c).eqNullSafe(ph), F.col("_lsn"))

        known = changes.filter(F.col("_op") != "d").groupBy(KEY).agg(*[
            agg for c in columns for agg in (F.max_by(F.col(c), real(c)).alias(f"_batch_{c}"),
                                             F.max(real(c)).alias(f"_found_{c}"))])
        stored_lsn = F.coalesce(F.col("_m_lsn"), F.lit(-1))

        def need(c: str) -> Column:
            return F.col(c).eqNullSafe(ph) & F.coalesce(F.col(f"_found_{c}") < stored_lsn, F.lit(True))

        filled = newest.join(known, KEY, "left").join(state.select(KEY, "_m_lsn"), KEY, "left").select(*[
            F.when(F.col(c) == ph, F.col(f"_batch_{c}")).otherwise(F.col(c)).alias(c) if c in columns else F.col(c)
            for c in newest.columns], *[need(c).alias(f"_need_{c}") for c in columns])
        need = functools.reduce(lambda a, b: a | b, [F.col(f"_need_{c}") for c in columns]) & (F.col("_op") != "d")
        main = main_path(table, self.root)
        stored_columns = [c for c in columns if c in self._shapes[table].columns]
        if has_commits(self.spark, main) and stored_columns:
            keys = filled.filter(need).select(KEY).distinct()
            stored = self.spark.read.format("hudi").options(**hudi_configs.section("bronze", "unavailable_read")) \
                .load(main).join(F.broadcast(keys), KEY, "left_semi") \
                .select(KEY, *[F.col(c).alias(f"_stored_{c}") for c in stored_columns])
            filled = filled.join(stored, KEY, "left")
        return filled.select(*[
            F.when(F.col(f"_need_{c}"), F.col(f"_stored_{c}") if c in stored_columns else F.lit(None).cast("string"))
            .otherwise(F.col(c)).alias(c) if c in columns else F.col(c) for c in newest.columns])

    def _apply(self, table: str, events: DataFrame, survey: Survey, meta: dict[str, str], report: BatchReport,
               erased: tuple[DataFrame, str, str] | None) -> None:
        counts = report.counts.setdefault(table, {})
        kinds = survey.kinds
        for kind in ("tombstone", "ignored", "truncate", "dead"):
            if kinds.get(kind):
                counts[kind] = kinds[kind]
        if not kinds.get("row") and not kinds.get("truncate"):
            return
        shape = survey.shape
        main = main_path(table, self.root)
        known = self._known_rows(table)
        if not known.loaded:  # the stream's first batch of this table: one read of the tables
            with report.phase(f"{table}.load_state"):
                known.load()
        changes = change_rows(events, table, shape)
        if erased is not None:  # events of erased customers and their orders never reach the lake again
            changes = without_erased(changes, table, *erased[:2])
        # A truncate deletes every key the table holds: the one plan that needs them all.
        synthetic = truncate_deletes(events, known.main(), shape) if kinds.get("truncate") else None
        if synthetic is not None:
            changes = changes.unionByName(synthetic)
        newest = newest_per_key(changes)
        if survey.toast:
            newest = self._fill_unavailable(newest, changes, table, [c for c in survey.toast if c in shape.columns],
                                            known.lookup(newest.select(KEY)))
        newest = newest.persist(StorageLevel.MEMORY_AND_DISK)
        keys = newest.select(KEY)
        relog = self._log_behind(table)
        if relog:
            log.warning("bronze/%s: main holds a batch its change log lacks (a crash between their commits): "
                        "that batch's changes are logged again from main's rows", table)
        try:
            with report.phase(f"{table}.plan"):
                planned = materialized(plan(newest, known.lookup(keys), relog=relog))
        finally:
            newest.unpersist()
        try:
            with report.phase(f"{table}.plan"):
                tally = planned.groupBy("to_main", "to_log", "_op").count().collect()
            for r in tally:
                outcome = "stale" if not r["to_log"] else "delete" if r["_op"] == "d" else "upsert"
                counts[outcome] = counts.get(outcome, 0) + r["count"]
            # One instant for the batch's writes: a key's change-log row and its bronze row
            # say the same about when it was ingested.
            now = F.lit(datetime.now(UTC)).cast("timestamp").alias("_ingested_at")
            meta_columns = [c for c in META_COLUMNS if c != "_ingested_at"]
            # Every write carries every column of the shape, the contract's first and those added
            # since last (Hudi adds a column at the end only); a dropped column is written null.
            contract_columns, extras = list(contract.COLUMNS[table]), shape.extras
            main_meta = meta | {COLUMNS_META: shape.to_meta(),
                                DECLARED_META: json.dumps(sorted(self._declared[table] | survey.applied_declared))}

            def save(rows: DataFrame, part: str, name: str, path: str, options: dict[str, str],
                     n: int | None = None) -> None:
                with report.phase(f"{table}.{part}"):
                    append(rows, path, hudi_options(part, name, **options), n)

            writes: list[Callable[[], None]] = []
            if to_log := sum(r["count"] for r in tally if r["to_log"]):
                writes.append(functools.partial(save, planned.filter("to_log").select(
                    *contract_columns, *meta_columns, now,
                    F.date_format(now, "yyyy-MM-dd").alias("_ingest_date"), *extras,
                ), "changelog", f"bronze_changelog_{table}", changelog_path(table, self.root), meta, to_log))
            if to_main := any(r["to_main"] for r in tally):
                if table not in self._born:
                    # Main has nothing yet, so nothing known says it holds a key: every row planned
                    # for it is an upsert (a delete reaches main only where main holds a row), one
                    # per key, and a bulk insert writes exactly what an upsert would.
                    main_meta |= hudi_configs.section("bronze", "table_first_commit")
                writes.append(functools.partial(save, planned.filter("to_main").select(
                    *contract_columns, *meta_columns, now, (F.col("_op") == "d").alias(DELETED_FLAG), *extras,
                ), "table", f"bronze_{table}", main, main_meta))
            # Side by side: main's commit, which makes the changes visible, no longer waits for the
            # change log's. A crash between them is re-planned from main's rows (`relog`), except
            # a truncate's: its deletes name keys that only main's rows before it know, so there
            # the change log commits first, as a write-ahead log.
            run_together(writes, parallel=self.parallel and synthetic is None)
            if to_log:
                self._committed(changelog_path(table, self.root), meta)
            if to_main:
                self._committed(main, meta)
                self._born.add(table)
            with report.phase(f"{table}.known"):
                known.add(known_rows(
                    main=planned.filter("to_main").select(KEY, "_lsn", (F.col("_op") != "d").alias("_live")),
                    deletes=planned.filter("to_log AND _op = 'd'").select(KEY, "_lsn")),
                    # A delete main applies is a row of each part.
                    sum(r["count"] for r in tally if r["to_main"])
                    + sum(r["count"] for r in tally if r["to_log"] and r["_op"] == "d"))
            self._shapes[table] = shape
        finally:
            release(planned)


# Rows per file of a bulk insert (change log, dead letters): a streaming batch's rows make one file.
ROWS_PER_FILE = 100_000


def in_files(rows: DataFrame, n: int, options: dict[str, str]) -> DataFrame:
    """`rows` (`n` of them) in as many Spark partitions as a bulk insert of them should write files.

    Hudi 1.0.2's row writer, in sort mode NONE, writes a file per non-empty partition of its input,
    whatever `hoodie.bulkinsert.shuffle.parallelism` says (the datasource does not enforce it): a
    change log of 4 shuffle partitions got 4 files per commit, the dead-letter store 6 (one per
    Kafka partition). One file per ROWS_PER_FILE rows, at most that parallelism; no shuffle.
    """
    files = min(int(options.get("hoodie.bulkinsert.shuffle.parallelism", "1")), -(-n // ROWS_PER_FILE))
    return rows.coalesce(max(1, files))


def append(rows: DataFrame, path: str, options: dict[str, str], n: int | None = None) -> None:
    """One Hudi commit of `rows` at `path`; a bulk insert of `n` rows in as few files as `in_files` says."""
    if n is not None:
        rows = in_files(rows, n, options)
    rows.write.format("hudi").options(**options).mode("append").save(path)


@dataclass
class Survey:
    """One table's part of a batch after the schema decision (`BronzeBatchWriter._survey`)."""

    events: DataFrame  # held events turned into dead letters
    kinds: dict[str, int]
    shape: Shape
    changed: bool = False
    toast: list[str] = field(default_factory=list)  # columns carrying the unavailable-value placeholder
    applied_declared: set[int] = field(default_factory=set)  # hashes of the declared shapes applied
