"""Bronze main's bucket count, which cannot change once the table holds rows.

The bucket index puts a key in file group `hash(key) % count`, and Hudi 1.0.2 keeps the count only in the
writers' options, not in the table. A writer told another count than the table was written with would send a
key's new version, or its delete, to another file group than its old one: the key would then be live twice, or
an erasure's delete would miss it. So every ingest commit records its count (BUCKETS_META), and the writers that
hash keys (the stream at its start, the erasure before its deletes) check their options against the table first.
"""

from __future__ import annotations

from pipelines.errors import DeclarationError
from pipelines.lake.timeline_files import data_files

NUM_BUCKETS = "hoodie.bucket.index.num.buckets"


def bucketed(options: dict[str, str]) -> bool:
    """Whether a writer with `options` hashes keys into a fixed number of buckets."""
    return options.get("hoodie.index.type") == "BUCKET" and NUM_BUCKETS in options


def check_buckets(name: str, path: str, options: dict[str, str], recorded: str | None) -> None:
    """DeclarationError when the bucket count of `options` is not the one bronze main `name` at `path` was written
    with: `recorded` (BUCKETS_META of its newest ingest commit), else, for a table written before counts were
    recorded, at least one more than the highest bucket its files belong to (a file group's id starts with its
    bucket's number)."""
    if not bucketed(options):
        return
    count = int(options[NUM_BUCKETS])
    if recorded is not None:
        if int(recorded) != count:
            raise DeclarationError(_changed(name, recorded, count))
        return
    buckets = {int(f.file_id[:8]) for f in data_files(path) if f.file_id[:8].isdigit()}
    if buckets and max(buckets) >= count:
        raise DeclarationError(_changed(name, f"at least {max(buckets) + 1}", count))


def _changed(name: str, written: str, count: int) -> str:
    return (f"{name}: its bucket index was written with {written} buckets, and {count} are declared now "
            f"(`buckets` of its table in the declaration, else {NUM_BUCKETS} in hudi_configs/bronze.toml). A key's "
            "bucket is its hash modulo the count, so the count of a table holding rows cannot change: declare "
            f"{written.removeprefix('at least ')} again, or rebuild the table under the new count (docs/tables.md, "
            "\"Per-table options\")")
