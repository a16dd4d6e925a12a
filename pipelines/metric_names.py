"""The pipeline's Prometheus metrics, named once: the exporters use these, the alert rules refer to them.

The alerting rules (docker/prometheus/alerts.yml) are written before and beside the exporters,
so the names, kinds and labels are fixed here and nowhere else; tests/test_alert_rules.py fails
when a rule names a metric this module does not define. Names follow Prometheus' conventions:
the `lakehouse_` prefix, the unit in the name (`_seconds`, `_bytes`, `_records`, `_rows`), `_total`
for counters and only for them.

A counter counts from the start of the process that exports it; `rate()` and `increase()` take a
restart (a reset to 0) in their stride. A batch job that pushes one to the Pushgateway pushes what
it has counted over all its runs, not one run's count: a push replaces the last, and two runs
that counted the same would look like no increase.

Pure standard library: the stream's exporter, the batch jobs and the Airflow environment import it.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

Kind = Literal["counter", "gauge", "histogram"]


class Metric(NamedTuple):
    """A metric's name, kind, label names, and help text (the exporter's HELP line)."""

    name: str
    kind: Kind
    labels: tuple[str, ...]
    help: str


TABLE_FRESHNESS = Metric(
    "lakehouse_table_freshness_seconds", "gauge", ("table",),
    "How far a bronze table is behind its source: the age of its oldest change read and not yet committed, "
    "0 when none waits (a quiet table is not stale).")
TABLE_FRESHNESS_TARGET = Metric(
    "lakehouse_table_freshness_target_seconds", "gauge", ("table",),
    "The table's freshness target: `freshness_seconds` of its declaration.")
STREAM_HEARTBEAT = Metric(
    "lakehouse_stream_heartbeat_timestamp_seconds", "gauge", (),
    "Unix time of the ingest stream's last heartbeat (pipelines/ingest/stream.py).")
DEAD_LETTERS = Metric(
    "lakehouse_dead_letters_total", "counter", ("table",),
    "Records ingest could not use, counted as a batch finds them (the dead-letter table gets them then or, "
    "held back, within a minute).")
QUARANTINED_ROWS = Metric(
    "lakehouse_quarantined_rows_total", "counter", ("table",),
    "Rows the silver rules rejected into the table's quarantine.")
SILVER_CHECKED_ROWS = Metric(
    "lakehouse_silver_checked_rows_total", "counter", ("table",),
    "Rows the silver rules checked, accepted or quarantined: the quarantine ratio's denominator.")
ERASURE_OLDEST_PENDING_AGE = Metric(
    "lakehouse_erasure_oldest_pending_age_seconds", "gauge", (),
    "Age of the oldest erasure request waiting in the inbox, 0 when it is empty.")
BATCH_RECORDS = Metric(
    "lakehouse_batch_records_total", "counter", ("table",),
    "Kafka records the stream's micro-batches read for the table.")
BATCH_BYTES = Metric(
    "lakehouse_batch_bytes_total", "counter", ("table",),
    "Bytes of Kafka record values the stream's micro-batches read for the table.")
BATCH_DURATION = Metric(
    "lakehouse_batch_duration_seconds", "histogram", ("phase",),
    "Seconds a micro-batch spent in each phase of its line (read+parse, schema, tables, ...; a table's own, "
    "such as plan or changelog, once per table; total: the whole batch).")
COMMITS = Metric(
    "lakehouse_commits_total", "counter", ("table",),
    "Commits the stream completed on the table: its change log and main table, committed side by side, "
    "count one.")
KAFKA_LAG = Metric(
    "lakehouse_kafka_lag_records", "gauge", ("topic",),
    "Records on the topic's partitions after where the stream's newest batch ended (Spark's progress); "
    "what it read and lets wait shows in the tables' freshness.")

ALL: tuple[Metric, ...] = (TABLE_FRESHNESS, TABLE_FRESHNESS_TARGET, STREAM_HEARTBEAT, DEAD_LETTERS, QUARANTINED_ROWS,
                           SILVER_CHECKED_ROWS, ERASURE_OLDEST_PENDING_AGE, BATCH_RECORDS, BATCH_BYTES, BATCH_DURATION,
                           COMMITS, KAFKA_LAG)

# The series a histogram is exported as, besides its name; a query names one of them.
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")


def series_names() -> frozenset[str]:
    """Every series name the metrics are exported under (a histogram's three), what a PromQL query may name."""
    return frozenset(m.name + suffix for m in ALL
                     for suffix in (HISTOGRAM_SERIES if m.kind == "histogram" else ("",)))
