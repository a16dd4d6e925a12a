"""Lakehouse CDC pipeline: Debezium change events on Kafka into Apache Hudi tables.

One sub-package per layer, each importing only from the layers below it:
`cli` (the `lakehouse` commands) on top; `gdpr` (erasure and its proof), `services` (table
services, data quality) and `deploy` (jobs on the local or EMR target, the stream's supervision,
the EMR bundle); `transform` (silver, gold, change feeds); `ingest` (Kafka -> bronze);
`metastore` (tables by name, SQL) and `monitoring` (metrics, lineage); `runtime` (settings,
console, processes, the Spark session); and `lake` at the bottom (the contract, the declaration,
the catalog of tables, storage, timelines, the lake's layout). The dev tools (generator, local
services, benchmarks) are a distribution of their own, `dev/lakehouse_dev`, which nothing here
imports.
"""
