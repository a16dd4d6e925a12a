"""The retention numbers of hudi_configs/ hold against the schedules that set them (table_services.toml, "Retention").

Checked from the sources themselves, so that a faster trigger or etl schedule, or longer
task timeouts, cannot silently make an incremental reader lose its checkpoint.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from conftest import DAGS

import hudi_configs
from pipelines.runtime.settings import INGEST_TRIGGER_SECONDS

pytestmark = pytest.mark.integration

HOUR = timedelta(hours=1)


def _worst_etl_lag() -> timedelta:
    """How far silver and gold can fall behind in normal operation: every attempt of a run hangs until killed."""
    from airflow.models.dagbag import DagBag

    dag = DagBag(dag_folder=str(DAGS), include_examples=False).dags["lakehouse_incremental_etl"]
    interval = dag.timetable._delta  # a timedelta schedule
    (task,) = dag.tasks
    return interval + (task.retries + 1) * (task.execution_timeout + task.retry_delay)


def _hours(name: str, part: str) -> float:
    options = hudi_configs.section(name, part)
    assert options["hoodie.clean.policy"] == "KEEP_LATEST_BY_HOURS", (name, part)
    return float(options["hoodie.clean.hours.retained"])


def _keeps(name: str, part: str, commits_per_hour: float) -> None:
    """Archival keeps every commit of the window on the active timeline, where readers check checkpoints."""
    options = hudi_configs.section(name, part)
    window = _hours(name, part) * commits_per_hour
    low, high = int(options["hoodie.keep.min.commits"]), int(options["hoodie.keep.max.commits"])
    assert window < low < high, f"{name}.toml [{part}]: {window:.0f} commits in the window, keeps {low}..{high}"


def test_incremental_readers_keep_their_checkpoint_in_normal_operation() -> None:
    lag = _worst_etl_lag()
    assert timedelta(hours=3) < lag < timedelta(hours=4), lag  # the figure table_services.toml explains
    # silver reads bronze's change log; gold and users' daily jobs read silver and gold.
    assert _hours("bronze", "changelog") * HOUR > 3 * lag
    for name, part in (("silver", "table"), ("gold", "common")):
        assert _hours(name, part) * HOUR > timedelta(days=1) + lag, (name, part)
    # data_quality time-travels bronze main to silver's batch: one etl interval back, normally.
    assert _hours("bronze", "table") * HOUR > 6 * timedelta(minutes=10)


def test_archival_keeps_every_commit_of_the_retention_window() -> None:
    batches_per_hour = 3600 / INGEST_TRIGGER_SECONDS
    _keeps("bronze", "changelog", batches_per_hour)
    # Main in inline mode (the local default) also compacts every n-th batch.
    compactions = 1 / int(hudi_configs.section("bronze", "table")["hoodie.compact.inline.max.delta.commits"])
    _keeps("bronze", "table", batches_per_hour * (1 + compactions))
    cycles_per_hour = HOUR / timedelta(minutes=10)
    _keeps("silver", "table", cycles_per_hour)
    _keeps("gold", "common", cycles_per_hour)
