"""The topics an ingest query reads, and where in each it starts.

A query subscribes only to the declared tables' topics that the brokers have when it starts, each partition
from the position bronze's commits record (`starting_offsets`). A topic that does not exist yet (a table just
declared by `source sync`, whose topic Kafka Connect creates with its snapshot's first record) is left out and
the stream starts a new query once it appears (`Subscription.appeared`): Spark's Kafka source asserts that
`startingOffsets` names every partition it is assigned, so a topic created between listing the partitions and
the query's first fetch would fail the query ("If startingOffsets contains specific offsets, you must specify
all TopicPartitions"). Reading only what was listed keeps the two the same.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pyspark.sql import SparkSession
from pyspark.sql.streaming import DataStreamReader

import hudi_configs
from pipelines.ingest.held_letters import EARLIEST
from pipelines.lake.declaration import Declaration
from pipelines.runtime.config import KafkaSettings
from pipelines.runtime.kafka_clients import python_options, spark_options


def kafka_stream(spark: SparkSession, brokers: KafkaSettings, decl: Declaration,
                 tables: tuple[str, ...] | None = None) -> DataStreamReader:
    """The reader of the source topics of `tables` (every table of `decl` if None) as a stream, with the brokers'
    address and authentication and bronze.toml's Kafka options (also the benchmarks' readers)."""
    return (spark.readStream.format("kafka").options(**spark_options(brokers))
            .option("subscribe", ",".join(decl.topic(t) for t in tables or decl.names))
            .options(**hudi_configs.section("bronze", "kafka")))


def starting_offsets(start: dict[str, int], partitions: dict[str, list[int]]) -> str | None:
    """Spark's `startingOffsets` for the stream: each topic partition from `start` ({"topic/partition": offset},
    `BronzeBatchWriter.start`). `partitions` lists every partition of each topic the query reads (Spark wants
    all of them); a partition without a position starts at the earliest offset (-2). None when no table has a
    position, or no partition is known (the first run of a lake; no topic yet): the query starts from the
    earliest (bronze.toml).
    """
    if not any(o >= 0 for o in start.values()):
        return None
    found = {t: {str(p): start.get(f"{t}/{p}", EARLIEST) for p in ps} for t, ps in partitions.items() if ps}
    return json.dumps(found, sort_keys=True) if found else None


def topic_partitions(brokers: KafkaSettings, topics: list[str] | None = None) -> dict[str, list[int]]:
    """The partitions of each of `topics` (every topic if None) that the brokers have; a topic they do not have,
    or have without partitions yet, is not in the answer."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(**python_options(brokers), request_timeout_ms=30000)
    try:
        present = consumer.topics()
        found = {t: sorted(consumer.partitions_for_topic(t) or ()) for t in topics or present if t in present}
        return {t: ps for t, ps in found.items() if ps}
    finally:
        consumer.close()


@dataclass(frozen=True)
class Subscription:
    """What one query reads: the `tables` of the declaration whose topics exist (`partitions`), and the tables
    whose topics do not exist yet (`waiting`), which a later query reads once they do."""

    tables: tuple[str, ...]
    partitions: dict[str, list[int]]
    waiting: tuple[str, ...]

    @classmethod
    def now(cls, brokers: KafkaSettings, decl: Declaration) -> Subscription:
        """The subscription of a query that starts now. With no declared topic present at all, every table is
        read (Spark's source waits for the topics; there is no position to start from either)."""
        partitions = topic_partitions(brokers, [decl.topic(t) for t in decl.names])
        tables = tuple(t for t in decl.names if decl.topic(t) in partitions)
        if not tables:
            return cls(tuple(decl.names), {}, ())
        return cls(tables, partitions, tuple(t for t in decl.names if t not in tables))

    def appeared(self, brokers: KafkaSettings, decl: Declaration) -> list[str]:
        """The waiting tables whose topics the brokers now have (no request when none waits)."""
        if not self.waiting:
            return []
        present = topic_partitions(brokers, [decl.topic(t) for t in self.waiting])
        return [t for t in self.waiting if decl.topic(t) in present]
