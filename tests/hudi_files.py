"""What a Hudi table's files say, without Spark or hudi-rs: shared by the tests of both environments."""

from __future__ import annotations

from pathlib import Path


def pending_compactions(table_path: str | Path) -> list[str]:
    """Requested compactions without a completed commit, from the timeline's file names (Hudi 1.x layout)."""
    timeline = Path(table_path) / ".hoodie" / "timeline"
    requested = {f.name.split(".")[0] for f in timeline.glob("*.compaction.requested")}
    completed = {f.name.split("_")[0] for f in timeline.glob("*_*.commit")}
    return sorted(requested - completed)


def not_completed(names: list[str]) -> list[str]:
    """Of a Hudi 1.x timeline's file names, those of instants requested or inflight and never completed.

    A completed instant is `<requested>_<completed>.<action>` and leaves its requested and
    inflight files behind, so only an instant without a completed file counts.
    """
    done = {n.split("_")[0] for n in names if "_" in n}
    return [n for n in names if n[:1].isdigit() and "_" not in n and n.split(".")[0] not in done]


def log_files(table_path: str | Path) -> set[str]:
    """Names of the log files of a non-partitioned merge-on-read table."""
    return {p.name for p in Path(table_path).glob(".*.log.*")}


def committed_log_files(table_path: str | Path) -> set[str]:
    """Log files written by completed delta commits: the only ones a compaction plan takes.

    A log file's name carries its delta commit's instant (`.<file id>_<instant>.log.<version>_<token>`);
    one of a commit still in flight is skipped by Hudi's compaction planner ("No operations").
    """
    timeline = Path(table_path) / ".hoodie" / "timeline"
    completed = {f.name.split("_")[0] for f in timeline.glob("*_*.deltacommit")}
    return {name for name in log_files(table_path) if name.split(".log.")[0].rsplit("_", 1)[-1] in completed}


def deltacommits_since(table_path: str | Path, instant: str) -> int:
    """Delta commits requested after `instant` and completed (Hudi 1.x: `<requested>_<completed>.deltacommit`)."""
    timeline = Path(table_path) / ".hoodie" / "timeline"
    return sum(f.name.split("_")[0] > instant for f in timeline.glob("*_*.deltacommit"))
