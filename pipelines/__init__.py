"""Lakehouse CDC pipeline: Debezium change events on Kafka into Apache Hudi tables.

One sub-package per layer: `ingest` (Kafka -> bronze), `transform` (silver, gold, change
feeds), `services` (table services, data quality), `gdpr` (erasure and its proof), `deploy`
(jobs on the local or EMR target, the stream's supervision, the EMR bundle) and `devtools`
(generator, local services, benchmarks; not shipped to EMR). Beside them: the CLI, the table
catalog (`catalog`), the contract, and what every layer shares (settings, console, the Spark
session, storage, timeline reads).
"""
