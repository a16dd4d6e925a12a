"""Lakehouse CDC pipeline: Debezium change events on Kafka into Apache Hudi tables.

One sub-package per layer: `ingest` (Kafka -> bronze), `transform` (silver, gold, change
feeds), `services` (table services, data quality), `gdpr` (erasure and its proof), `deploy`
(jobs on the local or EMR target, the stream's supervision, the EMR bundle). The dev tools
(generator, local services, benchmarks) are a distribution of their own, `dev/lakehouse_dev`,
which nothing here imports. Beside them: the CLI, the table
catalog (`catalog`), the contract, and what every layer shares (settings, console, the Spark
session, storage, timeline reads).
"""
