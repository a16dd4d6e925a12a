"""The pipeline's Prometheus metrics, named once: the exporters use these, the alert rules refer to them.

The alerting rules (docker/prometheus/alerts.yml) are written before and beside the exporters,
so the names, kinds and labels are fixed here and nowhere else; tests/test_alert_rules.py fails
when a rule names a metric this module does not define. Names follow Prometheus' conventions:
the `lakehouse_` prefix, the unit in the name (`_seconds`, `_bytes`, `_records`, `_rows`), `_total`
for counters and only for them.

A counter counts from the start of the process that exports it; `rate()` and `increase()` take a
restart (a reset to 0) in their stride. A batch job that pushes one to the Pushgateway pushes what
it has counted over all its runs, not one run's count: a push replaces the last, and two runs
that counted the same would look like no increase. So each push adds the run's count to the value
its group held (pipelines/monitoring/pushgateway.py reads it back first); a gateway that lost it starts again
from one run's count, a reset like a process's restart. A gauge pushed by a batch job is as of its
last push: a value that must age between runs (how long an erasure request has waited) is pushed
as the time it started, and the rule subtracts it from `time()`.

`job` is the job label the metric comes under: the stream's scrape job, or the batch command that
pushes it (`BATCH`: every batch job pushes it). `lakehouse ingest --once` pushes the stream's
per-table figures under its own job, `lakehouse_ingest`.

Pure standard library: the stream's exporter, the batch jobs and the Airflow environment import it.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

Kind = Literal["counter", "gauge", "histogram"]


# The job labels: the stream's scrape job, and each batch command's push (its Pushgateway group).
STREAM = "lakehouse_stream"
INGEST_ONCE = "lakehouse_ingest"
ETL = "lakehouse_etl"
SERVICES = "lakehouse_services"
QUALITY = "lakehouse_quality"
ERASE = "lakehouse_gdpr_erase"
INBOX = "lakehouse_gdpr_inbox"
RECONCILE = "lakehouse_reconcile"
SOURCE_CHECK = "lakehouse_source_check"
BATCH = "*"


class Metric(NamedTuple):
    """A metric's name, kind, label names, help text (the exporter's HELP line), and the job it comes under."""

    name: str
    kind: Kind
    labels: tuple[str, ...]
    help: str
    job: str = STREAM


TABLE_FRESHNESS = Metric(
    "lakehouse_table_freshness_seconds", "gauge", ("table",),
    "How far a bronze table is behind its source: the age of its oldest change read and not yet committed, "
    "0 when none waits (a quiet table is not stale).")
TABLE_FRESHNESS_TARGET = Metric(
    "lakehouse_table_freshness_target_seconds", "gauge", ("table",),
    "The table's freshness target: `freshness_seconds` of its declaration.")
LAYER_FRESHNESS = Metric(
    "lakehouse_layer_freshness_seconds", "gauge", ("table",),
    "How far a silver or gold table (`silver/orders`) is behind bronze: how long the oldest change that bronze "
    "holds and the table does not has waited, 0 when none waits; from the tables' timelines, read at most every "
    "`[freshness] every_seconds` (pipelines/monitoring/layer_freshness.py).")
LAYER_FRESHNESS_TARGET = Metric(
    "lakehouse_layer_freshness_target_seconds", "gauge", ("table",),
    "The silver or gold table's freshness target (hudi_configs/table_services.toml `[freshness] target_seconds`).")
STREAM_HEARTBEAT = Metric(
    "lakehouse_stream_heartbeat_timestamp_seconds", "gauge", (),
    "Unix time of the ingest stream's last heartbeat (pipelines/ingest/stream.py).")
DEAD_LETTERS = Metric(
    "lakehouse_dead_letters_total", "counter", ("table",),
    "Records ingest could not use, counted as a batch finds them (the dead-letter table gets them then or, "
    "held back, within a minute).")
QUARANTINED_ROWS = Metric(
    "lakehouse_quarantined_rows_total", "counter", ("table",),
    "Rows the silver rules rejected into the table's quarantine (pushed by each etl run, over all runs).", ETL)
SILVER_CHECKED_ROWS = Metric(
    "lakehouse_silver_checked_rows_total", "counter", ("table",),
    "Rows the silver rules checked, accepted or quarantined: the quarantine ratio's denominator.", ETL)
ETL_WRITTEN_ROWS = Metric(
    "lakehouse_etl_written_rows_total", "counter", ("layer", "table"),
    "Rows the etl's commits wrote to a silver or gold table (`layer`: silver, silver_quarantine, gold), from "
    "Hudi's commit metadata: the sum of its write stats' numWrites.", ETL)
ETL_DELETED_ROWS = Metric(
    "lakehouse_etl_deleted_rows_total", "counter", ("layer", "table"),
    "Rows the etl's commits deleted from a silver or gold table (numDeletes of the commits' write stats).", ETL)
ERASURE_OLDEST_PENDING = Metric(
    "lakehouse_erasure_oldest_pending_timestamp_seconds", "gauge", (),
    "Unix time the oldest erasure request waiting in the inbox was filed, 0 when it is empty "
    "(pushed by `gdpr request` and `gdpr erase`; its age is time() minus it).", INBOX)
ERASURE_PENDING = Metric(
    "lakehouse_erasure_pending_requests", "gauge", (),
    "Erasure requests waiting in the inbox.", INBOX)
ERASURE_REQUESTS = Metric(
    "lakehouse_erasure_requests_total", "counter", ("status",),
    "Erasure requests a `gdpr erase` run processed, by outcome (verified, not_verified).", ERASE)
ERASURE_ROWS = Metric(
    "lakehouse_erasure_rows_total", "counter", ("table",),
    "Rows the erasure removed from each table (its certificates' rows_removed).", ERASE)
SERVICE_COMPACTIONS = Metric(
    "lakehouse_compactions_total", "counter", ("table",),
    "Compaction plans the table services executed on the table.", SERVICES)
SERVICE_CLUSTERINGS = Metric(
    "lakehouse_clusterings_total", "counter", ("table",),
    "Clustering plans the table services executed on the table.", SERVICES)
SERVICE_CLEANS = Metric(
    "lakehouse_cleans_total", "counter", ("table",),
    "Cleans the table services completed on the table (a clean with nothing to remove is not one).", SERVICES)
SERVICE_CLEANED_FILES = Metric(
    "lakehouse_cleaned_files_total", "counter", ("table",),
    "Files the table services' cleans deleted from the table.", SERVICES)
SERVICE_DURATION = Metric(
    "lakehouse_table_service_duration_seconds", "gauge", ("table", "service"),
    "Seconds the service took on the table in the last run that ran it.", SERVICES)
SERVICE_FAILURES = Metric(
    "lakehouse_table_service_failures_total", "counter", ("table",),
    "Runs of the table services that failed on the table (the others' tables went on).", SERVICES)
QUALITY_SUITES = Metric(
    "lakehouse_quality_suites_total", "counter", ("table", "outcome"),
    "Quality suites run on the table (its layer/name, the suite's first), by outcome: passed, failed.", QUALITY)
QUALITY_SUITE_PASSED = Metric(
    "lakehouse_quality_suite_passed", "gauge", ("suite",),
    "1 when the suite passed the last time it ran, 0 when it failed.", QUALITY)
RECONCILE_ROWS = Metric(
    "lakehouse_reconcile_rows", "gauge", ("table", "side"),
    "Rows the last reconciliation of the table compared on each side: source (PostgreSQL) and lake (bronze); for "
    "silver/<table> and silver_quarantine/<table>, source is what the declared rules make of bronze.", RECONCILE)
RECONCILE_DRIFT = Metric(
    "lakehouse_reconcile_drift_rows", "gauge", ("table", "kind"),
    "Rows that differed between the lake and the source at the last reconciliation of the table, by kind: "
    "missing (from the lake), extra (only in the lake), differ (values); 0 when it matched.", RECONCILE)
SOURCE_FINDINGS = Metric(
    "lakehouse_source_findings", "gauge", ("check", "severity"),
    "Findings of the last `lakehouse source check`, by check (wal_level, publication, slot, connector, ...) and "
    "severity (error: changes are not captured; warning: a risk); every check is pushed, 0 when it passed.",
    SOURCE_CHECK)
JOB_DURATION = Metric(
    "lakehouse_job_duration_seconds", "gauge", (),
    "Seconds the batch job's last run took, pushed by each run, succeeded or not.", BATCH)
JOB_LAST_SUCCESS = Metric(
    "lakehouse_job_last_success_timestamp_seconds", "gauge", (),
    "Unix time the batch job's last successful run ended.", BATCH)
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

ALL: tuple[Metric, ...] = (
    TABLE_FRESHNESS, TABLE_FRESHNESS_TARGET, LAYER_FRESHNESS, LAYER_FRESHNESS_TARGET, STREAM_HEARTBEAT,
    DEAD_LETTERS, BATCH_RECORDS, BATCH_BYTES,
    BATCH_DURATION, COMMITS, KAFKA_LAG,
    QUARANTINED_ROWS, SILVER_CHECKED_ROWS, ETL_WRITTEN_ROWS, ETL_DELETED_ROWS,
    ERASURE_OLDEST_PENDING, ERASURE_PENDING,
    ERASURE_REQUESTS, ERASURE_ROWS, SERVICE_COMPACTIONS, SERVICE_CLUSTERINGS, SERVICE_CLEANS, SERVICE_CLEANED_FILES,
    SERVICE_DURATION, SERVICE_FAILURES, QUALITY_SUITES, QUALITY_SUITE_PASSED, RECONCILE_ROWS, RECONCILE_DRIFT,
    SOURCE_FINDINGS, JOB_DURATION, JOB_LAST_SUCCESS)
# What `lakehouse ingest --once` pushes of the stream's figures: per table and topic, not the stream's
# heartbeat (a run that ended does not beat; the heartbeat's alert would take it for a hung stream).
INGEST_ONCE_METRICS = (BATCH_RECORDS, BATCH_BYTES, DEAD_LETTERS, COMMITS, TABLE_FRESHNESS, TABLE_FRESHNESS_TARGET,
                       KAFKA_LAG, BATCH_DURATION)

# The series a histogram is exported as, besides its name; a query names one of them.
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")


def series_names() -> frozenset[str]:
    """Every series name the metrics are exported under (a histogram's three), what a PromQL query may name."""
    return frozenset(m.name + suffix for m in ALL
                     for suffix in (HISTOGRAM_SERIES if m.kind == "histogram" else ("",)))
