"""What a Hudi table holds, read with hudi-rs (no JVM): rows, commits, file groups, log files.

Kept independent of Spark on purpose: `lakehouse status` answers in a second, and the
tests use the same reader to check what Spark wrote.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
from hudi import HudiReadOptions, HudiTable, HudiTableBuilder

from pipelines.lake import storage


@dataclass(frozen=True)
class TableStats:
    path: str
    rows: int
    commits: int
    file_groups: int
    log_files: int
    table_type: str


_COMPLETED = (".commit", ".deltacommit", ".replacecommit")


def has_completed_commit(path: str) -> bool:
    """A readable table: one with a completed commit (a first commit still in flight is not one).

    Asked of the storage, local or an object store alike: a table not written yet (the erasure
    registry before the first erasure) must not be read.
    """
    return any("_" in name and name.endswith(_COMPLETED)
               for name in storage.list_dir(f"{path.rstrip('/')}/.hoodie/timeline"))


def open_table(path: str) -> HudiTable:
    """hudi-rs's handle on the table at `path`, with the storage options its location needs."""
    return HudiTableBuilder.from_base_uri(path).with_storage_options(storage.hudi_storage_options(path)).build()


def read_table(path: str, columns: list[str] | None = None) -> pa.Table:
    """Snapshot of a Hudi table (MOR log files merged, deletes applied) as Arrow."""
    table = open_table(path)
    batches = table.read()
    schema = table.get_schema_with_meta_fields()
    result = pa.Table.from_batches(batches, schema=schema) if batches else schema.empty_table()
    return result.select(columns) if columns else result


def table_stats(path: str) -> TableStats:
    table = open_table(path)
    timeline = table.get_timeline()
    commits = len(timeline.get_completed_commits()) + len(timeline.get_completed_deltacommits()) + len(
        timeline.get_completed_replacecommits())
    slices = table.get_file_slices()
    rows = sum(b.num_rows for b in table.read(HudiReadOptions(projection=["_hoodie_record_key"])))
    return TableStats(path=path, rows=rows, commits=commits, file_groups=len(slices),
                      log_files=sum(len(s.log_file_names) for s in slices), table_type=table.table_type)
