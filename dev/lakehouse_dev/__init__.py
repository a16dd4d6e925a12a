"""What development, tests and benchmarks need around the pipeline, and production does not.

The shop workload's generator, the local Kafka broker, the real source (PostgreSQL + Debezium),
the S3-compatible store, a Spark standalone cluster, a Hive Metastore, Prometheus and its
Pushgateway on 127.0.0.1, and the benchmarks: `lakehouse dev ...` (lakehouse_dev.cli). A
distribution of its own (dev/pyproject.toml): the product never imports it, and neither the EMR
bundle nor a production install carries it.
"""
