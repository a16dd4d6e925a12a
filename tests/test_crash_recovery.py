"""SIGKILL the ingest job at chosen points, restart it, and end with bronze equal to the model.

The kill points are observed, not guessed: a `batch N: started` log line (inside a
micro-batch), a `.inflight` instant on a Hudi timeline (during a commit to a bronze
table, a delete ledger or the dead-letter store; during an inline compaction), the
`batch N: ... records in` line (between batches), and the JVM start. The whole process
group goes, as in a lost machine.
"""

from __future__ import annotations

import os
import sys

import pytest

from pipelines.bronze import run_ingest
from pipelines.generator import ShopSource, WorkloadConfig, ensure_topics, produce
from tests.kill import inflight, log_line, run_until
from tests.lake import assert_bronze_equals_model, dead_letters, with_overrides
from tests.model import fold_with_lsn, is_malformed

pytestmark = pytest.mark.slow


# Inline compaction every 3 delta commits instead of 5: it happens within a smaller workload.
OVERRIDES = """
[bronze.table]
"hoodie.compact.inline.max.delta.commits" = 3
"""


def test_sigkill_at_any_point_then_restart_gives_the_model(broker, spark, tmp_path, monkeypatch) -> None:
    root = tmp_path / "lake"
    env = {**os.environ, "LAKEHOUSE_ROOT": str(root), "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap,
           "LAKEHOUSE_HUDI_OVERRIDES": with_overrides(tmp_path / "overrides.toml", OVERRIDES)}
    cmd = [sys.executable, "-m", "pipelines.cli", "ingest", "--once", "--max-offsets-per-trigger", "400"]
    source = ShopSource(2027)
    cfg = WorkloadConfig(seed=2027, customers=150, orders=400, changes=700, malformed_fraction=0.02,
                         replay_runs=2)
    ensure_topics(broker.bootstrap)
    sent = source.snapshot(cfg) + source.changes(cfg)
    produce(sent, broker.bootstrap)

    kill_points = [
        ("while the JVM starts", lambda log: True, 2.0),
        ("inside a micro-batch", log_line(r"batch (\d+): started", after=1), 1.0),
        ("during a delta commit to a bronze table", inflight(root, "bronze/*", "deltacommit"), 0.0),
        ("between batches", log_line(r"batch (\d+): \d+ records in", after=0), 0.0),
        ("during a commit to a delete ledger", inflight(root, "bronze/_deletes/*", "commit"), 0.0),
        ("during a commit to the dead-letter store", inflight(root, "bronze/_dead_letters", "commit"), 0.0),
        ("during an inline compaction", inflight(root, "bronze/*", "compaction"), 0.0),
        ("inside a micro-batch, later", log_line(r"batch (\d+): started", after=2), 2.5),
    ]
    killed = []
    more_cfg = WorkloadConfig(seed=2027, changes=250, malformed_fraction=0.02, replay_runs=1)
    for i, (name, point, delay) in enumerate(kill_points):
        if run_until(cmd, env, tmp_path / f"run{i}.log", point, delay):
            killed.append(name)
        # More changes, with replays of older events, arrive between crashes: every run has a backlog.
        more = source.changes(more_cfg)
        produce(more, broker.bootstrap)
        sent += more
    assert len(killed) >= 6, f"only {len(killed)} of {len(kill_points)} kills landed: {killed}"

    # The last restart in this process: its Spark session is warm, the lake is what the kills left.
    monkeypatch.setenv("LAKEHOUSE_HUDI_OVERRIDES", env["LAKEHOUSE_HUDI_OVERRIDES"])
    run_ingest(once=True, root=str(root), bootstrap=broker.bootstrap, spark=spark)
    expected, lsns = fold_with_lsn(sent)
    assert expected == source.state
    assert_bronze_equals_model(spark, str(root), expected, lsns)
    letters = dead_letters(str(root))
    assert len(letters) == sum(is_malformed(m) for m in sent)
    assert len({d["position"] for d in letters}) == len(letters)
