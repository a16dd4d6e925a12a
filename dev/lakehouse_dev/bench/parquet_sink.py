"""The plain-Parquet limit: the ingest stream's own read and parse, appending rows to Parquet.

No table format, no keys, no merge, no ordering: what is left is reading Kafka, decoding
the envelopes and writing columnar files, which any table format must also do. Ingest
throughput is compared against this run of the same backlog (`lakehouse_dev.bench.ingest`).
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.ingest.parse import dead_letters, parse_events
from pipelines.ingest.plan import change_rows
from pipelines.ingest.schema import Shape
from pipelines.ingest.topics import kafka_stream
from pipelines.lake import contract
from pipelines.runtime.config import KafkaSettings
from pipelines.runtime.declared import read_declaration


def append_batch(root: str):
    """The `foreachBatch` function: per topic, parse; rows and dead letters appended as Parquet."""

    decl = read_declaration()

    def write(batch: DataFrame, batch_id: int) -> None:
        batch = batch.persist()
        try:
            for table in contract.TABLES:
                events = parse_events(batch.filter(F.col("topic") == contract.topic(table)), table, decl).persist()
                try:
                    rows = change_rows(events, Shape.initial(decl.table(table)))
                    rows.write.mode("append").parquet(f"{root}/{table}")
                    dead_letters(events, batch_id).write.mode("append").parquet(f"{root}/_dead_letters")
                finally:
                    events.unpersist()
        finally:
            batch.unpersist()

    return write


def run_parquet_sink(spark: SparkSession, root: str, bootstrap: str) -> None:
    """Consume what is on the topics now (availableNow), like `lakehouse ingest --once`."""
    reader = kafka_stream(spark, KafkaSettings(bootstrap_servers=bootstrap), read_declaration())
    query = (reader.load().writeStream.queryName("parquet_sink")
             .foreachBatch(append_batch(root)).option("checkpointLocation", f"{root}/_checkpoint")
             .trigger(availableNow=True).start())
    query.awaitTermination()
