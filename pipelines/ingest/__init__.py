"""Ingest: Debezium events from Kafka into bronze, the streaming job (`lakehouse ingest`).

`bronze` is the job (parsing, planning, the Hudi writes, progress in the commits), `schema`
how bronze's columns follow the source's, `stream` the running stream's heartbeat and stop
request that the supervisors (pipelines.deploy) read and write.
"""
