"""The lake's layout that every layer reads and writes: the metadata columns on bronze rows and in
the delete ledgers, Hudi's delete flag and the keys the pipeline adds to each commit's metadata
(which readers use to find positions, batches and erasures).
"""

from __future__ import annotations

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
