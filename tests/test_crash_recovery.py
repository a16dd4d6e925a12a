"""SIGKILL the ingest job at chosen points, restart it, and end with bronze equal to the model.

The kill points are observed, not guessed: a `batch N: started` log line (inside a
micro-batch), a `.inflight` instant on a Hudi timeline (during a commit to a bronze
table, a delete ledger or the dead-letter store; during an inline compaction), the
`batch N: ... records in` line (between batches), and the JVM start. The whole process
group goes, as in a lost machine.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pipelines.generator import ShopSource, WorkloadConfig, ensure_topics, produce
from tests.lake import assert_bronze_equals_model, dead_letters
from tests.model import fold_with_lsn, is_malformed

pytestmark = pytest.mark.slow


def _inflight(root: Path, tables: str, action: str) -> Callable[[str], bool]:
    """True while an instant of `action` is inflight on a timeline under root/bronze/<tables>.

    Hudi 1.0 names inflight instants `<t>.deltacommit.inflight`, `<t>.compaction.inflight`,
    and plain `<t>.inflight` for a copy-on-write commit; completed ones `<t>_<end>.<action>`.
    """
    suffix = ".inflight" if action == "commit" else f".{action}.inflight"

    def seen(_log: str) -> bool:
        for timeline in root.glob(f"bronze/{tables}/.hoodie/timeline"):
            names = [p.name for p in timeline.iterdir()]
            completed = {n.split("_")[0] for n in names if "_" in n}
            if any(n.endswith(suffix) and n.count(".") == suffix.count(".") and n.split(".")[0] not in completed
                   for n in names):
                return True
        return False
    return seen


def _log_line(regex: str, after: int = 0) -> Callable[[str], bool]:
    return lambda log: any(int(m.group(1)) >= after for m in re.finditer(regex, log))


def _run_until(cmd: list[str], env: dict[str, str], log_path: Path, point: Callable[[str], bool],
               delay: float = 0.0, timeout: float = 300.0) -> bool:
    """Run the job; SIGKILL its process group once `point` holds (after `delay`). True if killed."""
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(cmd, env=env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if point(log_path.read_text(errors="replace")):
                time.sleep(delay)
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return True
            time.sleep(0.02)
        assert proc.poll() is not None, "ingest did not finish in time"
        return False
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_sigkill_at_any_point_then_restart_gives_the_model(broker, spark, tmp_path) -> None:
    root = tmp_path / "lake"
    env = {**os.environ, "LAKEHOUSE_ROOT": str(root), "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap}
    cmd = [sys.executable, "-m", "pipelines.cli", "ingest", "--once", "--max-offsets-per-trigger", "400"]
    source = ShopSource(2027)
    cfg = WorkloadConfig(seed=2027, customers=150, orders=400, changes=1200, malformed_fraction=0.02,
                         replay_runs=2)
    ensure_topics(broker.bootstrap)
    sent = source.snapshot(cfg) + source.changes(cfg)
    produce(sent, broker.bootstrap)

    kill_points = [
        ("while the JVM starts", lambda log: True, 2.0),
        ("inside a micro-batch", _log_line(r"batch (\d+): started", after=1), 1.0),
        ("during a delta commit to a bronze table", _inflight(root, "*", "deltacommit"), 0.0),
        ("between batches", _log_line(r"batch (\d+): \d+ records in", after=0), 0.0),
        ("during a commit to a delete ledger", _inflight(root, "_deletes/*", "commit"), 0.0),
        ("during a commit to the dead-letter store", _inflight(root, "_dead_letters", "commit"), 0.0),
        ("during an inline compaction", _inflight(root, "*", "compaction"), 0.0),
        ("inside a micro-batch, later", _log_line(r"batch (\d+): started", after=2), 2.5),
    ]
    killed = []
    more_cfg = WorkloadConfig(seed=2027, changes=400, malformed_fraction=0.02, replay_runs=1)
    for i, (name, point, delay) in enumerate(kill_points):
        if _run_until(cmd, env, tmp_path / f"run{i}.log", point, delay):
            killed.append(name)
        # More changes, with replays of older events, arrive between crashes: every run has a backlog.
        more = source.changes(more_cfg)
        produce(more, broker.bootstrap)
        sent += more
    assert len(killed) >= 6, f"only {len(killed)} of {len(kill_points)} kills landed: {killed}"

    final = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert final.returncode == 0, final.stdout[-3000:] + final.stderr[-3000:]
    expected, lsns = fold_with_lsn(sent)
    assert expected == source.state
    assert_bronze_equals_model(spark, str(root), expected, lsns)
    letters = dead_letters(str(root))
    assert len(letters) == sum(is_malformed(m) for m in sent)
    assert len({d["position"] for d in letters}) == len(letters)
