"""The lake's layout that every layer reads and writes: the metadata columns on bronze rows and in
the delete ledgers, Hudi's delete flag and the keys the pipeline adds to each commit's metadata
(which readers use to find positions, batches and erasures).
"""

from __future__ import annotations

import re

DELETED_FLAG = "_hoodie_is_deleted"
# CDC metadata kept on every bronze row (and ledger row).
META_COLUMNS = ("_op", "_lsn", "_source_ts", "_tx_id", "_kafka_partition", "_kafka_offset", "_kafka_ts",
                "_ingested_at")
# A ledger row: the table's key columns, then these.
LEDGER_COLUMNS = ("_lsn", "_source_ts", "_tx_id", "_kafka_partition", "_kafka_offset", "_kafka_ts",
                  "_ingested_at")
# Commit metadata (Hudi adds every write option starting with the commit-metadata prefix, "_").
BATCH_ID_META = "_lakehouse.batch_id"
# The stream's Kafka position after the batch, {"topic/partition": next offset}, for every
# partition the stream has consumed from: where a lost checkpoint resumes.
POSITIONS_META = "_lakehouse.kafka_positions"
# The stream's position up to which every dead letter is in the store ({"topic/partition": next
# offset}): behind POSITIONS_META while the writer holds letters back (pipelines.ingest.held_letters).
DEAD_LETTERS_META = "_lakehouse.dead_letters_through"
# The erasure registry's version (completion time of its newest commit) the batch filtered
# with: an erasure finds the batches that may have read an older one (pipelines.gdpr.erase).
REGISTRY_META = "_lakehouse.erasure_registry"
# Hashes of the Kafka Connect schemas (schemas.enable=true; xxhash64 of the schema's JSON text) whose
# row shapes the table has applied: a record of one of them needs no schema decision (`parse_events`).
# Hashes written by an older parser match nothing and cost one decision, which changes nothing.
DECLARED_META = "_lakehouse.declared_shapes"
# The bucket count of bronze main's bucket index that the commit hashed its keys with (pipelines.lake.buckets).
BUCKETS_META = "_lakehouse.buckets"


# --------------------------------------------------------------------------- paths

def table_path(layer: str, table: str, root: str) -> str:
    """`<root>/<layer>/<table>`, the contract's location of every table."""
    return f"{root.rstrip('/')}/{layer}/{table}"


# `<layer>/<table>` or `<layer>/_<kind>/<table>` at the end of a table's path.
_IN_LAKE = re.compile(r"(?:^|/)((?:bronze|silver|gold)/(?:_[^/]+/)?[^/]+)/*$")


def lake_relative(path: str) -> str:
    """A table's path relative to its lake root (`silver/orders`); any other path as it is.

    What a checkpoint names the table it read by: the same table keeps its name when the
    lake is reached by another root (`./lake` copied to `s3://lake/prod`, `s3a://` for `s3://`).
    """
    return m.group(1) if (m := _IN_LAKE.search(path)) else path


def main_path(table: str, root: str) -> str:
    """bronze/<table>: the live rows (merge-on-read)."""
    return table_path("bronze", table, root)


def ledger_path(table: str, root: str) -> str:
    """bronze/_deletes/<table>: the newest applied delete per key."""
    return table_path("bronze", f"_deletes/{table}", root)


def changelog_path(table: str, root: str) -> str:
    """bronze/_changelog/<table>: every change ingest applied, appended per batch (what silver reads)."""
    return table_path("bronze", f"_changelog/{table}", root)


def dead_letter_path(root: str) -> str:
    return table_path("bronze", "_dead_letters", root)


def ingest_checkpoint_path(root: str) -> str:
    """Structured Streaming's offset checkpoint of the ingest stream."""
    return f"{root.rstrip('/')}/_checkpoints/ingest"


def silver_path(table: str, root: str) -> str:
    return table_path("silver", table, root)


def quarantine_path(table: str, root: str) -> str:
    return table_path("silver", f"_quarantine/{table}", root)


def gold_path(table: str, root: str) -> str:
    return table_path("gold", table, root)


def gdpr_path(root: str) -> str:
    """`<root>/_gdpr`: the erasure registry, certificates and audit log (no personal data)."""
    return f"{root.rstrip('/')}/_gdpr"


def membership_path(root: str) -> str:
    """`<root>/_source/publication.json`: each declared table's publication membership when the lake last matched
    the source (pipelines.source.membership)."""
    return f"{root.rstrip('/')}/_source/publication.json"


def lost_path(root: str) -> str:
    """`<root>/_source/lost.jsonl`: the Kafka ranges accepted as lost (`lakehouse ingest --accept-lost`), one JSON
    line each (pipelines.ingest.lost)."""
    return f"{root.rstrip('/')}/_source/lost.jsonl"
