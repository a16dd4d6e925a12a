"""Lakehouse CDC pipeline: Debezium change events on Kafka into Apache Hudi tables."""
