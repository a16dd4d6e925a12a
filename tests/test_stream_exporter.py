"""The stream's exporter on its own (no JVM, no Kafka): batch reports and heartbeats into prometheus_client's
metrics, Spark's progress into lag per topic, its HTTP endpoint. tests/test_stream_metrics.py scrapes it from
a real stream with the real Prometheus; this pins what that run cannot make happen at will (a lag of a given
size, a table no longer declared, a port in use).
"""

from __future__ import annotations

import urllib.request

import pytest

from pipelines.errors import StreamError
from pipelines.ingest.batch import BatchReport, TableRead
from pipelines.ingest.exporter import TOTAL_PHASE, StreamExporter, kafka_lag
from pipelines.monitoring import metric_names as m
from pipelines.runtime.local_process import HOST, free_port, port_open

pytestmark = pytest.mark.unit

# The Kafka source's part of a StreamingQueryProgress as PySpark 3.5.7's `query.lastProgress` gave it after the
# first batch of tests/test_stream_metrics.py (96 of 209 records read): offsets parsed from their JSON, Spark's
# own lag figures as strings, over the 6 partitions of both topics at once (18.83 * 6 = 113 records).
PROGRESS = {
    "batchId": 0,
    "numInputRows": 96,
    "sources": [{
        "description": "KafkaV2[Subscribe[shop.public.customers, shop.public.orders]]",
        "startOffset": None,
        "endOffset": {"shop.public.orders": {"2": 15, "1": 23, "0": 26},
                      "shop.public.customers": {"2": 5, "1": 14, "0": 13}},
        "latestOffset": {"shop.public.orders": {"2": 33, "1": 49, "0": 56},
                         "shop.public.customers": {"2": 12, "1": 31, "0": 28}},
        "numInputRows": 96,
        "inputRowsPerSecond": 0.0,
        "processedRowsPerSecond": 7.132773608737648,
        "metrics": {"avgOffsetsBehindLatest": "18.833333333333332", "maxOffsetsBehindLatest": "30",
                    "minOffsetsBehindLatest": "7"},
    }],
}


def value(exporter: StreamExporter, name: str, **labels: str) -> float | None:
    return exporter.registry.get_sample_value(name, labels)


def test_reports_become_counters_per_table_and_observations_per_phase() -> None:
    exporter = StreamExporter()
    batch = BatchReport(7, 8.94, 130, {"orders": {"upsert": 90, "delete": 5, "dead": 2}, "customers": {"waiting": 30},
                                       "dead_letters": {"held": 2}},
                        {"read+parse": 2.7, "schema": 0.3, "orders.plan": 0.8, "orders.table": 3.0, "tables": 4.2},
                        {"orders": TableRead(98, 51_000, 2), "customers": TableRead(32, 9_000, 0)})
    exporter.batch(batch)
    # Between batches: customers' waiting changes, committed; nothing read, no micro-batch of its own.
    exporter.batch(BatchReport(7, 3.1, 0, {"customers": {"upsert": 30}}, {"customers.plan": 0.5, "tables": 3.0}),
                   between=True)
    exporter.batch(BatchReport(8, 1.0, 1, {"orders": {"stale": 1}}, {"read+parse": 0.6},
                               {"orders": TableRead(1, 400, 0)}))

    assert value(exporter, m.BATCH_RECORDS.name, table="orders") == 99
    assert value(exporter, m.BATCH_RECORDS.name, table="customers") == 32
    assert value(exporter, m.BATCH_BYTES.name, table="orders") == 51_400
    assert value(exporter, m.DEAD_LETTERS.name, table="orders") == 2
    assert value(exporter, m.DEAD_LETTERS.name, table="customers") == 0
    # A commit: upserts or deletes; waiting or stale alone is none.
    assert value(exporter, m.COMMITS.name, table="orders") == 1
    assert value(exporter, m.COMMITS.name, table="customers") == 1
    assert value(exporter, m.COMMITS.name, table="dead_letters") is None

    def phase(name: str) -> tuple[float | None, float | None]:
        return (value(exporter, f"{m.BATCH_DURATION.name}_count", phase=name),
                value(exporter, f"{m.BATCH_DURATION.name}_sum", phase=name))

    assert phase("read+parse") == (2, pytest.approx(3.3))
    assert phase("plan") == (2, pytest.approx(1.3))  # orders' in batch 7, customers' between batches
    assert phase("table") == (1, 3.0)
    assert phase("tables") == (2, pytest.approx(7.2))
    assert phase(TOTAL_PHASE) == (2, pytest.approx(9.94))  # the micro-batches only
    assert phase("orders.plan") == (None, None)
    assert value(exporter, f"{m.BATCH_DURATION.name}_bucket", phase=TOTAL_PHASE, le="10.0") == 2
    assert value(exporter, f"{m.BATCH_DURATION.name}_bucket", phase=TOTAL_PHASE, le="5.0") == 1


def test_a_heartbeat_sets_freshness_lag_and_its_time() -> None:
    exporter = StreamExporter()
    tables = {"orders": {"target": 15, "waiting": 0, "age": None, "committed_at": None},
              "customers": {"target": 600, "waiting": 12, "age": 31.5, "committed_at": 1.0}}
    exporter.beat(1_800_000_000.5, tables, None)
    assert value(exporter, m.STREAM_HEARTBEAT.name) == 1_800_000_000.5
    assert value(exporter, m.TABLE_FRESHNESS.name, table="orders") == 0  # nothing waits: not stale
    assert value(exporter, m.TABLE_FRESHNESS.name, table="customers") == 31.5
    assert value(exporter, m.TABLE_FRESHNESS_TARGET.name, table="customers") == 600
    # Every table's counters from the first heartbeat, at 0.
    assert value(exporter, m.DEAD_LETTERS.name, table="orders") == 0
    assert value(exporter, m.COMMITS.name, table="customers") == 0
    assert value(exporter, m.KAFKA_LAG.name, topic="shop.public.orders") is None  # no progress yet

    exporter.beat(1_800_000_010.5, {"orders": tables["orders"]}, PROGRESS)
    assert value(exporter, m.KAFKA_LAG.name, topic="shop.public.orders") == 74
    assert value(exporter, m.KAFKA_LAG.name, topic="shop.public.customers") == 39
    # customers is no longer declared: its gauges go, rather than stay at their last value.
    assert value(exporter, m.TABLE_FRESHNESS.name, table="customers") is None
    assert value(exporter, m.TABLE_FRESHNESS_TARGET.name, table="customers") is None
    exporter.beat(1_800_000_020.5, {"orders": tables["orders"]},
                  {"sources": [{**PROGRESS["sources"][0], "latestOffset": {"shop.public.orders": {"0": 40}},
                                "endOffset": {"shop.public.orders": {"0": 40}}}]})
    assert value(exporter, m.KAFKA_LAG.name, topic="shop.public.orders") == 0
    assert value(exporter, m.KAFKA_LAG.name, topic="shop.public.customers") is None


def test_kafka_lag_is_per_topic_what_sparks_own_figures_sum_to() -> None:
    lag = kafka_lag(PROGRESS)
    assert lag == {"shop.public.orders": 18 + 26 + 30, "shop.public.customers": 7 + 17 + 15}
    # Spark's own figures are over the 6 partitions together: their mean times their count is the same total.
    spark = PROGRESS["sources"][0]["metrics"]
    assert sum(lag.values()) == round(float(spark["avgOffsetsBehindLatest"]) * 6)
    assert kafka_lag(None) is None and kafka_lag({"sources": []}) is None
    # Offsets as JSON text (how the progress' own `json()` spells them), and a source that planned nothing yet.
    text = {"sources": [{"endOffset": '{"t": {"0": 4}}', "latestOffset": '{"t": {"0": 9, "1": 2}}'}]}
    assert kafka_lag(text) == {"t": 5}  # a partition without an end offset is not counted
    assert kafka_lag({"sources": [{"endOffset": None, "latestOffset": None}]}) is None


def test_the_exporter_serves_its_metrics_and_a_taken_port_fails_naming_it() -> None:
    port = free_port()
    exporter = StreamExporter.serve(port)
    try:
        assert exporter.port == port
        exporter.batch(BatchReport(0, 1.0, 3, {"orders": {"upsert": 3}}, {"tables": 0.5},
                                   {"orders": TableRead(3, 300, 0)}))
        with urllib.request.urlopen(f"http://{HOST}:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
        assert f'{m.BATCH_RECORDS.name}{{table="orders"}} 3.0' in text
        assert f"# TYPE {m.BATCH_DURATION.name} histogram" in text
        assert "_created" not in text
        with pytest.raises(StreamError, match=f"cannot listen on {HOST}:{port}"):
            StreamExporter.serve(port)
    finally:
        exporter.close()
    assert not port_open(port)
