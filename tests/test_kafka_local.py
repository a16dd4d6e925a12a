"""The local broker against a real client: it must serve, restart with its data, and never outlive a test."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic

from lakehouse_dev import kafka_local
from lakehouse_dev.kafka_local import KafkaBroker, free_port, kafka

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    # One broker for the module: a start costs seconds, and every test leaves it running.
    with KafkaBroker(tmp_path_factory.mktemp("kafka")) as running:
        yield running


def produce(bootstrap: str, topic: str, key: bytes, value: bytes) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        producer.send(topic, key=key, value=value).get(timeout=30)
    finally:
        producer.close()


def consume_until(bootstrap: str, topic: str, wanted: bytes, timeout: float = 30.0) -> list[bytes]:
    """Values read from the start of `topic` until `wanted` shows up (or the timeout passes)."""
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None)
    values: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while wanted not in values and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                values.extend(record.value for record in records)
    finally:
        consumer.close()
    return values


def broker_processes(config_path: Path) -> str:
    """Pids of java processes started with this config, whoever started them (one per line)."""
    found = subprocess.run(
        ["pgrep", "-f", f"kafka.Kafka {config_path}"], check=False, capture_output=True, text=True
    )
    return found.stdout


def test_produce_and_consume_on_a_three_partition_topic(broker: KafkaBroker) -> None:
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        # Until the broker's metadata has the new topic, a describe may see no partitions (under
        # load): wait for it, as the generator's ensure_topics does.
        admin.create_topics([NewTopic("roundtrip", num_partitions=3, replication_factor=1)], wait_for_metadata=True)
        [description] = admin.describe_topics(["roundtrip"])
    finally:
        admin.close()
    assert len(description["partitions"]) == 3

    produce(broker.bootstrap, "roundtrip", b"k1", b"hello")

    assert consume_until(broker.bootstrap, "roundtrip", b"hello") == [b"hello"]


def test_start_is_idempotent(broker: KafkaBroker) -> None:
    pid = broker.pid()

    assert broker.start() is broker
    # A second handle on the same data dir (as `kafka start` run twice) adopts the running broker.
    adopted = KafkaBroker(broker.data_dir, port=broker.port).start()

    assert pid is not None and broker.pid() == pid and adopted.pid() == pid
    assert broker.is_running()
    with pytest.raises(RuntimeError, match="already runs on port"):
        KafkaBroker(broker.data_dir, port=free_port()).start()


def test_stop_then_start_keeps_data_and_leaves_no_process(broker: KafkaBroker) -> None:
    produce(broker.bootstrap, "persisted", b"k", b"before restart")
    pid = broker.pid()
    controller_port = broker.controller_port
    assert pid is not None

    broker.stop()

    assert not broker.is_running() and broker.pid() is None
    assert not broker.pid_path.exists()
    assert broker_processes(broker.config_path) == ""
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    broker.stop()  # stopping a stopped broker is a no-op

    broker.start()

    assert broker.pid() not in (None, pid)
    assert broker.controller_port == controller_port
    assert b"before restart" in consume_until(broker.bootstrap, "persisted", b"before restart")


def test_start_failure_reports_server_log_and_cleans_up(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        failing = KafkaBroker(tmp_path, port=taken.getsockname()[1])
        try:
            with pytest.raises(RuntimeError, match=r"server\.log") as raised:
                failing.start(timeout=60)
        finally:
            failing.stop()

    assert "Address already in use" in str(raised.value)  # the cause, not just the shutdown that follows
    assert failing.pid() is None and not failing.pid_path.exists()
    assert broker_processes(failing.config_path) == ""


def test_a_chosen_port_taken_before_the_bind_is_chosen_again(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """`free_port` only says a port is free now: another process may bind it before the broker does."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = iter([taken.getsockname()[1]])
        real_free_port = kafka_local.free_port
        monkeypatch.setattr(kafka_local, "free_port", lambda: next(ports, None) or real_free_port())
        with KafkaBroker(tmp_path) as started:
            assert started.port != taken.getsockname()[1]
            # the first try did fail, on that port
            assert f"{taken.getsockname()[1]}: Address already in use".encode() in started.log_path.read_bytes()
            produce(started.bootstrap, "chosen-again", b"k", b"served")
            assert b"served" in consume_until(started.bootstrap, "chosen-again", b"served")


# `start` drops its handle on a broker it leaves running on purpose; Python flags that as a resource leak.
@pytest.mark.filterwarnings("ignore:subprocess .* is still running:ResourceWarning")
def test_cli_start_status_stop(tmp_path: Path) -> None:
    data_dir = tmp_path / "cli"
    port = free_port()
    runner = CliRunner()
    try:
        up = runner.invoke(kafka, ["start", "--port", str(port), "--data-dir", str(data_dir)])
        assert up.exit_code == 0, up.output
        assert f"127.0.0.1:{port}" in up.output and str(data_dir / "server.log") in up.output

        status = runner.invoke(kafka, ["status", "--data-dir", str(data_dir)])
        assert status.exit_code == 0 and f"127.0.0.1:{port}" in status.output
        shown = runner.invoke(kafka, ["status", "--json", "--data-dir", str(data_dir)])
        assert shown.exit_code == 0 and json.loads(shown.stdout)["bootstrap"] == f"127.0.0.1:{port}", shown.output

        down = runner.invoke(kafka, ["stop", "--data-dir", str(data_dir)])
        assert down.exit_code == 0 and "stopped" in down.output
    finally:
        KafkaBroker(data_dir).stop()

    assert runner.invoke(kafka, ["status", "--data-dir", str(data_dir)]).exit_code == 1
    stopped = runner.invoke(kafka, ["status", "--json", "--data-dir", str(data_dir)])
    assert stopped.exit_code == 1 and json.loads(stopped.stdout)["running"] is False
    assert broker_processes(data_dir / "server.properties") == ""


def test_a_client_bootstrapped_through_the_proxy_stays_on_it(tmp_path: Path) -> None:
    """The PROXIED listener advertises the proxy's address: metadata through the proxy names the proxy,
    so that every connection of such a client goes through it, and a blackout of the proxy cuts that
    client and no other (the direct listener still serves); the ports survive a restart."""
    from lakehouse_dev.toxiproxy import Toxiproxy

    toxiproxy = Toxiproxy(tmp_path / "toxiproxy").start()
    broker = KafkaBroker(tmp_path / "kafka", proxy_port=free_port())
    try:
        broker.start()
        proxy = toxiproxy.client.create("kafka", broker.proxied_bootstrap, broker.proxied_upstream)
        admin = KafkaAdminClient(bootstrap_servers=broker.proxied_bootstrap)
        try:
            assert [(b["host"], b["port"]) for b in admin.describe_cluster()["brokers"]] == \
                [("127.0.0.1", broker.proxy_port)]
        finally:
            admin.close()
        produce(broker.bootstrap, "proxied", b"k", b"through")
        assert consume_until(broker.proxied_bootstrap, "proxied", b"through") == [b"through"]
        with proxy.blackout():
            assert kafka_local.port_open(broker.port) and not kafka_local.port_open(broker.proxy_port)
            produce(broker.bootstrap, "proxied", b"k", b"during")
        assert consume_until(broker.proxied_bootstrap, "proxied", b"during") == [b"through", b"during"]
        ports = (broker.port, broker.proxy_port, broker.proxied_port)
        broker.kill()
        broker.start()
        assert (broker.port, broker.proxy_port, broker.proxied_port) == ports
        assert KafkaBroker(tmp_path / "kafka").start().proxied_upstream == broker.proxied_upstream  # adopted
    finally:
        broker.stop()
        toxiproxy.stop()
