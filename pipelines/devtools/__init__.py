"""What development, tests and benchmarks need around the pipeline, and production does not.

The shop workload's generator, the local Kafka broker, the real source (PostgreSQL + Debezium),
the S3-compatible store, a Spark standalone cluster, a Hive Metastore, Prometheus and its
Pushgateway run on 127.0.0.1, and `lakehouse bench`. The EMR bundle ships without this package
(pipelines.deploy.package): a cluster reads a real Kafka and a real S3.
"""

from __future__ import annotations

import click


def commands() -> list[click.Command]:
    """The CLI groups of the dev tools: `generate`, `source`, `kafka`, `s3`, `cluster`, `metrics`, `bench`."""
    from pipelines.devtools.bench.cli import bench
    from pipelines.devtools.generator.cli import generate
    from pipelines.devtools.kafka_local import kafka
    from pipelines.devtools.object_store import s3
    from pipelines.devtools.pg_source_cli import source
    from pipelines.devtools.prometheus import metrics
    from pipelines.devtools.spark_cluster import cluster

    return [generate, source, kafka, s3, cluster, metrics, bench]


def catalog_commands() -> list[click.Command]:
    """`catalog up` and `catalog down`: the local Hive Metastore, beside the pipeline's `catalog status`, `sync`."""
    from pipelines.devtools.metastore import down, up

    return [up, down]
