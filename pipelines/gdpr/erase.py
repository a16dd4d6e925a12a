"""`lakehouse gdpr erase`: a customer's data out of every table, every retained version and every file.

Contract sections 4 and 7. One run erases the customers of one or many requests (erase_all: the
sweep, purge and verification are paid once for the batch, and each request gets its own
certificate), from every declared table with a `subject` column (pipelines.gdpr.find). A row
(an order, any declared table's row, by its own key) is the customers' when its newest version
names one of them; a row the source has given to another customer since stays (its current
version is that customer's), and only its versions naming the subject go. One run does, in
order (each step timed for the certificate):

1. register: the customers' and their rows' pseudonyms (keyed hashes, pipelines.lake.erasure_registry)
   go into the registry `_gdpr/erased`. From then on ingest drops their events (a replayed
   insert cannot bring them back) and silver drops their changes;
2. wait for the bronze writes that were in flight when the registry changed (they may
   have read it before);
3. sweep: every row of the customer and of their rows is deleted from bronze main, the
   delete ledgers, the change logs, the dead letters, silver and quarantine (upserts with
   `_hoodie_is_deleted`, so Hudi's own ordering rules apply); gold follows through its
   usual incremental cycle, which reads silver's change feed: customer_ltv loses the row,
   daily_revenue is recomputed for the days of their orders (when the shop's tables are declared);
4. purge: what still holds the data in older versions goes. Savepoints that pin such
   versions are deleted (and re-created at the new latest commit); merge-on-read tables
   are compacted until no log file predates the sweep (a pending plan first); in copy-on-write
   tables with a change feed, the file groups the erasure's commits wrote are written once
   more, unchanged, because those commits' `.cdc` files hold the deleted rows' before-images
   in the newest slice (Hudi 1.0.2's clustering plans nothing for a non-partitioned table,
   so it cannot do this), and so are the file groups whose newest `.cdc` files hold the
   subject from an earlier commit (a row that left silver for quarantine before the
   erasure: change_feed_holders), those tables purged even where the sweep deleted nothing; an empty marker
   commit records from when on incremental reads stay possible (older checkpoints get a
   full read, hudi_timeline.READABLE_FROM_META); then every table is cleaned down to the
   newest versions, and metadata tables holding keys (record index) are rebuilt from the
   cleaned files;
5. Kafka: tombstones for the erased keys on the source topics, which are set to log
   compaction, so the broker drops the raw events too; the values Great Expectations kept
   of failed checks are redacted and the Data Docs rebuilt (pipelines.services.quality);
6. verify (pipelines.gdpr.scan and reads): snapshot, time travel to every retained
   instant, incremental and change-feed reads find nothing, and a scan of every file under
   the lake root, decoded, finds neither the ids, nor their rows' keys, nor their pii values;
7. certificate (`_gdpr/certificates/<reference>.json`) and one line in `_gdpr/audit.jsonl`,
   with pseudonyms, counts, instants and timings, never the personal data.

Erasure is a writer of every table. Beside a running ingest stream it needs the stream in
multi-writer mode (LAKEHOUSE_TABLE_SERVICES=external, as in the Airflow deployment): its
writes then run under optimistic concurrency control and the tables' locks.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import hudi_configs
from pipelines.errors import ErasureError, StorageError
from pipelines.gdpr.certificate import (
    Certificate,
    FurtherSweep,
    Report,
    RunSummary,
    Status,
    Subjects,
    Verification,
    write_certificate,
)
from pipelines.gdpr.find import Found, Target, find_subject, subject_tables
from pipelines.gdpr.purge import PurgePlan, change_feed_holders, purge, sweep
from pipelines.gdpr.request import ErasureRequest
from pipelines.gdpr.scan import Subject
from pipelines.gdpr.tombstones import kafka_tombstones
from pipelines.gdpr.verify import verify
from pipelines.lake.catalog import erasure_uncovered, lake_catalog, lake_tables
from pipelines.lake.declaration import Declaration
from pipelines.lake.erasure_registry import read_registry, registry_path, row_pseudonym, subject_hash
from pipelines.lake.hudi_timeline import extra_meta_after, latest_completion, pending_writes
from pipelines.lake.layout import BATCH_ID_META, REGISTRY_META
from pipelines.lake.table_stats import has_completed_commit
from pipelines.lake.timeline_repair import repair_torn_timeline
from pipelines.runtime.config import KafkaSettings
from pipelines.runtime.hudi_writes import save
from pipelines.runtime.kafka_clients import at
from pipelines.runtime.lake import Lake
from pipelines.services.quality import redact_subject

log = logging.getLogger(__name__)

REGISTRY_OPTIONS = "registry"
# How long the erasure waits for the bronze writes in flight to end, and how often it looks.
BRONZE_WRITES_TIMEOUT_S = 180.0
BRONZE_WRITES_POLL_S = 1.0


# ---------------------------------------------------------------- the registry


def _register(lake: Lake, requests: list[ErasureRequest], target: Target) -> int:
    """Add the requests' pseudonyms to the lake's registry in one commit (an upsert: a repeated request adds nothing).

    Each customer is tagged with a pseudonym of its request's reference; their rows (of every
    declared table, each by its own key: row_pseudonym) with the run's (all its references),
    whose customer is not recorded anywhere. Pseudonyms are keyed with the lake's erasure key.
    """
    key = lake.erasure_key

    def tag(references: str) -> str:
        return subject_hash("customer", 0, key + references)

    run_tag = tag(",".join(r.reference for r in requests))
    tables = subject_tables(lake.declaration)
    rows = [(subject_hash("customer", c, key), "customer", tag(r.reference))
            for r in requests for c in r.customer_ids]
    rows += [(*row_pseudonym(name, tables[name].key, text, key), run_tag)
             for name, texts in sorted(target.rows.items()) if name in tables
             and tables[name].key != (tables[name].subject,) for text in sorted(texts)]
    df = lake.spark.createDataFrame(rows, "subject string, kind string, request string") \
        .dropDuplicates(["subject"]).withColumn("registered_at", F.current_timestamp())
    save(df, registry_path(lake.root), hudi_configs.writer("gdpr", REGISTRY_OPTIONS))
    return len(rows)


# ---------------------------------------------------------------- the ingest stream, beside the erasure


def _bronze_paths(root: str, decl: Declaration) -> list[str]:
    """The bronze tables of `decl` at `root` that exist: those an ingest batch writes."""
    return [t.path for t in lake_tables(root, decl) if t.name.startswith("bronze/") and has_completed_commit(t.path)]


def wait_for_bronze_writes(lake: Lake, timeout: float = BRONZE_WRITES_TIMEOUT_S) -> list[str]:
    """Wait until the bronze writes in flight now have ended; returns those still pending at the timeout.

    A batch in flight may have read the registry before this erasure added to it. Writes
    whose writer is dead (pending_writes: a stale heartbeat) are not waited for; after the
    timeout the erasure goes on, and the stale-write check below still covers anything
    that commits later.
    """
    spark = lake.spark
    waiting = {path: set(pending_writes(spark, path)) for path in _bronze_paths(lake.root, lake.declaration)}
    deadline = time.monotonic() + timeout
    while True:
        waiting = {p: w & set(pending_writes(spark, p)) for p, w in waiting.items()}
        left = [f"{p}@{i}" for p, w in waiting.items() for i in sorted(w)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(BRONZE_WRITES_POLL_S)


def stale_bronze_writes(lake: Lake, since: str, registered: str) -> int:
    """Ingest commits completed after `since` that filtered with a registry older than `registered`."""
    stale = 0
    for path in _bronze_paths(lake.root, lake.declaration):
        for meta in extra_meta_after(lake.spark, path, since, (BATCH_ID_META, REGISTRY_META)):
            if BATCH_ID_META in meta and (meta.get(REGISTRY_META) or "") < registered:
                stale += 1
    return stale


def _now_instant() -> str:
    """Now as a Hudi instant time (local time, the timeline's default zone), comparable with completion times."""
    return datetime.now().strftime("%Y%m%d%H%M%S%f")[:17]


# ---------------------------------------------------------------- the run

# Sweeps again before the purge, at most, while ingest batches that filtered with the registry as it
# was before this run commit after the sweep began: each such sweep is cheap (only their rows).
RESWEEPS = 3
# Rounds of sweep, purge and verification, at most, after verification found the subject or an ingest
# commit raced the sweep; a run still failing after them certifies NOT VERIFIED instead of looping on.
FURTHER_ROUNDS = 3
# Findings a further round keeps in the certificate, and names in the log.
FINDINGS_KEPT = 50
FINDINGS_LOGGED = 5


@dataclass
class _Clock:
    """The seconds each step of the run took, by the step's name: the certificate's `timings_s`."""

    timings: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.timings[name] = round(time.monotonic() - started, 2)
        log.info("erasure: %s (%.1f s)", name, self.timings[name])


@dataclass(frozen=True)
class _Run:
    """What every step of one run works with: built once by erase_all, passed to each step.

    `lake` is where it erases: its root, its declaration (the tables it erases from), its Spark session and its
    erasure key (read before anything else: a key that cannot be read stops the run before it starts).
    """

    lake: Lake
    key: str
    requests: tuple[ErasureRequest, ...]
    progress: Callable[[str], None]
    clock: _Clock

    @property
    def spark(self) -> SparkSession:
        return self.lake.spark

    @property
    def root(self) -> str:
        return self.lake.root

    @property
    def decl(self) -> Declaration:
        return self.lake.declaration

    @property
    def references(self) -> list[str]:
        return [r.reference for r in self.requests]

    @property
    def customers(self) -> list[int]:
        return sorted({c for r in self.requests for c in r.customer_ids})


@dataclass(frozen=True)
class _Held:
    """What the lake holds of the run's customers, found once before anything is written."""

    found: Found
    target: Target
    texts: list[str]
    scan: Subject  # what the file scans look for: ids, their rows' keys, the texts


def _counts(rows: dict[str, frozenset[str]]) -> dict[str, int]:
    """Per declared table, how many rows: the certificate's counts (the keys may be personal data)."""
    return {t: len(k) for t, k in sorted(rows.items())}


@dataclass(frozen=True)
class _Registered:
    """The registry once the run's pseudonyms are in: its commit, its rows as read for the sweeps, and the
    instant before the first sweep (the purge removes what is older)."""

    completed: str
    registry: DataFrame
    sweep_started: str


@dataclass
class _Swept:
    """What the sweeps removed so far, per table, and when the latest one began."""

    tables: dict[str, Report]
    since: str

    def add(self, more: dict[str, Report]) -> None:
        """Add a further sweep's report to the first one's: rows removed add up, the newest instant wins."""
        for name, done in more.items():
            was = self.tables.get(name, {})
            removed = int(was.get("rows_removed", 0)) + int(done.get("rows_removed", 0))
            self.tables[name] = {**was, **done, "rows_removed": removed}


@dataclass(frozen=True)
class _Done:
    """What the run did for all its requests together: every request's certificate carries it."""

    started: datetime
    tables: dict[str, dict[str, object]]
    purge: dict[str, dict[str, object]]
    kafka: dict[str, object]
    quality: dict[str, int]
    verification: Verification
    further_sweeps: list[FurtherSweep]


def erase(lake: Lake, request: ErasureRequest, *, bootstrap: str | None = None,
          progress: Callable[[str], None] = log.info) -> Certificate:
    """Erase and verify one request; returns the certificate (also written under `_gdpr/`)."""
    return erase_all(lake, [request], bootstrap=bootstrap, progress=progress)[0]


def erase_all(lake: Lake, requests: list[ErasureRequest], *, bootstrap: str | None = None,
              progress: Callable[[str], None] = log.info) -> list[Certificate]:
    """Erase the customers of every request from `lake` in one run; returns one certificate per request, in order.

    The costly steps (sweep, purge, verification) are paid once for the whole batch, not
    once per request: a data-protection officer's week of requests is one purge. Each
    request keeps its own reference, certificate and audit line; all of them carry the
    same run's tables, purge and checks, and name the references erased with them.
    The tables are the lake's declaration's; Kafka is its configuration's, at the brokers `bootstrap` if given.
    """
    _validate(requests, lake.declaration)
    run = _Run(lake, lake.erasure_key, tuple(requests), progress, _Clock())
    started = datetime.now(UTC)
    held = _find(run)
    registered = _register_run(run, held)
    swept = _sweep(run, held, registered)
    with run.clock.step("kafka"):
        kafka = _tombstones(at(lake.config.kafka, bootstrap), held)
    purged = _purge_held(run, held, swept, registered)
    with run.clock.step("quality results"):
        quality = redact_subject(run.root, set(held.texts), set(run.customers), set(held.target.orders))
    with run.clock.step("verify"):
        result = verify(run.lake, held.target, held.texts, progress)
    result, further = _until_verified(run, held, swept, registered, purged, result)
    done = _Done(started, swept.tables, purged, kafka, quality, result, further)
    return [_certify(run, held, done, request) for request in requests]


def _validate(requests: list[ErasureRequest], decl: Declaration) -> None:
    """Step: refuse a run that could not be certified truthfully, before anything is read or written."""
    if not requests:
        raise ErasureError("no erasure request given")
    if uncovered := erasure_uncovered(decl):  # none today: every layout is covered (pipelines.lake.catalog)
        # Claiming "verified" while a declared table may still hold the subject's rows would be false.
        raise ErasureError(f"the erasure does not cover declared table(s) {', '.join(uncovered)} ({decl.path})")
    references = [r.reference for r in requests]
    if len(set(references)) != len(references):
        raise ErasureError(f"references must differ within one run, got {references}: each names its certificate")


def _find(run: _Run) -> _Held:
    """Step: what the lake holds of the customers, their rows and the rows that moved, before the registry changes."""
    for table in lake_tables(run.root, run.decl):  # a crashed writer's cut timeline file fails every reader of it
        repair_torn_timeline(table.path)
    customers = run.customers
    with run.clock.step("find"):
        found = find_subject(run.lake, tuple(customers))
    target = found.target(customers, run.decl)
    texts = sorted(found.texts)
    held = _Held(found, target, texts, target.subject(texts))
    rows, moved = _counts(target.rows), _counts(target.moved)
    run.progress(f"found {len(found.customers | found.named)} of {len(customers)} customer(s) in "
                 f"{len(run.requests)} request(s), {sum(rows.values())} row(s) of theirs ({rows}) and "
                 f"{sum(moved.values())} row(s) now of other customers ({moved})")
    return held


def _register_run(run: _Run, held: _Held) -> _Registered:
    """Step: the pseudonyms into the registry, so that ingest and silver drop the customers from now on."""
    with run.clock.step("register"):
        _register(run.lake, list(run.requests), held.target)
        completed = latest_completion(run.spark, registry_path(run.root)) or ""
        registry = read_registry(run.spark, run.root)
        sweep_started = _now_instant()
    if registry is None:  # the commit above made it: only a write that did not land leaves none
        raise StorageError(f"the erasure registry {registry_path(run.root)} has no commit after this run's")
    return _Registered(completed, registry, sweep_started)


def _sweep(run: _Run, held: _Held, registered: _Registered) -> _Swept:
    """Step: every row of the subject deleted, again while ingest batches that read the old registry commit."""
    with run.clock.step("wait for bronze writes"):
        wait_for_bronze_writes(run.lake)
    swept = _Swept({}, registered.sweep_started)
    with run.clock.step("sweep"):
        swept.tables = sweep(run.lake, held.target, registered.registry)
        # An ingest batch that read the registry before this request may commit after the sweep
        # began: sweep again (cheap: only its rows) until none did, before the costly purge.
        for _ in range(RESWEEPS):
            wait_for_bronze_writes(run.lake)
            if not stale_bronze_writes(run.lake, swept.since, registered.completed):
                break
            swept.since = _now_instant()
            swept.add(sweep(run.lake, held.target, registered.registry))
    return swept


def _tombstones(brokers: KafkaSettings, held: _Held) -> dict[str, object]:
    """Step: Kafka's copy of the raw events; a broker that fails is reported, the lake is erased regardless."""
    try:
        return kafka_tombstones(brokers, held.target, held.found.key_types)
    except Exception as exc:  # the certificate says what Kafka still holds
        return {"error": f"{type(exc).__name__}: {exc}"}


def _purge_held(run: _Run, held: _Held, swept: _Swept, registered: _Registered) -> dict[str, dict[str, object]]:
    """Step: the older versions of what held the subject, in a purge of only the tables that need one.

    What held the subject keeps older versions of it: those tables (gold included, recomputed from
    silver), the tables whose change feeds still name the subject, and those whose older versions
    name it under rows that moved.
    """
    with run.clock.step("change feeds"):
        holders = change_feed_holders(run.lake, held.scan)
    with_moved = {t.name for t in lake_catalog(run.decl)
                  if t.source in held.target.moved and t.layer in ("bronze", "silver")}
    names = set(swept.tables) | set(holders) | with_moved
    if not names:
        return {}
    with run.clock.step("purge"):
        plan = PurgePlan(frozenset(names), registered.sweep_started, held.target.moved, holders)
        return purge(run.lake, plan, run.progress)


def _until_verified(run: _Run, held: _Held, swept: _Swept, registered: _Registered,
                    purged: dict[str, dict[str, object]],
                    result: Verification) -> tuple[Verification, list[FurtherSweep]]:
    """Step: further rounds of sweep, purge and verification until nothing is found and no ingest commit raced.

    Anything found (a run cut short earlier), or an ingest batch that filtered with the registry as
    it was before this request and committed after the sweep began, gets another sweep and a purge
    of every table. `swept` and `purged` take each round's reports; returns the last verification
    and why each further round ran.
    """
    further: list[FurtherSweep] = []
    for attempt in range(1, FURTHER_ROUNDS + 1):
        with run.clock.step(f"wait for bronze writes {attempt}"):
            wait_for_bronze_writes(run.lake)
            stale = stale_bronze_writes(run.lake, swept.since, registered.completed)
        if result.passed and not stale:
            break
        further.append(FurtherSweep(stale, result.failures[:FINDINGS_KEPT]))
        log.warning("erasure: %s; sweeping and purging every table again",
                    f"{stale} ingest commit(s) raced the sweep" if stale else
                    "verification found the subject: " + "; ".join(result.failures[:FINDINGS_LOGGED]))
        swept.since = _now_instant()
        # A stale ingest batch wrote bronze only; anything else found may be anywhere.
        again = frozenset(t.name for t in lake_tables(run.root, run.decl)
                          if not result.passed or t.name.startswith("bronze/"))
        with run.clock.step(f"sweep again {attempt}"):
            swept.add(sweep(run.lake, held.target, registered.registry))
        with run.clock.step(f"purge again {attempt}"):
            plan = PurgePlan(again, registered.sweep_started, held.target.moved,
                             change_feed_holders(run.lake, held.scan))
            purged.update(purge(run.lake, plan, run.progress))
        with run.clock.step(f"verify again {attempt}"):
            result = verify(run.lake, held.target, held.texts, run.progress)
    return result, further


def _certify(run: _Run, held: _Held, done: _Done, request: ErasureRequest) -> Certificate:
    """Step: one request's certificate and audit line, written beside the lake; returned with its path."""
    found, target = held.found, held.target
    mine = set(request.customer_ids)
    # Per request, what the lake held of its own customers; the run's tables are shared.
    nothing = not ((found.customers | found.named) & mine) and (not done.tables or len(run.requests) > 1)
    status: Status = ("nothing left to erase" if nothing else "erased") if done.verification.passed \
        else "NOT VERIFIED"
    certificate = Certificate(
        reference=request.reference, requested_by=request.requested_by, status=status,
        verified=done.verification.passed, started_at=done.started.isoformat(),
        finished_at=datetime.now(UTC).isoformat(),
        subjects=Subjects(customers=[subject_hash("customer", c, run.key) for c in request.customer_ids],
                          duplicates_in_request=request.duplicates,
                          found_in_lake=len((found.customers | found.named) & mine)),
        run=RunSummary(references=run.references, customers=len(run.customers),
                       found_in_lake=len(found.customers | found.named), orders=len(target.orders),
                       orders_moved_to_other_customers=len(target.moved_orders),
                       rows_of_theirs=_counts(target.rows), rows_moved_to_other_customers=_counts(target.moved),
                       texts_checked=len(found.texts), texts_shared_with_other_customers=found.shared_texts),
        tables=done.tables, purge=done.purge, kafka=done.kafka, quality_results=done.quality,
        verification=done.verification, further_sweeps=done.further_sweeps, timings_s=run.clock.timings)
    return replace(certificate, path=write_certificate(run.root, certificate))
