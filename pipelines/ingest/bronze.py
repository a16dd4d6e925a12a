"""Bronze: Debezium change events from Kafka into Hudi MERGE_ON_READ tables.

Per source table:

- `bronze/<table>` (MOR): the live rows, one per primary key, as of the newest applied LSN.
- `bronze/_changelog/<table>` (COW, append-only): every change the job applied, one row per
  key and batch, upserts and deletes alike. It is what incremental readers (silver,
  `lakehouse changes`) read: a commit adds new files only, so reading a window opens that
  window's files, where an incremental query of the merge-on-read main table merges whole
  file slices. It is also the job's write-ahead log and, for the days it retains, its
  memory of deletes.
- `bronze/_deletes/<table>` (COW), the *delete ledger*: the newest delete per key of the
  change-log days that table services expired. A hard delete makes Hudi forget a key, and
  with it the LSN it was deleted at; without that memory an older insert replayed after a
  connector restart would bring the row back. The ledger is written only when days expire
  (`pipelines.services.table_services`), never by a batch.

and `bronze/_dead_letters` (COW) for all: every Kafka record that is not a usable
envelope, with the reason, the raw key and value and its Kafka position, keyed by that
position.

A table's changes are committed when they are due by its freshness target (`freshness_seconds` in
the declaration), or at once when the table is busy (`cadence`): a batch commits the tables that are
due, and a table with nothing due costs it nothing. A commit of a table makes two commits (change log
and main), side by side, and up to four tables commit side by side (`batch.run_together`). Its
malformed records are held back and reach the dead-letter store in one commit every minute or so,
and when the stream stops (`held_letters`): a source that sends a malformed record now and then
does not add a commit to every batch.

Ordering and exactly-once come from one rule (`plan`): per key, keep the newest event of the batch
(highest `source.lsn`), then apply it only if it is newer than everything applied for the key, live
row or delete (main's row, the change log's deletes, the ledger). What main gets, the change log
gets too, with the same Kafka positions in both commits; Hudi's own ordering on `_lsn` in main is a
second line of defence. Every write is computed from what the tables hold, so a batch re-run after a
crash at any point writes exactly what is still missing, and a replay of old events changes nothing.
A crash between the two commits leaves one of two states: the change log holds the batch and main
does not (the re-run applies it to main, and appends the same changes to the change log again, which
readers fold away by LSN), or main holds it and the change log does not, which shows as main's
position ahead of the change log's: the re-run then logs again what main holds at exactly the
batch's LSNs (`plan`'s `relog`). A truncate is the exception: its deletes name keys only main's
earlier rows know, so its change log commits first.

What the tables hold is read once per stream, at its first batch (main's `(id, _lsn)`,
the change log's deletes, the ledger), and then kept up to date by the writer's own
commits (`state.KnownRows`): a batch looks up its own keys in those cached rows and reads no
table, so its cost follows the batch, not the table. A restarted process reads afresh,
which is what makes a crash between two commits safe.

Shape: a row image is parsed as a map (column -> JSON text), and the table's columns follow the
source's (pipelines.ingest.schema): per batch, one aggregation over the cached records finds shapes
not seen before; a column added in the source is appended to the table (Hudi's schema evolution on
write), a widened type widens it, a dropped one stays null, and events of a shape that cannot be
applied (a contract column gone, a type narrowed) become dead letters with a `schema:` reason,
holding only that table. An update's placeholder for an unchanged TOASTed value is replaced by
the value the source still holds (`tables.TableWriter`).

Progress lives in the tables' own commits, and only there: each carries the stream's Kafka position
after its batch (`_lakehouse.kafka_positions`). A replayed batch that main and the change log already
cover is skipped without reading anything, and every stream starts each topic from the older of the
positions in its main table's and its change log's newest commits (`starting_offsets`), not from a
Spark checkpoint, which would skip what a table let wait in a killed process. A position Kafka no longer
holds (retention deleted records the stream had not read, or the topic was recreated) stops the stream
before its query starts, naming every lost range (`lost`): nothing is skipped silently.

Where each part lives: `parse` classifies the Kafka records, `survey` finds their shapes, `plan`
decides what each key still needs, `state` knows what the tables hold, `tables` writes a table's change
log and main, `dead_letter_writer` the dead letters, `positions` keeps where the stream and each table
stand, `lost` finds the records Kafka deleted before they were read, `kafka_failures` tells a failure Kafka
caused from any other, `writer` is the micro-batch that composes them (`BronzeBatchWriter`), and this
module runs the stream (`run_ingest`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from pyspark.errors import StreamingQueryException
from pyspark.sql.streaming import StreamingQuery

from pipelines.errors import DeclarationError, KafkaUnavailable
from pipelines.ingest import lost
from pipelines.ingest.compactor import Compactor, compactions_run_here
from pipelines.ingest.exporter import StreamExporter, spark_metrics_conf
from pipelines.ingest.kafka_failures import kafka_caused
from pipelines.ingest.stream import STOP_REQUEST, KafkaWait, StreamLease, kafka_wait
from pipelines.ingest.topics import Subscription, kafka_stream, starting_offsets
from pipelines.ingest.writer import BronzeBatchWriter
from pipelines.lake import storage
from pipelines.lake.declaration import Declaration, load
from pipelines.lake.layout import ingest_checkpoint_path
from pipelines.monitoring import metric_names, pushgateway
from pipelines.monitoring.pushgateway import JobMetrics
from pipelines.runtime import console
from pipelines.runtime.config import KafkaSettings
from pipelines.runtime.kafka_clients import at, probe_tls
from pipelines.runtime.lake import Lake
from pipelines.runtime.local_process import kafka_unanswered
from pipelines.runtime.settings import INGEST_TRIGGER_SECONDS

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IngestOptions:
    """How the ingest stream runs, beside where (root, Kafka) and on what (Spark): built once by its caller.

    `trigger_seconds`: the micro-batch interval of a stream that runs on. `max_offsets_per_trigger`: a cap on the
    Kafka records of one batch (None: bronze.toml's). `stop_timeout`: how long an interrupt or a stop request lets
    the batch in progress finish. `metrics_port`: where the stream's Prometheus exporter listens on 127.0.0.1
    (`exporter`; 0, none: the CLI's default is stream.toml's). `spark_ui_port`: where the driver it starts serves
    Spark's own metrics (spark.toml [driver_metrics]; 0, none). `accept_lost`: start a partition whose records
    from the table's position on Kafka no longer holds at its log start, the range kept as lost
    (pipelines.ingest.lost), instead of stopping.
    """

    trigger_seconds: float = INGEST_TRIGGER_SECONDS
    max_offsets_per_trigger: int | None = None
    stop_timeout: float = 300.0
    metrics_port: int = 0
    spark_ui_port: int = 0
    accept_lost: bool = False


@dataclass(frozen=True)
class _Stream:
    """One run of the stream: where each query it starts reads from and reports to, built once by `_run_ingest`
    (the lake it writes, under the declaration of each query, goes beside it).

    `exporter`: where its figures go (None: none kept). `kafka`: how long it waits for Kafka, and how often it
    restarts a query Kafka failed.
    """

    brokers: KafkaSettings
    once: bool
    options: IngestOptions
    exporter: StreamExporter | None
    kafka: KafkaWait

    @property
    def bootstrap(self) -> str:
        return self.brokers.bootstrap_servers

    def unanswered(self) -> str | None:
        """Why no broker answers a Kafka request now (None: one does), through TLS where the brokers speak it."""
        return kafka_unanswered(self.bootstrap, self.kafka.probe_seconds, probe_tls(self.brokers))


def run_ingest(lake: Lake, *, once: bool, bootstrap: str | None = None, options: IngestOptions | None = None) -> None:
    """Run the ingest stream into `lake`: until caught up with what was on the topics at start (`once`), or forever.

    Each Hudi commit records the stream's position, and the stream starts from the tables'
    positions (Structured Streaming's checkpoint under the lake root lasts one run). An
    interrupt (SIGTERM in the CLI) lets the batch in progress finish, up to `options.stop_timeout`
    seconds, then stops the stream: a batch is committed whole, or abandoned and re-run whole
    on the next start; the tables' waiting changes are committed as the stream stops. A stop
    request (`lakehouse stream stop`, pipelines.ingest.stream) does the same and the run returns.
    The stream's heartbeat beside its checkpoint keeps a second copy from starting.
    A run `once` is a batch job: with a Pushgateway (LAKEHOUSE_PUSHGATEWAY) it pushes the exporter's
    per-table figures at its end (pipelines/monitoring/pushgateway.py), as the job `lakehouse_ingest`.

    The first query reads the tables of `lake.declaration`; a stream that runs on follows a changed
    declaration file between queries. Spark is the lake's (`lake.spark`): one it starts here serves the
    driver's own metrics when `options.spark_ui_port` is set.
    """
    options = options or IngestOptions()
    brokers = at(lake.config.kafka, bootstrap)
    # Before Spark and the lease: a port in use fails the start at once, and holds nothing.
    exporter = StreamExporter.serve(options.metrics_port) if options.metrics_port else None
    run = JobMetrics(metric_names.INGEST_ONCE, lake.root, metric_names.INGEST_ONCE_METRICS) \
        if once and pushgateway.gateway() else None
    if run is not None and exporter is None:
        exporter = StreamExporter(run.registry)  # not served: its figures are pushed
    if lake.session is None and options.spark_ui_port:
        # Set before the session starts: a running session's driver keeps the configuration it started with.
        lake.spark_options = {**lake.spark_options, **spark_metrics_conf(options.spark_ui_port)}
        ui = lake.spark.sparkContext.uiWebUrl
        log.info("Spark's metrics: %s/metrics/prometheus and %s/metrics/executors/prometheus", ui, ui)
    try:
        _run_ingest(lake, once, brokers, options, exporter)
    except BaseException:
        if run is not None:
            run.push(succeeded=False)
        raise
    finally:
        if exporter is not None:
            exporter.close()
    if run is not None:
        assert exporter is not None
        run.push(*([exporter.registry] if exporter.registry is not run.registry else []))


def _run_ingest(lake: Lake, once: bool, brokers: KafkaSettings, options: IngestOptions,
                exporter: StreamExporter | None) -> None:
    """`run_ingest`'s stream, its figures to `exporter` (None: none kept).

    A query runs with one declaration (`lake.declaration`): its batches, the writer's threads and the
    compactor keep the tables it started with, whatever the file says meanwhile, since a query reads one
    set of topics. The stream moves to the file's declaration only between queries (`_declaration_now`).
    """
    # Spark before the lease (a Spark that cannot start claims nothing) and before the compactor's thread,
    # which runs its jobs in a pool of the running context.
    log.info("the stream runs on Spark application %s", lake.spark.sparkContext.applicationId)
    # One writer per checkpoint: wait for a previous stream's heartbeat to go stale, or fail.
    lease = StreamLease(lake.root)
    lease.claim()
    # Inline mode: main's compactions run beside the batches (a plan left by a killed process first).
    compactor = Compactor(lake, every=options.trigger_seconds).start() if compactions_run_here() else None
    stopped = False  # a run to its end, a stop request or an interrupt: not a failure
    stream = _Stream(brokers, once, options, exporter, kafka_wait())
    kafka_failures = 0
    try:
        while True:
            if compactor is not None:
                compactor.follow(lake)
            if exporter is not None:
                exporter.follow(lake.root, lake.declaration)
            try:
                moved = _run_query(stream, lake, lease)
            except KeyboardInterrupt:
                stopped = True
                raise
            except StreamingQueryException as exc:
                kafka_failures += 1
                if not _restart_after(stream, lease, exc, kafka_failures):
                    stopped = True
                    break
                # A new query, with the declaration file as it is now, as any query starts.
                lake = _moved(lake, _declaration_now(lake.declaration))
                continue
            kafka_failures = 0
            stopped = True
            if moved is None:
                break
            lake = _moved(lake, moved)
            stopped = False
    except BaseException as exc:
        failed: BaseException | None = exc
        raise
    else:
        failed = None
    finally:
        try:
            if compactor is not None:
                # A stream that stops leaves no plan pending (one plan is one bucket: seconds);
                # one that failed only waits for the compaction in progress.
                compactor.close(drain=stopped)
        finally:
            _release(lease, failed)


def _restart_after(stream: _Stream, lease: StreamLease, exc: StreamingQueryException, failures: int) -> bool:
    """After the query failed with `exc` (the `failures`-th time in a row): True to start it again, False when a
    stop request came while the stream waited; `exc` raised again when it is the stream's own failure.

    Kafka gone (the broker down, the network to it cut): wait for it, then start the query again from the
    positions in bronze's commits; the batch it cut short is re-run whole. Any other failure is the stream's
    own, and so is one that Kafka causes more than `kafka.restarts` times in a row while it answers.
    """
    kafka, bootstrap = stream.kafka, stream.bootstrap
    why = stream.unanswered()
    if why is None and (not kafka_caused(exc) or failures > kafka.restarts):
        raise exc
    log.warning("the query failed while Kafka at %s %s: %s", bootstrap,
                "did not answer" if why else "was failing its clients", str(exc).splitlines()[0])
    return _wait_for_kafka(lease, stream, why)


def _moved(lake: Lake, decl: Declaration) -> Lake:
    """The lake under `decl`, the declaration of the stream's next query.

    When its tables' topics differ (`lakehouse dev source sync` declared a table), the next query
    subscribes to theirs. Structured Streaming's checkpoint names the old subscription, so it goes, and
    the query starts as one whose checkpoint was lost: each table from the position its own commits
    record, a new table from its topic's start. Nothing is read twice into a table, nothing skipped.
    """
    if sorted(decl.topics()) != sorted(lake.declaration.topics()):
        log.warning("the declared tables changed (%s): the stream now reads %s; the stream checkpoint starts "
                    "again from the positions in bronze's commits", decl.path, ", ".join(sorted(decl.topics())))
        storage.remove_tree(ingest_checkpoint_path(lake.root))
    return lake.with_declaration(decl)


def _release(lease: StreamLease, failed: BaseException | None) -> None:
    """`lease.release()`, which must not hide the stream's own failure behind its own.

    On a full disk (ENOSPC) the stream fails, and then its heartbeat cannot be rewritten as
    stopped either: raised from the `finally` that releases, that second error replaced the first
    (the operator read of a heartbeat file, not of the commit the disk cut short). While an error
    propagates (`failed`), a failed release is logged instead; the heartbeat left saying `running`
    names a process that is gone, which the next stream judges dead and takes over (`stream.judge`).
    """
    try:
        lease.release()
    except Exception as exc:
        if failed is None:
            raise
        log.warning("the stream's heartbeat could not be marked stopped: %s", console.first_line(exc))


def _wait_for_kafka(lease: StreamLease, stream: _Stream, why: str | None) -> bool:
    """Wait until the stream's Kafka answers, beating meanwhile; False if a stop request came first.

    The heartbeat says what the stream waits for (`lakehouse stream status`); the exporter's heartbeat
    time follows it (the stream is alive: LakehouseStreamHeartbeatStale must not fire for a wait). Past
    `kafka.wait_seconds` the stream gives up with `KafkaUnavailable`, and exits naming Kafka.
    """
    what, kafka, exporter = f"Kafka at {stream.bootstrap}", stream.kafka, stream.exporter
    started = time.monotonic()
    while why is not None:
        lease.waiting(what, why)
        lease.beat(None, False)
        if exporter is not None:
            exporter.heartbeat.set(lease.hb.written_at)
        log.warning("waiting for %s for %.0f s: %s", what, time.monotonic() - started, why)
        if lease.stop_requested():
            log.info("stop requested (%s) while waiting for %s", STOP_REQUEST, what)
            return False
        if time.monotonic() - started > kafka.wait_seconds:
            raise KafkaUnavailable(f"{what} did not answer for {time.monotonic() - started:.0f} s "
                                   f"(stream.toml [kafka] wait_seconds {kafka.wait_seconds:.0f}): {why}")
        time.sleep(lease.lim.heartbeat_seconds)
        why = stream.unanswered()
    lease.waiting(what, None)
    log.warning("%s answers again after %.0f s: the query starts again from the positions in bronze's commits",
                what, time.monotonic() - started)
    return True


def _run_query(stream: _Stream, lake: Lake, lease: StreamLease) -> Declaration | None:
    """Run one ingest query over the tables of `lake.declaration` until it ends, is asked to stop, the declared
    tables change, or a declared table's topic appears (then the declaration the next query runs with).

    At every heartbeat Kafka is probed (`kafka`: how long a probe waits): while it does not answer, the
    heartbeat says that the stream waits for it, though Spark's Kafka clients are still retrying inside
    the query and the query has not failed (it may never: a broker back within their timeouts resumes it).
    """
    bootstrap, once, exporter = stream.bootstrap, stream.once, stream.exporter
    trigger_seconds, stop_timeout = stream.options.trigger_seconds, stream.options.stop_timeout
    what = f"Kafka at {bootstrap}"
    query, batches, reading = _start_query(stream, lake)
    beat_at = 0.0
    try:
        # Every trigger interval, what came due between batches (no batch runs without new records);
        # every heartbeat interval, the heartbeat.
        # PySpark annotates the timeout as int; it takes seconds as int or float (`int(timeout * 1000)`).
        while not query.awaitTermination(min(lease.lim.heartbeat_seconds, trigger_seconds)):  # type: ignore[arg-type]
            if not once:
                batches.commit_due()
            if time.monotonic() - beat_at < lease.lim.heartbeat_seconds:
                continue
            beat_at = time.monotonic()
            progress, tables = query.lastProgress, batches.freshness()
            why = stream.unanswered()
            if why is None and lease.hb.waiting_for is not None:
                log.warning("%s answers again (the stream waited %.0f s)", what,
                            time.time() - (lease.hb.waiting_since or time.time()))
            elif why is not None:
                log.warning("%s does not answer (%s): Spark's Kafka clients retry", what, why)
            lease.waiting(what, why)
            lease.beat(progress, query.status["isTriggerActive"], tables)
            if exporter is not None:
                exporter.beat(lease.hb.written_at, tables, progress)
            if lease.stop_requested():
                log.info("stop requested (%s): stopping after the batch in progress", STOP_REQUEST)
                _let_batch_finish(query, stop_timeout)
                return None
            if not once and (appeared := reading.appeared(stream.brokers, lake.declaration)):
                log.info("the topics of %s exist now: the stream starts a query that reads them", ", ".join(appeared))
                _let_batch_finish(query, stop_timeout)
                return lake.declaration
            if not once and (moved := _declaration_changed(lake.declaration)) is not None:
                _let_batch_finish(query, stop_timeout)
                return moved
        return None
    except KeyboardInterrupt:
        _let_batch_finish(query, stop_timeout)
        raise
    except StreamingQueryException as exc:
        exc.__cause__ = batches.failure  # what the batch raised, its Java throwable with it (`kafka_caused`)
        lost.raise_translated(exc, stream.brokers, lake.declaration, reading.partitions)  # no restart helps
        raise
    finally:
        if query.isActive:
            query.stop()
        # No batch runs any more: the tables' waiting changes and the dead letters held back are written.
        batches.flush()
        if exporter is not None:  # the figures as the query ends: what `ingest --once` pushes
            exporter.beat(time.time(), batches.freshness(), query.lastProgress)


def _start_query(stream: _Stream, lake: Lake) -> tuple[StreamingQuery, BronzeBatchWriter, Subscription]:
    """The ingest query over the topics of the tables of `lake.declaration` that exist (`Subscription`), from the
    positions in bronze's commits, with what it reads.

    Progress has one truth, the tables' own commits: Structured Streaming's checkpoint would resume
    after the batches it has seen, and a table that let its changes wait (`cadence`) and was killed
    before its commit holds them nowhere else. So every query starts without a checkpoint, each
    topic partition from the position its table's commits record (`BronzeBatchWriter.start`).
    """
    root, once, options = lake.root, stream.once, stream.options
    trigger_seconds, max_offsets_per_trigger = options.trigger_seconds, options.max_offsets_per_trigger
    batches = BronzeBatchWriter(lake, trigger_seconds=trigger_seconds, eager=once, exporter=stream.exporter)
    reading = Subscription.now(stream.brokers, lake.declaration)
    if reading.waiting:
        log.info("no topic yet for %s: the stream reads it once its topic exists", ", ".join(reading.waiting))
    reader = kafka_stream(lake.spark, stream.brokers, lake.declaration, reading.tables)
    storage.remove_tree(ingest_checkpoint_path(root))
    positions = batches.start()
    # Records deleted (retention) or offsets gone (a recreated topic) since the tables read: stop, naming them.
    positions = lost.check(stream.brokers, lake.declaration, positions, reading.partitions, root,
                           options.accept_lost)
    if start := starting_offsets(positions, reading.partitions):
        log.info("the stream starts from the positions in bronze's commits %s", start)
        reader = reader.option("startingOffsets", start)
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    writer = (reader.load().writeStream.queryName("bronze_ingest").foreachBatch(batches)
              .option("checkpointLocation", ingest_checkpoint_path(root)))
    writer = writer.trigger(availableNow=True) if once else writer.trigger(processingTime=f"{trigger_seconds} seconds")
    return writer.start(), batches, reading


def _declaration_now(decl: Declaration) -> Declaration:
    """The file of the stream's declaration (`decl.path`) as it is now, read again; `decl`, the one the stream has,
    when the file no longer loads, with the reason in the log, so that a typo in the file does not stop a running
    stream."""
    try:
        return load(decl.path)
    except DeclarationError as exc:
        log.error("the declaration changed and cannot be read, the stream goes on with the tables it had: %s", exc)
        return decl


def _declaration_changed(decl: Declaration) -> Declaration | None:
    """The file's declaration (`_declaration_now`) when its tables' topics differ from those of `decl`, which the
    query in progress reads; None when they do not (a change of anything else waits for the next query)."""
    now = _declaration_now(decl)
    return now if sorted(now.topics()) != sorted(decl.topics()) else None


def _let_batch_finish(query: StreamingQuery, timeout: float) -> None:
    """Wait up to `timeout` for the batch in progress to commit: a batch is committed whole, or re-run whole."""
    deadline = time.monotonic() + timeout
    if query.isActive and query.status["isTriggerActive"]:
        log.info("stopping: waiting up to %.0fs for the batch in progress to finish", timeout)
    while query.isActive and query.status["isTriggerActive"] and time.monotonic() < deadline:
        time.sleep(0.5)
