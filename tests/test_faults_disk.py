"""The lake's local disk full in the middle of a bronze commit.

The lake sits on a small tmpfs of its own, a real file system that really fills: a copy of the
shared lake, then new changes on Kafka, then `lakehouse ingest --once` in its own process. The
moment a main table's delta commit of that run is inflight, a ballast file takes every free byte,
so the commit runs out of space half-way (Hudi's data files, then its timeline), not before it
starts. The command must exit non-zero with one line naming the full disk (the lake's path, its
file system, its free space, what to do), keep the whole trace in its log file, and leave nothing
torn: once the ballast is deleted, the next ingest and etl make the lake equal to the model of
everything sent, with no instant left half-written, read by Spark and by hudi-rs alike. An `etl`
on the full disk fails the same way.

Mounting needs root (or CAP_SYS_ADMIN): where `mount` is refused the test skips, saying so.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from lakehouse_dev.generator import WorkloadConfig
from pipelines.lake.table_stats import read_table
from tests.kill import pending_instants
from tests.lake import LakeCopy, assert_bronze_equals_model, assert_lake_equals_model, dead_letters, run_cli
from tests.model import fold_with_lsn, is_malformed

pytestmark = [pytest.mark.slow, pytest.mark.integration]

# The shared lake is about 25 MB; the disk leaves room for the new changes' commits, which the ballast then takes.
DISK_MB = 96


@contextlib.contextmanager
def small_disk(where: Path) -> Iterator[Path]:
    """A tmpfs of DISK_MB mounted at `where`, unmounted after (skip the test where mounting is refused)."""
    where.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "tmpfs", str(where)],
                              capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        pytest.skip("no `mount` command: the lake's small disk cannot be made")
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs for the lake's disk was refused (needs root or CAP_SYS_ADMIN): "
                    f"{(done.stderr.strip() or f'exit {done.returncode}').splitlines()[0]}")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "--lazy", str(where)], check=True)  # a file still open: detach it now


def fill(disk: Path) -> Path:
    """Take every free byte of `disk` with a ballast file (unbuffered writes, ever smaller, until ENOSPC)."""
    ballast = disk / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (1 << 20, 1 << 12, 1):
            chunk = b"\0" * size
            try:
                while True:
                    os.write(fd, chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
    finally:
        os.close(fd)
    return ballast


class FillOnCommit:
    """Fills `disk` (`fill`) the moment a new instant is inflight on one of `tables`' timelines (globs under
    `root`): a thread beside the job, polling every 20 ms. `instant` names it (`<table>:<file>`)."""

    def __init__(self, disk: Path, root: Path, tables: str) -> None:
        self.disk, self.root, self.tables = disk, root, tables
        self.before = self._inflight()
        self.instant: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _inflight(self) -> set[str]:
        found = set()
        for timeline in self.root.glob(f"{self.tables}/.hoodie/timeline"):
            with contextlib.suppress(FileNotFoundError):
                table = timeline.parent.parent.relative_to(self.root)
                found |= {f"{table}:{e.name}" for e in os.scandir(timeline) if e.name.endswith(".inflight")}
        return found

    def _watch(self) -> None:
        while not self._stop.wait(0.02):
            if new := self._inflight() - self.before:
                fill(self.disk)
                self.instant = min(new)
                return

    def __enter__(self) -> FillOnCommit:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_a_full_disk_inside_a_commit_is_named_and_the_next_run_is_exact(spark, lake: LakeCopy, tmp_path) -> None:
    with small_disk(tmp_path / "disk") as disk:
        root = disk / "lake"
        shutil.copytree(lake.root, root)
        lake.produce(lake.source.changes(WorkloadConfig(seed=53, changes=150, malformed_fraction=0.02,
                                                        replay_runs=1)))
        log_file = tmp_path / "ingest.log"
        env = {**os.environ, "LAKEHOUSE_ROOT": str(root), "KAFKA_BOOTSTRAP_SERVERS": lake.bootstrap,
               "LAKEHOUSE_LOG_FILE": str(log_file)}
        # A main table's delta commit (bronze/customers, bronze/orders; not the change logs or dead letters).
        with FillOnCommit(disk, root, "bronze/[!_]*") as filled:
            done = subprocess.run([sys.executable, "-m", "pipelines.cli", "ingest", "--once"], env=env,
                                  capture_output=True, text=True, timeout=600)
        (tmp_path / "ingest.out").write_text(done.stdout + done.stderr)
        assert filled.instant is not None, f"no main table's commit started: {done.stderr[-3000:]}"

        # The command fails, naming the full disk in one line; the whole trace is in its log file.
        assert done.returncode != 0, done.stderr[-3000:]
        message = done.stderr.strip().splitlines()[-1]
        for part in ("ingest failed: no space left on device", f"the lake {root} is on {disk}, 0 B free of",
                     "Free space there (or point LAKEHOUSE_ROOT at a larger disk)", str(log_file)):
            assert part in message, (part, done.stderr[-3000:])
        assert "scratch space" not in message, "a disk with room named as full"
        trace = log_file.read_text(errors="replace")
        assert "java.io.IOException: No space left on device" in trace and "Traceback" in trace
        # Inside the commit: the instant that was inflight when the disk filled never completed.
        assert filled.instant in pending_instants(root), (filled.instant, pending_instants(root))
        # The stream's own files are written aside and renamed: a cut write leaves no part of itself.
        assert not list(root.glob("_checkpoints/*.tmp")), "a heartbeat's cut write left behind"

        # Space freed: the next ingest is exact (in this process: its Spark session is warm).
        (disk / "ballast").unlink()
        again = run_cli("ingest", "--once", env={"LAKEHOUSE_ROOT": str(root),
                                                 "KAFKA_BOOTSTRAP_SERVERS": lake.bootstrap})
        assert again.exit_code == 0, again.output
        expected, lsns = fold_with_lsn(lake.sent)
        assert expected == lake.source.state
        assert_bronze_equals_model(spark, str(root), expected, lsns)
        letters = dead_letters(str(root))
        assert sorted(d["value"] for d in letters) == sorted(m.value for m in lake.sent if is_malformed(m))

        # etl, the disk filled inside its first silver commit: the same line; then, space freed, exact.
        with FillOnCommit(disk, root, "silver/*") as filled:
            etl = run_cli("etl", env={"LAKEHOUSE_ROOT": str(root), "LAKEHOUSE_LOG_FILE": str(tmp_path / "etl.log")})
        assert filled.instant is not None and filled.instant in pending_instants(root), etl.output
        assert etl.exit_code != 0 and "etl failed: no space left on device" in etl.output, etl.output
        assert f"the lake {root} is on {disk}, 0 B free of" in etl.output, etl.output
        (disk / "ballast").unlink()
        assert run_cli("etl", env={"LAKEHOUSE_ROOT": str(root)}).exit_code == 0
        assert_lake_equals_model(spark, str(root), lake.source.state)
        assert not pending_instants(root), "an instant left half-written"
        # hudi-rs reads every table of the lake, its internal ones too.
        for props in root.glob("**/.hoodie/hoodie.properties"):
            if "/.hoodie/metadata/" not in str(props):
                read_table(str(props.parent.parent))
