"""The records a Hudi commit failed to write, read from its commit metadata: one timeline listing and one small
file per commit, no JVM.

Hudi 1.0.2's bulk insert through its row writer (the change logs, main's first commit, the dead letters) catches
a record that fails to write, commits the others, and records the failure only as `totalWriteErrors` in the
write stats of the commit's metadata (apache/hudi#9748); `hoodie.write.ignore.failed=false` does not change that.
So every write of the lake is followed by `check_commit`: a commit with errors is rolled back, nothing of it stays
visible, and `WriteFailed` names the table, the count and the files. The metadata keeps no record keys and no
reasons, only the count per file (with its partition, file id and name); the executor that failed a record logs
its key and the exception (`HoodieRowCreateHandle`: "Failed to write HoodieRecordDelegate{hoodieKey=...}").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipelines.errors import WriteFailed
from pipelines.lake.layout import lake_relative
from pipelines.lake.timeline_files import Instant, instant_metadata, timeline

# Commit metadata (a write option with Hudi's commit-metadata prefix) that marks one write's commit: the
# check reads the commit this write made, not one another writer of the table completed meanwhile.
WRITE_META = "_lakehouse.write"
# How many failing files the error's message lists (the exception's `files` has them all).
LISTED_FILES = 5


@dataclass(frozen=True)
class FileErrors:
    """One file of a commit that lacks records Hudi failed to write into it."""

    partition: str  # "" for a table without partitions
    file: str  # the file's name within its partition (its id where Hudi recorded no name)
    errors: int
    writes: int  # records written to it, as Hudi counts them


def failed_files(metadata: dict[str, Any]) -> list[FileErrors]:
    """The files of a commit (its metadata, as `instant_metadata` reads it) with write errors, in the metadata's order.

    Summed over `partitionToWriteStats`, as Hudi's own `getTotalWriteErrors` does; a metadata without write stats
    (a clean's, a rollback's) has none.
    """
    found = []
    for partition, stats in (metadata.get("partitionToWriteStats") or {}).items():
        for stat in stats or ():
            if errors := stat.get("totalWriteErrors") or 0:
                name = (stat.get("path") or "").rsplit("/", 1)[-1] or stat.get("fileId") or "?"
                found.append(FileErrors(stat.get("partitionPath") or partition or "", name, errors,
                                        stat.get("numWrites") or 0))
    return found


def own_commit(path: str, token: str, since: str) -> tuple[Instant, dict[str, Any]] | None:
    """The completed write of `path` whose commit metadata carries WRITE_META `token`, with its metadata; None when
    the write committed nothing.

    Only writes requested at or after `since` (an instant time taken before the write began) are read, newest
    first: the write's own commit is the first one read unless another writer committed to the table meanwhile.
    """
    for instant in reversed(timeline(path)):
        if instant.requested < since:
            break
        if instant.changes_data:
            metadata = instant_metadata(path, instant)
            if (metadata.get("extraMetadata") or {}).get(WRITE_META) == token:
                return instant, metadata
    return None


def commit_of(path: str, requested: str) -> tuple[Instant, dict[str, Any]] | None:
    """The completed commit of `path` requested at `requested` (a compaction's, a clustering's), with its metadata."""
    for instant in reversed(timeline(path)):
        if instant.requested == requested:
            return (instant, instant_metadata(path, instant)) if instant.is_commit else None
    return None


def check_commit(path: str, instant: Instant, metadata: dict[str, Any], name: str | None,
                 roll_back: Callable[[str], object]) -> None:
    """Raise WriteFailed, after `roll_back(instant.requested)`, when the commit recorded records it failed to write.

    `name` is the table's Hudi name (`hoodie.table.name`), said beside its path in the lake.
    """
    files = failed_files(metadata)
    if not files:
        return
    errors = sum(f.errors for f in files)
    table = lake_relative(path) + (f" ({name})" if name else "")
    listed = ", ".join(f"{f.partition + '/' if f.partition else ''}{f.file}: {f.errors}" for f in files[:LISTED_FILES])
    more = f" and {len(files) - LISTED_FILES} more files" if len(files) > LISTED_FILES else ""
    said = (f"{table}: Hudi failed to write {errors} record(s) of commit {instant.requested} and committed the "
            f"others (errors per file: {listed}{more}). Hudi's commit metadata keeps no record keys or reasons: the "
            "executors' logs name each record and its exception (HoodieRowCreateHandle, \"Failed to write\")")
    kept = tuple((f.partition, f.file, f.errors) for f in files)

    def failure(then: str) -> WriteFailed:
        return WriteFailed(f"{said}. {then}", table=table, instant=instant.requested, errors=errors, files=kept)

    try:
        roll_back(instant.requested)
    except Exception as exc:
        raise failure(f"Rolling the commit back failed ({exc}): it is still visible, roll it back before anything "
                      "reads the table") from exc
    raise failure("The commit was rolled back: nothing of it is visible")
