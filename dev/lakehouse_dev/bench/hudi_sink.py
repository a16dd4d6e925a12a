"""Plain Hudi as the ingest benchmark's reference: Hudi's own Structured Streaming sink.

The reference the benchmark asks for is HoodieStreamer writing an identically configured
MERGE_ON_READ table. HoodieStreamer cannot be had here: Maven Central, as reachable from this
machine, serves no hudi-utilities(-slim)-bundle for Hudi 1.0.x (HTTP 404), and the Spark
bundle the project ships has no `org.apache.hudi.utilities`. The closest plain-Hudi writer
that is in that bundle is `writeStream.format("hudi")` (HoodieStreamingSink): same Kafka
backlog, same table options, Hudi doing all the work.

What it writes: per source table a MERGE_ON_READ table at `<base_path>/<table>` with exactly
the columns of bronze main (the source columns as delivered, `_op`, `_lsn`, `_source_ts`,
`_tx_id`, `_kafka_partition`, `_kafka_offset`, `_kafka_ts`, `_ingested_at`, and the delete
flag `_hoodie_is_deleted`) and every option bronze main is written with
(`pipelines.lake.catalog.bronze_options("table", ...)`: key `id`, precombine `_lsn` with event-time
ordering, bucket index, compaction plans, cleaning...). The envelopes are decoded by the
ingest job's own parser (`parse_events`, `change_rows`), so decoding costs the same.

What it leaves out, by design of a plain sink, so its figure is plain Hudi's and not an
equal of the ingest job's:
- no delete ledger, change log, dead-letter table, erasure filter or commit metadata;
- only records of kind `row` are written: tombstones and `op=m` are dropped (as the job
  does), and so are truncates (their deletes need every key the table holds, which a
  sink cannot read) and malformed records (there is no dead-letter table to keep them);
- ordering is only Hudi's precombine on `_lsn`. Inside a micro-batch that gets the newest
  event per key right, so a one-batch catch-up ends with the right rows. Across
  micro-batches Hudi remembers a delete's LSN only while the delete record sits in an
  uncompacted log file: a delete that met no stored row (the first write of a file group
  drops it) or that compaction merged away leaves nothing of the key, and an older insert
  or update replayed in a later batch brings the row back (`tests/test_bench_hudi_sink.py`
  pins down exactly which keys).

One streaming query per topic, both running at once in one Spark application. A Hudi
streaming sink writes one table, so two tables need two queries; each subscribing to both
topics and filtering would read and decode the whole backlog twice, which the ingest job
(one read, split per batch) does not, and would charge plain Hudi for work it need not do.
Per-topic queries read every record once, like the job, and running them concurrently is
how the two streams would be deployed; it lets one table's driver-side work (timeline,
commit, metadata table) overlap the other's tasks, an advantage the job (tables one after
the other in a batch) does not have, so the reference is if anything flattered.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from pipelines.ingest.parse import parse_events
from pipelines.ingest.plan import change_rows
from pipelines.ingest.schema import Shape
from pipelines.ingest.topics import kafka_stream
from pipelines.lake import contract
from pipelines.lake.catalog import bronze_options, keyed_options
from pipelines.lake.layout import DELETED_FLAG, META_COLUMNS
from pipelines.runtime.config import KafkaSettings
from pipelines.runtime.declared import read_declaration

# What the streaming sink needs on top of bronze main's options. Main's writer plans compactions
# for the job's own thread to run (pipelines/ingest/compactor.py), which the sink does not have;
# the sink's async compaction stays off as well: a catch-up of a few micro-batches plans no
# compaction (one comes every 10 delta commits), so neither side compacts. A failed batch must
# fail the run, not be skipped into a fast figure of nothing.
SINK_OPTIONS = {
    "hoodie.datasource.compaction.async.enable": "false",
    "hoodie.datasource.write.streaming.ignore.failed.batch": "false",
}


def table_path(base_path: str, table: str) -> str:
    return f"{base_path}/{table}"


def sink_options(base_path: str, table: str) -> dict[str, str]:
    """Bronze main's write options for `<base_path>/<table>`, plus the sink's path and checkpoint."""
    return {
        **bronze_options("table", f"hudi_sink_{table}", **keyed_options((contract.PRIMARY_KEY,))),
        **SINK_OPTIONS,
        "path": table_path(base_path, table),
        "checkpointLocation": f"{base_path}/_checkpoints/{table}",
    }


def sink_rows(raw: DataFrame, table: str) -> DataFrame:
    """Kafka records of one table's topic -> rows of bronze main's shape, row changes only.

    `_ingested_at` is the micro-batch's time (Spark fixes `current_timestamp()` per batch),
    as the job stamps one instant per batch.
    """
    decl = read_declaration()
    return change_rows(parse_events(raw, table, decl), Shape.initial(decl.table(table))).select(
        *contract.COLUMNS[table], *[c for c in META_COLUMNS if c != "_ingested_at"],
        F.current_timestamp().alias("_ingested_at"), (F.col("_op") == "d").alias(DELETED_FLAG))


def start(spark: SparkSession, base_path: str, bootstrap: str, table: str) -> StreamingQuery:
    """The streaming query of one table: its topic from earliest, once (availableNow), into Hudi."""
    raw = kafka_stream(spark, KafkaSettings(bootstrap_servers=bootstrap), read_declaration(), (table,)).load()
    return (sink_rows(raw, table).writeStream.format("hudi").queryName(f"hudi_sink_{table}")
            .options(**sink_options(base_path, table)).outputMode("append")
            .trigger(availableNow=True).start())


def run_hudi_sink(spark: SparkSession, base_path: str, bootstrap: str) -> None:
    """Consume what is on both topics now into `<base_path>/customers` and `<base_path>/orders`.

    Returns when both queries have caught up. A failure of either stops the other and
    raises; a batch Hudi fails to write after its retries makes HoodieStreamingSink call
    System.exit(1), which ends the process non-zero too, so a failed run is never a figure.
    """
    queries = [start(spark, base_path, bootstrap, table) for table in contract.TABLES]
    try:
        for query in queries:
            query.awaitTermination()
    finally:
        for query in queries:
            if query.isActive:
                query.stop()
