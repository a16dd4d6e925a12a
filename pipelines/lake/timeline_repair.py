"""The repair of timeline files a crash cut short on a local disk, read as files: Hudi cannot read such a timeline."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from pipelines.lake import storage
from pipelines.lake.timeline_files import INSTANT_FILE, avro_long

log = logging.getLogger(__name__)

_STATE_RANK = {"requested": 0, "inflight": 1, None: 2}  # None: completed (INSTANT_FILE's `state` is empty)
# Table services whose requested file is their plan (an Avro container), never empty as Hudi writes it.
_PLANNED_ACTIONS = ("compaction", "logcompaction", "clean", "rollback", "clustering", "restore", "indexing")


def is_torn(data: bytes) -> bool:
    """A commit file cut short: empty, or an Avro container (Hudi 1.x's commit metadata) whose
    header is incomplete or that does not end with the header's sync marker (each block does)."""
    if b"Obj\x01".startswith(data):  # empty, or cut inside the magic bytes
        return True
    if not data.startswith(b"Obj\x01"):
        return False  # not Avro: not this writer's format, so not judged here
    try:
        at = 4
        while (count := avro_long(data, at))[0] != 0:  # the header's metadata map, block by block
            items, at = count
            if items < 0:
                at = avro_long(data, at)[1]  # a negative count is followed by the block's size
            for _ in range(abs(items) * 2):  # key and value: length, then bytes
                size, at = avro_long(data, at)
                at += size
        sync = data[count[1]:count[1] + 16]
    except IndexError:
        return True
    return len(sync) < 16 or len(data) < count[1] + 32 or not data.endswith(sync)


def _torn_files(timeline: Path) -> list[Path]:
    """The files of `timeline` that a crash cut short, each the newest state of its instant.

    A completed instant's file always holds its metadata, so an empty one is torn too, and so does a
    table service's requested file, its plan: an empty `compaction.requested` that a SIGKILL leaves
    fails every later read of the table ("Not an Avro data file", tests/test_crash_recovery.py). Any
    other requested or inflight file may be empty (Hudi writes them so for most writes), and is torn
    only when it holds part of an Avro container (a workload profile).
    """
    # instant -> (its newest state's rank, that state's file, whether that file is a table service's plan)
    newest: dict[str, tuple[int, Path, bool]] = {}
    for file in timeline.iterdir():
        if m := INSTANT_FILE.match(file.name):
            rank = _STATE_RANK[m["state"]]
            if rank > newest.get(m["requested"], (-1, file, False))[0]:
                plan = m["state"] == "requested" and m["action"] in _PLANNED_ACTIONS
                newest[m["requested"]] = (rank, file, plan)
    torn = []
    for rank, file, plan in newest.values():
        try:
            data = file.read_bytes()
        except FileNotFoundError:  # archived, cleaned or rolled back meanwhile: not a crash's
            continue
        if (data or plan or rank == _STATE_RANK[None]) and is_torn(data):
            torn.append(file)
    return torn


def _whole_properties(text: str) -> bool:
    # Hudi writes the file in one go, its checksum among the entries: a cut write is empty or lacks entries.
    return "hoodie.table.name=" in text and "hoodie.table.checksum=" in text


def _cut_properties(meta: Path) -> bool:
    """`hoodie.properties` cut short while Hudi rewrote it, beside a whole backup."""
    try:
        return not _whole_properties((meta / "hoodie.properties").read_text(errors="replace")) and \
            _whole_properties((meta / "hoodie.properties.backup").read_text(errors="replace"))
    except FileNotFoundError:  # no file at all Hudi handles itself: it reads the backup
        return False


def _restore_properties(meta: Path) -> None:
    """The backup back in place of the cut `hoodie.properties`, as Hudi's own recovery does for a missing one.

    Hudi changes the file (the metadata table's partitions, on a table's first commits) by copying
    it to the backup, deleting it, writing the new one, then deleting the backup. A SIGKILL while it
    writes can leave an empty file beside a whole backup (tests/test_cluster.py kills executors so):
    Hudi reads an empty file as an old table's properties without a checksum, and every later
    write fails with "Hoodie table not found in path Table does not exist". The backup holds the
    properties before the change, which the next write makes again.
    """
    props, backup = meta / "hoodie.properties", meta / "hoodie.properties.backup"
    log.warning("%s: cut short by a crash while Hudi rewrote it; restored from its backup", props)
    aside = meta / f".hoodie.properties.{os.getpid()}.tmp"
    aside.write_bytes(backup.read_bytes())
    aside.replace(props)
    for gone in (meta / ".hoodie.properties.crc", backup, meta / ".hoodie.properties.backup.crc"):
        gone.unlink(missing_ok=True)


def repair_torn_timeline(path: str) -> None:
    """Step back every instant of `path`'s timeline (and of its metadata table's) whose newest file a crash cut short.

    First, a `hoodie.properties` cut short while Hudi rewrote it is restored from its backup
    (`_restore_properties`).

    On a local disk Hudi writes a timeline file in place (on HDFS it writes a temporary file and
    renames it; an object store's PUT is all or nothing, so there is nothing to do there). A
    SIGKILL while it writes one leaves it cut short, and Hudi cannot read such a timeline: an empty
    completed change-log commit leaves every later read without a schema, and a cut plan (a clean's,
    a compaction's) fails every writer that reads it. Without the cut file
    the instant is one step back, as after a kill a moment earlier: a completed write is inflight
    and the next write rolls it back (its data files and its metadata-table commit), and the
    batch it held, which no commit covers any more, is applied again; an inflight service or
    rollback is requested and runs again from its plan; a cut plan is gone and is planned again.

    A full disk (ENOSPC) cuts these files the same way: Hudi creates the file, then its write
    fails. A disk that fills while a bronze batch completes its commits can leave an empty completed
    delta commit of a main table, a cut completed commit of a change log and a cut metadata-table
    delta commit at once; this repair steps all three back and the next run applies the batch again
    (tests/test_faults_disk.py fills a disk under a main table's commit).
    """
    if storage.is_remote(path):
        return
    local = Path(path.removeprefix("file://").removeprefix("file:"))
    for meta in (local / ".hoodie", local / ".hoodie" / "metadata" / ".hoodie"):
        if _cut_properties(meta):
            time.sleep(2)  # a live writer rewrites the file within milliseconds
            if _cut_properties(meta):
                _restore_properties(meta)
    for timeline in (local / ".hoodie" / "timeline", local / ".hoodie" / "metadata" / ".hoodie" / "timeline"):
        if not timeline.is_dir() or not _torn_files(timeline):
            continue
        time.sleep(2)  # a live writer (table services, another job) finishes such a file within milliseconds
        for file in _torn_files(timeline):
            log.warning("%s: cut short (a crash, or a full disk); removed, its instant steps back a state", file)
            file.unlink(missing_ok=True)
            file.with_name(f".{file.name}.crc").unlink(missing_ok=True)
