"""Toxiproxy's server from `make toxiproxy`, driven by dev/lakehouse_dev/toxiproxy.py, between a client and
an echo server: each fault the fault tests may use does what it says (no JVM, seconds).

The broker side (a client bootstrapped through the proxy stays on it) is tests/test_kafka_local.py's.
"""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lakehouse_dev.toxiproxy import Proxy, Toxiproxy, ToxiproxyError
from pipelines.runtime.local_process import HOST, free_port

pytestmark = pytest.mark.integration


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(65536):
            self.request.sendall(data)


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[Proxy]:
    """A proxy on a free port in front of an echo server, on a Toxiproxy of its own."""
    server = socketserver.ThreadingTCPServer((HOST, 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    toxiproxy = Toxiproxy(tmp_path / "toxiproxy").start()
    try:
        yield toxiproxy.client.create("echo", f"{HOST}:{free_port()}", f"{HOST}:{server.server_address[1]}")
    finally:
        toxiproxy.stop()
        server.shutdown()
        server.server_close()


def _address(proxy: Proxy) -> tuple[str, int]:
    host, _, port = proxy.info()["listen"].rpartition(":")
    return host, int(port)


def _echo(proxy: Proxy, payload: bytes = b"ping", timeout: float = 5.0) -> bytes:
    with socket.create_connection(_address(proxy), timeout=timeout) as sock:
        sock.sendall(payload)
        received = b""
        while len(received) < len(payload):
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
        return received


def test_each_toxic_and_the_blackout(proxy: Proxy) -> None:
    assert _echo(proxy) == b"ping"

    latency = proxy.latency(300)
    started = time.monotonic()
    assert _echo(proxy) == b"ping"
    assert time.monotonic() - started >= 0.3, "the latency toxic did not delay the answer"
    assert [t["type"] for t in proxy.toxics()] == ["latency"]
    latency.remove()

    bandwidth = proxy.bandwidth(100)  # KB/s: 200 KB take two seconds at least
    started = time.monotonic()
    assert _echo(proxy, b"x" * 200_000, timeout=30) == b"x" * 200_000
    assert time.monotonic() - started >= 1.5, "the bandwidth toxic did not slow the transfer"
    bandwidth.remove()

    reset = proxy.reset_peer()
    with pytest.raises(OSError):  # ECONNRESET, or the connection closed with nothing echoed
        if _echo(proxy) != b"ping":
            raise ConnectionResetError("closed without an answer")
    reset.remove()

    stall = proxy.timeout(0)  # data held for ever, the connection left open: a silent network
    with pytest.raises(TimeoutError):
        _echo(proxy, timeout=1.0)
    stall.remove()
    assert _echo(proxy) == b"ping"

    with proxy.blackout():
        assert not proxy.enabled
        with pytest.raises(ConnectionRefusedError):
            _echo(proxy)
    assert proxy.enabled and _echo(proxy) == b"ping"

    with pytest.raises(ToxiproxyError, match="HTTP 404"):
        proxy.client.proxy("no-such-proxy")
