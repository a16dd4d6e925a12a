"""Bronze main's per-table Hudi options (`buckets`, `compact_every`) reach every writer of the table, and a bucket
count other than the one a table was written with is refused before a key is hashed with it."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.errors import DeclarationError
from pipelines.lake.buckets import check_buckets
from pipelines.lake.catalog import lake_table, main_options, writer_options
from pipelines.lake.declaration import parse

pytestmark = pytest.mark.unit

DECL = {"source": {"topic_prefix": "erp"},
        "tables": {"events": {"source": "app.events", "key": ["id"], "buckets": 16, "compact_every": 3},
                   "users": {"source": "app.users", "key": ["id"]}}}


def test_a_table_s_own_options_reach_the_stream_and_every_other_writer_and_the_rest_keep_the_project_s() -> None:
    decl = parse(DECL)
    events, users = writer_options(lake_table("bronze/events", decl)), writer_options(lake_table("bronze/users", decl))
    assert events["hoodie.bucket.index.num.buckets"] == "16"
    assert events["hoodie.compact.inline.max.delta.commits"] == "3"
    # What the stream's batches pass is what the services and the erasure pass (writer_options).
    assert main_options(decl.table("events")).items() <= events.items()
    assert users["hoodie.bucket.index.num.buckets"] != "16"
    assert "hoodie.bucket.index.num.buckets" not in writer_options(lake_table("bronze/_changelog/events", decl))


def _files(folder: Path, *buckets: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for b in buckets:  # a base file and a log file of the bucket's file group, named as Hudi names them
        file_id = f"{b:08d}-1c9e2b8a-7d41-4b6e-9a55-0f3e2d1c0b9a-0"
        (folder / f"{file_id}_0-10-20_20261203101010101.parquet").write_bytes(b"")
        (folder / f".{file_id}_20261203101010101.log.1_0-30-40").write_bytes(b"")


def test_a_changed_bucket_count_is_refused_naming_the_table_both_counts_and_the_way_out(tmp_path: Path) -> None:
    options = writer_options(lake_table("bronze/events", parse(DECL)))
    table = tmp_path / "events"
    _files(table, 0, 5, 15)
    check_buckets("bronze/events", str(table), options, "16")  # as recorded
    with pytest.raises(DeclarationError, match=r"bronze/events: its bucket index was written with 8 buckets, and 16"
                                               r" are declared now .*declare 8 again, or rebuild"):
        check_buckets("bronze/events", str(table), options, "8")
    # A table written before the count was recorded: its files' buckets bound it from below.
    check_buckets("bronze/events", str(table), options, None)
    _files(table, 20)
    with pytest.raises(DeclarationError, match="written with at least 21 buckets, and 16 are declared"):
        check_buckets("bronze/events", str(table), options, None)
    # Nothing written yet, or a writer that hashes nothing: nothing to refuse.
    check_buckets("bronze/events", str(tmp_path / "new"), options, None)
    check_buckets("bronze/_changelog/events", str(table), writer_options(
        lake_table("bronze/_changelog/events", parse(DECL))), "8")
