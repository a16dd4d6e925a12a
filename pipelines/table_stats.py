"""What a Hudi table holds, read with hudi-rs (no JVM): rows, commits, file groups, log files.

Kept independent of Spark on purpose: `lakehouse status` answers in a second, and the
tests use the same reader to check what Spark wrote.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from hudi import HudiReadOptions, HudiTableBuilder


@dataclass(frozen=True)
class TableStats:
    path: str
    rows: int
    commits: int
    file_groups: int
    log_files: int
    table_type: str


_COMPLETED = (".commit", ".deltacommit", ".replacecommit")


def exists(path: str) -> bool:
    """A readable table: one with a completed commit (a first commit still in flight is not one).

    Remote URIs are taken as existing; the read then says what is wrong.
    """
    if "://" in path:
        return True
    timeline = Path(path) / ".hoodie" / "timeline"
    return timeline.is_dir() and any("_" in p.name and p.suffix in _COMPLETED for p in timeline.iterdir())


def read_table(path: str, columns: list[str] | None = None) -> pa.Table:
    """Snapshot of a Hudi table (MOR log files merged, deletes applied) as Arrow."""
    table = HudiTableBuilder.from_base_uri(path).build()
    batches = table.read()
    schema = table.get_schema_with_meta_fields()
    result = pa.Table.from_batches(batches, schema=schema) if batches else schema.empty_table()
    return result.select(columns) if columns else result


def table_stats(path: str) -> TableStats:
    table = HudiTableBuilder.from_base_uri(path).build()
    timeline = table.get_timeline()
    commits = len(timeline.get_completed_commits()) + len(timeline.get_completed_deltacommits()) + len(
        timeline.get_completed_replacecommits())
    slices = table.get_file_slices()
    rows = sum(b.num_rows for b in table.read(HudiReadOptions(projection=["_hoodie_record_key"])))
    return TableStats(path=path, rows=rows, commits=commits, file_groups=len(slices),
                      log_files=sum(len(s.log_file_names) for s in slices), table_type=table.table_type)
