"""When a table is due (pipelines.ingest.cadence) and how the heartbeat names the tables behind: no Spark."""

from __future__ import annotations

import time

import pytest

from pipelines.ingest.cadence import BatchRecords, Cadence, CadenceLimits, QuietBudget
from pipelines.ingest.schema import Shape
from pipelines.ingest.stream import Heartbeat, Limits, judge
from pipelines.ingest.survey import Survey
from pipelines.lake.declaration import Declaration
from pipelines.runtime.declared import read_declaration

pytestmark = pytest.mark.unit

LIMITS = CadenceLimits(busy_changes_per_second=50, parallel_tables=4, budget_seconds=4, recent_batches=3)


def _declaration() -> Declaration:
    """The environment's declaration (LAKEHOUSE_TABLES), as a stream's query reads it."""
    return read_declaration()


def _survey(table: str, changed: bool = False, **kinds: int) -> Survey:
    return Survey(None, kinds, Shape.initial(_declaration().table(table)), changed=changed)  # type: ignore[arg-type]


def test_a_table_is_due_when_busy_when_its_target_is_near_or_when_it_must_not_wait() -> None:
    cadence = Cadence(_declaration(), trigger_seconds=2, eager=False, limits=LIMITS)
    now = 1_000_000.0
    batch = BatchRecords(None)  # type: ignore[arg-type]
    target = _declaration().table("customers").freshness_seconds
    cadence.hold("customers", _survey("customers", row=5), batch, 5, now - 1)
    assert cadence.due(now) == [], "a few fresh changes wait"
    for seconds in (3.0, 4.0, 2.5):
        cadence.batch_done(seconds)
    assert cadence.next_batch_seconds() == 8.0, "a trigger's wait or a batch, then the longest recent batch"
    # The oldest change entered Kafka at now - 1: due once its age and the next batch reach the target.
    assert cadence.due(now + target - 8.0 - 2) == [] and cadence.due(now + target - 8.0) == ["customers"]
    cadence.hold("orders", _survey("orders", row=150), batch, 150, now)
    assert "orders" in cadence.due(now), "a busy table commits every batch: 150 changes within a trigger's 2 s"
    calm = Cadence(_declaration(), trigger_seconds=2, eager=False, limits=LIMITS)
    calm.hold("orders", _survey("orders", row=150), batch, 150, now - 10)
    assert calm.due(now) == [], "150 changes over 10 s is no busy table (a long batch does not make it one)"
    calm.hold("orders", _survey("orders", row=400), batch, 400, now)
    assert calm.due(now) == ["orders"], "550 over 10 s is"
    assert cadence.due(now + target) == ["customers", "orders"], "due by their age, the oldest first"
    cadence.hold("orders", _survey("orders", changed=True, row=1), batch, 1, now)
    assert cadence.due(now + target) == ["orders", "customers"], "the tables that cannot wait first"
    assert cadence.urgent("orders", now) and not cadence.urgent("customers", now)
    assert batch.holders == 5, "each hold keeps its batch"
    shaped = Cadence(_declaration(), trigger_seconds=2, eager=False, limits=LIMITS)
    shaped.hold("customers", _survey("customers", changed=True, row=1), batch, 1, now)
    assert shaped.due(now) == ["customers"], "a change of shape is applied at once"
    truncated = Cadence(_declaration(), trigger_seconds=2, eager=False, limits=LIMITS)
    truncated.hold("orders", _survey("orders", truncate=1), batch, 1, now)
    assert truncated.due(now) == ["orders"]
    eager = Cadence(_declaration(), trigger_seconds=2, eager=True, limits=LIMITS)
    eager.hold("customers", _survey("customers", row=1), batch, 1, now)
    assert eager.due(now) == ["customers"], "ingest --once commits every batch"
    merged = Cadence(_declaration(), trigger_seconds=2, eager=False, limits=LIMITS)
    for n in (3, 4):
        merged.hold("customers", _survey("customers", row=n, tombstone=1), batch, n, now - n)
    waiting = merged.waiting["customers"]
    assert (waiting.changes, waiting.since) == (7, now - 4)
    fresh = merged.freshness(now)
    assert fresh["customers"] == {"target": target, "waiting": 7, "age": 4.0, "committed_at": None}
    assert fresh["orders"]["age"] is None


def test_busy_tables_do_not_spend_the_quiet_tables_budget() -> None:
    cadence = Cadence(_declaration(), trigger_seconds=2, eager=False, limits=LIMITS)
    now = time.time()  # busy or not is judged at the wall clock's now
    batch = BatchRecords(None)  # type: ignore[arg-type]
    cadence.hold("orders", _survey("orders", row=500), batch, 500, now)
    cadence.hold("customers", _survey("customers", row=3), batch, 3, now - 60)
    clock = iter([130.0, 133.9, 134.1]).__next__  # the quiet commits' starts only
    budget = QuietBudget(cadence, 4, clock)
    assert budget.allows("orders"), "a busy table is not counted"
    assert budget.allows("customers"), "however long the busy commits ran, the first quiet one starts"
    assert budget.allows("customers") and not budget.allows("customers"), "within 4 s of it, and not after"
    assert budget.allows("orders"), "a busy table starts whatever the time"


def test_the_heartbeat_names_the_tables_behind_their_target() -> None:
    lim = Limits(heartbeat_seconds=10, dead_after_seconds=90, stalled_after_seconds=600, start_timeout_seconds=300,
                 stop_timeout_seconds=330, kill_timeout_seconds=60)
    now = 2_000_000.0
    hb = Heartbeat(owner="x", host="elsewhere", pid=1, pid_started=None, started_at=now - 60, written_at=now,
                   state="running", batch=7, last_progress_at=now - 2,
                   tables={"customers": {"target": 15.0, "waiting": 3, "age": 22.0, "committed_at": None},
                           "orders": {"target": 15.0, "waiting": 0, "age": None, "committed_at": now - 3}})
    health = judge(hb, lim, now)
    assert health.state == "healthy"
    assert "behind their freshness target: customers (22 s, target 15 s)" in health.why
    assert "orders" not in health.why
