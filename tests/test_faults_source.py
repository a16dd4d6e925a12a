"""The world around the stream fails (issue 53), the source's side: PostgreSQL restarted while Debezium streams.

Changes are committed in PostgreSQL, and PostgreSQL goes down (a fast shutdown, as a restart for an
upgrade or a failover does) before Debezium has necessarily read them all; it comes back after a
pause, more changes follow. Debezium's connector must resume from its replication slot by itself
(its task restarts after a retriable error, 10 s later). Connect flushes no offsets during the test
(the flush interval is an hour, as in tests/test_real_source.py), so the slot's confirmed position
stays at the snapshot's end and PostgreSQL sends again, on the restart, every change since: Debezium
2.7 skips those it had delivered (its task keeps its last position in memory across its own restart,
WalPositionLocator), so none reached Kafka twice in the runs so far (the count is printed); replays
come from a Connect worker killed before its offset flush, tests/test_real_source.py's case. Bronze
ends equal to the database's own state, read with SQL (the oracle), at each key's newest LSN; the
records on the topics, folded by LSN, give that state too.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pipelines.contract import COLUMNS
from pipelines.devtools import sql_sink
from pipelines.devtools.generator import ShopSource, WorkloadConfig
from pipelines.devtools.kafka_local import KafkaBroker, free_port
from pipelines.devtools.pg_source import RealSource, slot_status
from pipelines.ingest.bronze import run_ingest
from tests.lake import assert_bronze_equals_model, dead_letters
from tests.model import fold_with_lsn, unwrap
from tests.test_real_source import database_state, play, topic_records

pytestmark = pytest.mark.slow

WORKLOAD = WorkloadConfig(seed=44, customers=40, orders=120, changes=200, invalid_fraction=0.1,
                          delete_fraction=0.1, replay_runs=0, malformed_fraction=0.0, other_ops=False)
PAUSE = 5.0


def test_postgres_restarted_while_debezium_streams(spark: SparkSession, broker: KafkaBroker, tmp_path: Path) -> None:
    home = Path(tempfile.mkdtemp(prefix="lakehouse-pg-"))  # PostgreSQL runs as `postgres`: not under pytest's 0700 tmp
    home.chmod(0o755)
    real = RealSource(home, free_port(), free_port(), broker.bootstrap, schemas_enable=True,
                      offset_flush_ms=3_600_000)
    root = str(tmp_path / "lake")
    sim = ShopSource(WORKLOAD.seed)
    try:
        postgres = real.postgres.start()
        dsn = postgres.dsn
        sql_sink.apply(sim.snapshot(WORKLOAD), dsn)
        real.up()
        play(sim.changes(WORKLOAD), dsn, broker.bootstrap)
        # Committed, and PostgreSQL goes down at once: Debezium may not have read them yet.
        sql_sink.apply(sim.changes(WORKLOAD), dsn)
        before = slot_status(real.pg_port)
        postgres.stop()
        down_at = time.monotonic()
        time.sleep(PAUSE)
        postgres.start()
        back = time.monotonic()
        # More changes once it is back: `play` waits until Debezium has delivered the last of them.
        play(sim.changes(WORKLOAD), dsn, broker.bootstrap)
        delivered = time.monotonic() - back
        after = slot_status(real.pg_port)
        assert after is not None and after["active"], f"the connector does not stream from its slot: {after}"
        assert real.connect.status()["connector"]["state"] == "RUNNING", real.connect.status()
        run_ingest(once=True, root=root, bootstrap=broker.bootstrap, spark=spark)
        state = database_state(postgres)
    finally:
        real.down()
        shutil.rmtree(home, ignore_errors=True)

    envelopes = [(m, unwrap(m)[1]) for m, _, _ in topic_records(broker.bootstrap)]
    replays = sum(n - 1 for n in Counter((m.topic, m.key, env["source"]["lsn"])
                                         for m, env in envelopes if env).values())
    print(f"\nPostgreSQL down {back - down_at:.1f} s; the next changes delivered {delivered:.1f} s after it was back; "
          f"{replays} record(s) delivered twice; slot before the stop {before}, at the end {after}")
    ordered = sorted((m for m, env in envelopes if env), key=lambda m: unwrap(m)[1]["source"]["lsn"])
    folded, lsns = fold_with_lsn(ordered)
    assert {t: {k: {c: r[c] for c in COLUMNS[t]} for k, r in rows.items()} for t, rows in folded.items()} == state
    assert state["orders"] and state["customers"]
    assert_bronze_equals_model(spark, root, state, lsns)
    assert dead_letters(root) == []
