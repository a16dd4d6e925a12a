"""The world around the stream fails: Kafka goes away under the supervised stream, and comes back.

Two faults, one after the other, on one real broker, one real supervised stream (`lakehouse stream
start`, as the DAG runs it) and real Hudi tables; the stream reaches the broker through Toxiproxy
(the broker advertises the proxy's address on a listener of its own: `KafkaBroker(proxy_port=...)`):

- the broker SIGKILLed while a batch runs, and started again (same ports, same data) after a pause;
  the stream catches up, and goes on with new changes, its status plain healthy;
- then a network blackout between the stream and Kafka: the proxy is disabled, every connection
  through it cut and refused, while a batch runs and while the source goes on writing to the broker.

While Kafka is away, each time, `lakehouse stream status` must name it ("waiting for Kafka at
host:port since ..."). The test ends with bronze equal to the independent model of the source (no
row lost, duplicated or resurrected), every malformed record a dead letter exactly once, and no
commit left in flight.

A stream gets through such an outage in one of two ways. An outage shorter than Spark's Kafka clients'
timeouts is ridden through inside the query: the batch waits and goes on. A longer one fails the query
(a task's fetch gives up after `kafkaConsumer.pollTimeoutMs`, 120 s by default; the driver's offset
requests after three tries of `kafka.default.api.timeout.ms`), and the stream must wait for Kafka and
start the query again itself, from the positions in bronze's commits. The stream here has those
timeouts shortened to 5 s, so that the blackout fails the query: the log must show the query started
again after it. (The broker's pause may fail it too, or be ridden through; the count is printed.
The two faults share one stream to save the suite a broker, a stream JVM and a first batch, so the
ride-through at Spark's default timeouts is not exercised here.)
How long the stream takes to catch up once Kafka is back is printed (`-s`), not asserted: it depends
on the machine's load. The pauses are shorter than the soak's (30 s, 60 s) to keep the suite's
budget; LAKEHOUSE_FAULT_PAUSE and LAKEHOUSE_FAULT_BLACKOUT set them.
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from lakehouse_dev.generator import Message, ShopSource, WorkloadConfig, ensure_topics, produce
from lakehouse_dev.kafka_local import KafkaBroker
from lakehouse_dev.supervised import Supervised
from lakehouse_dev.toxiproxy import Proxy, Toxiproxy
from pipelines.runtime.local_process import free_port
from tests.kill import pending_instants, wait_caught_up
from tests.lake import assert_bronze_equals_model, dead_letters
from tests.model import fold_with_lsn, is_malformed

pytestmark = [pytest.mark.slow, pytest.mark.integration]

PAUSE = float(os.environ.get("LAKEHOUSE_FAULT_PAUSE", "15"))
BLACKOUT = float(os.environ.get("LAKEHOUSE_FAULT_BLACKOUT", "20"))

# A test-sized stream: heartbeats (and Kafka probes) every second, probes that wait a second.
STREAM_LIMITS = """
[stream.health]
heartbeat_seconds = 1
dead_after_seconds = 30
[stream.supervisor]
start_timeout_seconds = 180
stop_timeout_seconds = 120
kill_timeout_seconds = 30
[stream.kafka]
probe_seconds = 1
"""


# Spark's Kafka clients giving up after 5 s instead of 60 (requests) and 120 (a task's fetch).
SHORT_KAFKA_TIMEOUTS = """
[bronze.kafka]
"kafka.request.timeout.ms" = 5000
"kafka.default.api.timeout.ms" = 5000
"kafkaConsumer.pollTimeoutMs" = 5000
"""


def mid_batch(stream: Supervised, more: list[Message], bootstrap: str, sent: list[Message],
              timeout: float = 120) -> None:
    """Produce `more` (at `bootstrap`) and return once the stream has started a batch after it."""
    started = stream.batches_started()
    produce(more, bootstrap)
    sent.extend(more)
    deadline = time.monotonic() + timeout
    while stream.batches_started() == started:
        assert time.monotonic() < deadline, "no batch started: " + stream.log_path.read_text()[-2000:]
        time.sleep(0.05)


def _watch_status(stream: Supervised, seconds: float) -> list[str]:
    """`lakehouse stream status` every second or so for `seconds`: what an operator saw meanwhile."""
    seen, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        seen.append(stream.run("status"))
        time.sleep(max(0.0, min(1.0, deadline - time.monotonic())))
    return seen


def _assert_exact(spark, stream: Supervised, sent: list[Message]) -> None:
    """Bronze equals the model, every malformed record is one dead letter, nothing is left in flight."""
    expected, lsns = fold_with_lsn(sent)
    assert_bronze_equals_model(spark, str(stream.root), expected, lsns)
    letters = dead_letters(str(stream.root))
    assert Counter(d["value"] for d in letters) == Counter(m.value for m in sent if is_malformed(m)), \
        "every malformed record is a dead letter, exactly once"
    assert not pending_instants(stream.root), "a commit was left in flight"


def _restarts(stream: Supervised) -> int:
    """Queries the stream started again itself after Kafka failed one."""
    return len(re.findall(r"answers again after", stream.log_path.read_text(errors="replace")))


def _report(fault: str, waited: list[str], recovered: float, restarted: int) -> None:
    print(f"\n{fault}: caught up {recovered:.1f} s after Kafka was back; query restarted in-process "
          f"{restarted} time(s); status while away: {waited[len(waited) // 2] if waited else '-'}")


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[tuple[KafkaBroker, Proxy]]:
    """A broker reached through Toxiproxy: clients bootstrapped at `broker.proxied_bootstrap` stay on the proxy."""
    toxiproxy = Toxiproxy(tmp_path / "toxiproxy").start()
    broker = KafkaBroker(tmp_path / "kafka", proxy_port=free_port())
    try:
        broker.start()
        yield broker, toxiproxy.client.create("kafka", broker.proxied_bootstrap, broker.proxied_upstream)
    finally:
        broker.stop()
        toxiproxy.stop()


def test_broker_killed_then_network_blackout(spark, tmp_path, proxied) -> None:
    broker, proxy = proxied
    stream = Supervised(tmp_path, broker.proxied_bootstrap, STREAM_LIMITS + SHORT_KAFKA_TIMEOUTS)
    waiting_for = f"waiting for Kafka at {broker.proxied_bootstrap} since"
    source = ShopSource(23)
    sent = source.snapshot(WorkloadConfig(seed=23, customers=40, orders=100)) + \
        source.changes(WorkloadConfig(seed=23, changes=300, malformed_fraction=0.02))
    ensure_topics(broker.bootstrap)
    produce(sent, broker.bootstrap)
    with stream.running():
        wait_caught_up(str(stream.root), fold_with_lsn(sent)[0], stream.log_path)

        # Fault 1: the broker SIGKILLed while a batch runs, started again (same ports, same data) after PAUSE.
        mid_batch(stream, source.changes(WorkloadConfig(seed=24, changes=600, replay_runs=1,
                                                         malformed_fraction=0.02)), broker.bootstrap, sent)
        broker.kill()
        statuses = _watch_status(stream, PAUSE)
        broker.start()
        back = time.monotonic()
        killed = [s for s in statuses if waiting_for in s]
        assert killed, "stream status never said it waited for Kafka (broker killed):\n" + "\n".join(statuses)
        wait_caught_up(str(stream.root), fold_with_lsn(sent)[0], stream.log_path)
        recovered_kill = time.monotonic() - back
        restarts_kill = _restarts(stream)
        # The stream goes on after the fault: new changes arrive in bronze, status is plain healthy.
        more = source.changes(WorkloadConfig(seed=25, changes=200, malformed_fraction=0.02))
        produce(more, broker.bootstrap)
        sent += more
        wait_caught_up(str(stream.root), fold_with_lsn(sent)[0], stream.log_path)
        assert "waiting for" not in stream.run("status", "healthy")

        # Fault 2: the network to Kafka cut (the proxy disabled) mid-batch while the source goes on writing.
        mid_batch(stream, source.changes(WorkloadConfig(seed=30, changes=600, replay_runs=1,
                                                         malformed_fraction=0.02)), broker.bootstrap, sent)
        with proxy.blackout():
            statuses = _watch_status(stream, BLACKOUT / 2)
            # The source goes on writing to the broker, which only the stream cannot reach.
            more = source.changes(WorkloadConfig(seed=31, changes=300, malformed_fraction=0.02))
            produce(more, broker.bootstrap)
            sent += more
            statuses += _watch_status(stream, BLACKOUT / 2)
        back = time.monotonic()
        cut = [s for s in statuses if waiting_for in s]
        assert cut, "stream status never said it waited for Kafka (blackout):\n" + "\n".join(statuses)
        wait_caught_up(str(stream.root), fold_with_lsn(sent)[0], stream.log_path)
        recovered_cut = time.monotonic() - back
        assert "waiting for" not in stream.run("status", "healthy")
        assert _restarts(stream) > restarts_kill, \
            "the blackout did not fail the query: " + stream.log_path.read_text()[-3000:]
        assert "query failed while Kafka" in stream.log_path.read_text()
    _report(f"broker SIGKILLed, back after {PAUSE:.0f} s", killed, recovered_kill, restarts_kill)
    _report(f"{BLACKOUT:.0f} s network blackout", cut, recovered_cut, _restarts(stream) - restarts_kill)
    _assert_exact(spark, stream, sent)
