"""When the stream commits a table: each table at its own pace, by its freshness target, not every batch.

A commit costs about the same whatever it holds (a dozen Spark jobs, the timeline, the metadata
table: 1 to 2.5 s of a core), so a stream that committed every table each batch
would spend a batch's time on the commits of tables with a handful of changes. A table's changes
are therefore held from batch to batch, in the batches' own parsed records (kept while any table
still needs them), until they are *due*:

- the table is busy: its waiting changes came at `busy_changes_per_second` or faster (its commit's
  fixed cost is small beside its rows' work, and waiting would only add delay). A rate, not a
  count: counted, every table of a stream whose batches grow long enough has that many waiting,
  so every table would be busy, and the batches would grow longer still, or
- waiting for the next batch could take its oldest waiting change past the table's target
  (`freshness_seconds` in the declaration): the next batch ends at the earliest a trigger
  interval plus a batch after this one, and a batch is taken to last as long as the longest of the
  last few, or
- something must not wait: a change of shape (the schema decision is made once, and applied by
  the commit), a truncate, the stream stopping, an `ingest --once` (eager mode).

More tables can be due than a batch has the cores to commit without making the busy tables wait:
due tables start their commits, the busy ones first, then the oldest waiting, `parallel_tables` at
a time, and once `budget_seconds` have passed since the batch's first quiet table started its
commit, only the tables that cannot wait (busy, or must) still start; the others stay waiting, the
oldest first in the next batch (`QuietBudget`). An overloaded stream so stays a
stream: its busy tables as fresh as its cores allow, its quiet ones behind their targets by what
the cores lack, and a heartbeat that names them (`Heartbeat.behind`), rather than batches that grow without
bound because every table is always due.

A table with nothing waiting costs nothing: no commit, no read, no timeline walk.

Nothing held is lost on a crash: what a table has not committed is after the position its own
commits record, and the stream always starts from the tables' positions
(`bronze._start_query`), so a restarted stream reads each table's waiting changes from Kafka again.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.sql import DataFrame

import hudi_configs
from pipelines.ingest.survey import Survey
from pipelines.lake.declaration import Declaration
from pipelines.lake.frames import release, union_all


@dataclass(frozen=True)
class CadenceLimits:
    busy_changes_per_second: float  # a table whose changes come this fast commits every batch
    parallel_tables: int  # tables committed side by side
    budget_seconds: float  # after a batch's first quiet commit started, no other quiet one starts
    recent_batches: int  # the batches whose longest duration predicts the next one's


def cadence_limits() -> CadenceLimits:
    """hudi_configs/stream.toml `[cadence]`, with the deployment's overrides."""
    values = hudi_configs.section("stream", "cadence")
    return CadenceLimits(float(values["busy_changes_per_second"]), int(values["parallel_tables"]),
                         float(values["budget_seconds"]), int(values["recent_batches"]))


@dataclass
class BatchRecords:
    """A batch's parsed records (materialized), kept while a table still holds changes among them."""

    frame: DataFrame
    holders: int = 0
    released: bool = False

    def drop(self) -> None:
        self.holders -= 1
        if self.holders <= 0:
            self.release()

    def release(self) -> None:
        if not self.released:
            release(self.frame)
            self.released = True


@dataclass
class Waiting:
    """One table's changes that no commit holds yet: the surveys of the batches they came in."""

    surveys: list[Survey] = field(default_factory=list)
    batches: list[BatchRecords] = field(default_factory=list)
    changes: int = 0  # change records (rows, truncates)
    since: float | None = None  # Kafka timestamp (epoch seconds) of the oldest
    must: str | None = None  # why the table cannot wait ("shape", "truncate")

    def survey(self) -> Survey:
        """One survey of every batch held: their events together, the newest shape (a change of it is never held)."""
        if len(self.surveys) == 1:
            return self.surveys[0]
        newest = self.surveys[-1]
        kinds: dict[str, int] = {}
        for s in self.surveys:
            for kind, n in s.kinds.items():
                kinds[kind] = kinds.get(kind, 0) + n
        return Survey(union_all([s.events for s in self.surveys]), kinds, newest.shape,
                      any(s.changed for s in self.surveys), sorted({c for s in self.surveys for c in s.toast}),
                      set().union(*(s.applied_declared for s in self.surveys)))


class QuietBudget:
    """`seconds` of a batch for the commits of its due tables that could wait, from the first one's start.

    Counted from the first quiet commit, not from the batch's first commit: counted from there, busy
    tables whose own commits take longer than the budget would leave no time to any other, and most
    quiet tables would wait for ever. So each batch commits some of its quiet tables, the oldest first.
    """

    def __init__(self, cadence: Cadence, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.cadence = cadence
        self.seconds = seconds
        self.clock = clock
        self.started: float | None = None
        self._lock = threading.Lock()  # the commits start from several threads (`run_together`)

    def allows(self, table: str) -> bool:
        """Whether `table`'s commit may start now: always for one that cannot wait (`Cadence.urgent`)."""
        if self.cadence.urgent(table):
            return True
        with self._lock:
            now = self.clock()
            if self.started is None:
                self.started = now
            return now - self.started <= self.seconds


class Cadence:
    """Which tables a batch commits, and what each table is waiting with.

    `decl`: the declaration of the stream's query, whose targets (`freshness_seconds`) it keeps for all the
    query's batches and whose tables the heartbeat reports.
    """

    def __init__(self, decl: Declaration, trigger_seconds: float, *, eager: bool,
                 limits: CadenceLimits | None = None) -> None:
        self.decl = decl
        self.trigger_seconds = trigger_seconds
        self.eager = eager  # every table commits every batch (`ingest --once`, a benchmark's reference)
        self.limits = limits or cadence_limits()
        self.waiting: dict[str, Waiting] = {}
        self._durations: deque[float] = deque(maxlen=self.limits.recent_batches)
        self.committed_at: dict[str, float] = {}  # per table, when this stream last committed it (epoch)

    def hold(self, table: str, survey: Survey, batch: BatchRecords, changes: int, oldest: float | None) -> Waiting:
        """The batch's `survey` of `table`, with `changes` change records, the oldest entered Kafka at `oldest`."""
        w = self.waiting.setdefault(table, Waiting())
        w.surveys.append(survey)
        w.batches.append(batch)
        batch.holders += 1
        w.changes += changes
        if oldest is not None:
            w.since = oldest if w.since is None else min(w.since, oldest)
        if survey.changed:
            w.must = "shape"
        elif survey.kinds.get("truncate"):
            w.must = w.must or "truncate"
        return w

    def due(self, now: float | None = None) -> list[str]:
        """The tables whose waiting changes this batch commits: those that cannot wait first (`urgent`), then
        the oldest waiting first."""
        now = time.time() if now is None else now
        due = [t for t, w in self.waiting.items() if self._due(t, w, now)]
        return sorted(due, key=lambda t: (not self.urgent(t, now), self.waiting[t].since or now))

    def urgent(self, table: str, now: float | None = None) -> bool:
        """A table committed in the batch whatever the batch's time budget: eager mode, a change of shape or a
        truncate, or a busy table (as busy, it is the batch's main work)."""
        w = self.waiting[table]
        if self.eager or w.must is not None:
            return True
        now = time.time() if now is None else now
        # Over at least a trigger interval: a handful of changes in the same second is no rate.
        span = max(now - w.since if w.since is not None else 0.0, self.trigger_seconds, 1.0)
        return w.changes >= self.limits.busy_changes_per_second * span

    def _due(self, table: str, w: Waiting, now: float) -> bool:
        if self.urgent(table, now):
            return True
        if w.since is None:
            return w.changes > 0
        return now - w.since + self.next_batch_seconds() >= self.decl.table(table).freshness_seconds

    def quiet_budget(self, seconds: float) -> QuietBudget:
        """One batch's budget for its quiet tables' commits."""
        return QuietBudget(self, seconds)

    def next_batch_seconds(self) -> float:
        """How long after this batch the next one could end: a trigger interval, then a batch as long as the
        longest recent one."""
        batch = max(self._durations, default=self.trigger_seconds)
        return max(self.trigger_seconds, batch) + batch

    def committed(self, table: str) -> None:
        """The table's waiting changes are in its commits: what they held of each batch is free."""
        w = self.waiting.pop(table, None)
        self.committed_at[table] = time.time()
        if w is not None:
            for batch in w.batches:
                batch.drop()

    def batch_done(self, seconds: float) -> None:
        self._durations.append(seconds)

    def freshness(self, now: float | None = None) -> dict[str, dict[str, float | int | None]]:
        """Per declared table: its target, the age of its oldest waiting change (None: nothing waiting), and how
        many wait: what the heartbeat says of each table (`lakehouse status`)."""
        now = time.time() if now is None else now
        waiting = dict(self.waiting)  # the heartbeat's thread reads while a batch's thread writes
        tables = {}
        for t in self.decl.names:
            w = waiting.get(t)
            tables[t] = {"target": self.decl.table(t).freshness_seconds,
                         "waiting": w.changes if w else 0,
                         "age": round(now - w.since, 1) if w and w.since is not None else None,
                         "committed_at": self.committed_at.get(t)}
        return tables
