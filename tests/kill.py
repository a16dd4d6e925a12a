"""Killing a job at an observed point (an inflight instant on a Hudi timeline), and polling beside a running job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from tests.hudi_files import not_completed

T = TypeVar("T")


def beside_job(look: Callable[[], T]) -> T:
    """`look()`, run again when a folder vanished while it walked the lake.

    The running job deletes folders (a finished instant's markers, a torn table it discards), and
    pathlib's glob raises FileNotFoundError for one deleted between its listing and its descent:
    a polled kill point failed the random-SIGKILL test so.
    """
    while True:
        try:
            return look()
        except FileNotFoundError:
            continue


def inflight(root: Path, tables: str, action: str) -> Callable[[str], bool]:
    """True while an instant of `action` is inflight on a timeline of root/<tables> (a glob).

    Hudi 1.0 names inflight instants `<t>.deltacommit.inflight`, `<t>.compaction.inflight`,
    and plain `<t>.inflight` for a copy-on-write commit; completed ones `<t>_<end>.<action>`.
    """
    suffix = ".inflight" if action == "commit" else f".{action}.inflight"

    def look() -> bool:
        for timeline in root.glob(f"{tables}/.hoodie/timeline"):
            names = [p.name for p in timeline.iterdir()]
            completed = {n.split("_")[0] for n in names if "_" in n}
            if any(n.endswith(suffix) and n.count(".") == suffix.count(".") and n.split(".")[0] not in completed
                   for n in names):
                return True
        return False
    return lambda _log: beside_job(look)


def pending_instants(root: Path) -> list[str]:
    """`table:instant` of every requested or inflight instant, never completed, of the tables under `root`.

    Metadata tables and checksum files aside (tests.hudi_files.not_completed).
    """
    found = []
    for timeline in root.glob("**/.hoodie/timeline"):
        if "/.hoodie/metadata/" in str(timeline):
            continue
        table = str(timeline.parent.parent.relative_to(root))
        found += [f"{table}:{n}" for n in not_completed([p.name for p in timeline.iterdir() if p.is_file()])]
    return sorted(found)


def run_until(cmd: list[str], env: dict[str, str], log_path: Path, point: Callable[[str], bool],
               delay: float = 0.0, timeout: float = 300.0) -> bool:
    """Run the job; SIGKILL its process group once `point` holds (after `delay`). True if killed.

    A run that ends before that must exit 0.
    """
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
        # A run that was not killed ends as operators see it: exit 0.
        assert proc.returncode == 0, f"exit {proc.returncode}: " + log_path.read_text(errors="replace")[-3000:]
        return False
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def command_lines() -> dict[str, str]:
    """Every process's command line now, by pid, its arguments joined by spaces (a process gone meanwhile left
    out): where a secret must never be."""
    lines = {}
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            lines[cmdline.parent.name] = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # gone meanwhile
    return lines


def torn_read(condition: Callable[[], bool]) -> bool:
    """`condition()`, False when hudi-rs met a timeline file the running job was still writing.

    Hudi's commit files are not written atomically on a local disk, so a reader beside a running
    writer can read one half-written: not a wrong table, a read to try again.
    """
    try:
        return condition()
    except Exception as exc:
        if "failed to fill whole buffer" not in str(exc):
            raise
        return False


def wait_while_running(condition: Callable[[], bool], job: subprocess.Popen, log_path: Path,
                       seconds: float = 300, poll: float = 3) -> None:
    """Poll `condition` until it holds; fail at once, with the job's log, if the job stops first."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert job.poll() is None, "the job stopped: " + log_path.read_text()[-3000:]
        if torn_read(condition):
            return
        time.sleep(poll)
    raise AssertionError("timed out; the job's log: " + log_path.read_text()[-3000:])


def bronze_as_model(root: str) -> dict:
    """bronze's live rows in the model's shape (contract columns only), read with hudi-rs."""
    from pipelines.lake.contract import COLUMNS, TABLES
    from tests.lake import bronze_hudi_rs

    return {t: {k: {c: v[c] for c in COLUMNS[t]} for k, v in bronze_hudi_rs(root, t).items()} for t in TABLES}


def wait_caught_up(root: str, expected: dict, log_path: Path, seconds: float = 300) -> None:
    """Poll until bronze, read with hudi-rs, holds the model's live rows `expected`; fail with the stream's log."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if torn_read(lambda: bronze_as_model(root) == expected):
            return
        time.sleep(2)
    raise AssertionError("the stream did not catch up: " + log_path.read_text()[-3000:])


@contextmanager
def running_ingest(env: dict[str, str], log_path: Path, trigger_seconds: float = 2) -> Iterator[subprocess.Popen]:
    """`lakehouse ingest` running continuously, from its first commit to both bronze tables until SIGTERM.

    Leaving the block stops it the way a scheduler does (SIGTERM) and expects a clean exit;
    a failure inside the block kills its whole process group instead.
    """
    from pipelines.lake.contract import TABLES
    from tests.lake import bronze_hudi_rs

    with log_path.open("w") as log_file:
        job = subprocess.Popen([sys.executable, "-m", "pipelines.cli", "ingest", "--trigger-seconds",
                                str(trigger_seconds)], env=env, stdout=log_file, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        wait_while_running(lambda: all(bronze_hudi_rs(env["LAKEHOUSE_ROOT"], t) for t in TABLES), job, log_path)
        yield job
        job.send_signal(signal.SIGTERM)
        assert job.wait(timeout=120) == 0, log_path.read_text()[-3000:]
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
