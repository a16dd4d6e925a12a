"""Toxiproxy on 127.0.0.1: a TCP proxy whose faults (latency, bandwidth, resets, a blackout) tests switch on.

The fault tests (tests/test_faults_kafka.py) put it between the ingest stream and Kafka: the stream
bootstraps at the proxy's address, and the broker advertises that address to the clients that come
through it (`KafkaBroker(proxy_port=...)`, dev/lakehouse_dev/kafka_local.py), so every connection of
the stream, reconnects included, goes through the proxy, while the tests' own producers keep the
broker's direct listener.

The server is Shopify's Toxiproxy v2, built from the Go module proxy by `make toxiproxy` (part of
`make setup`) into .tools/bin/toxiproxy-server, or the binary LAKEHOUSE_TOXIPROXY_SERVER names. It runs
as a `LocalProcess` (as the broker and the metastore do): detached, pid and log in one folder.

`ToxiproxyClient` drives its documented HTTP API with the standard library. PyPI's one client,
`toxiproxy-python` (0.1.1, January 2019), has had no release since, and the API is a handful of JSON
requests: a typed wrapper of them is less to trust than an unmaintained dependency.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pipelines.runtime.local_process import HOST, LocalProcess, command_line, free_port, port_open
from pipelines.runtime.settings import PROJECT_ROOT

SERVER_VARIABLE = "LAKEHOUSE_TOXIPROXY_SERVER"
# Where `make toxiproxy` installs the server (Toxiproxy's own `go install` names it `server`).
INSTALLED = PROJECT_ROOT / ".tools" / "bin" / "toxiproxy-server"
API_TIMEOUT = 10.0

Stream = Literal["upstream", "downstream"]


def server_binary() -> str:
    """The Toxiproxy server: LAKEHOUSE_TOXIPROXY_SERVER, else `make toxiproxy`'s, else one on PATH."""
    candidates = [os.environ.get(SERVER_VARIABLE), str(INSTALLED), shutil.which("toxiproxy-server")]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise RuntimeError(f"no Toxiproxy server at {INSTALLED} (nor {SERVER_VARIABLE}, nor toxiproxy-server on PATH); "
                       "run `make toxiproxy`")


class ToxiproxyError(RuntimeError):
    """The API refused a request; the message holds its answer."""


@dataclass(frozen=True)
class ToxiproxyClient:
    """Toxiproxy v2's HTTP API (https://github.com/Shopify/toxiproxy#http-api), typed, on urllib."""

    url: str  # http://127.0.0.1:8474

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=API_TIMEOUT) as answer:
                text = answer.read()
        except urllib.error.HTTPError as error:
            raise ToxiproxyError(f"{method} {path}: HTTP {error.code} {error.read().decode(errors='replace')}") \
                from None
        return json.loads(text) if text.strip() else None

    def version(self) -> str:
        with urllib.request.urlopen(f"{self.url}/version", timeout=API_TIMEOUT) as answer:
            return answer.read().decode().strip()

    def create(self, name: str, listen: str, upstream: str, enabled: bool = True) -> Proxy:
        """A new proxy from `listen` (host:port) to `upstream`; an existing one of that name is replaced."""
        if name in self.request("GET", "/proxies"):
            self.request("DELETE", f"/proxies/{name}")
        self.request("POST", "/proxies", {"name": name, "listen": listen, "upstream": upstream, "enabled": enabled})
        return Proxy(self, name)

    def proxy(self, name: str) -> Proxy:
        self.request("GET", f"/proxies/{name}")  # raises if there is none
        return Proxy(self, name)

    def reset(self) -> None:
        """Every proxy enabled, every toxic removed."""
        self.request("POST", "/reset")


@dataclass(frozen=True)
class Proxy:
    """One proxy of a Toxiproxy server, and the faults tests put on it."""

    client: ToxiproxyClient
    name: str

    @property
    def path(self) -> str:
        return f"/proxies/{self.name}"

    def info(self) -> dict[str, Any]:
        """{"name", "listen", "upstream", "enabled", "toxics": [...]}."""
        return self.client.request("GET", self.path)

    @property
    def enabled(self) -> bool:
        return bool(self.info()["enabled"])

    def enable(self) -> None:
        self.client.request("POST", self.path, {"enabled": True})

    def disable(self) -> None:
        """A full blackout: the proxy stops listening and closes every connection through it."""
        self.client.request("POST", self.path, {"enabled": False})

    @contextmanager
    def blackout(self) -> Iterator[None]:
        """Disabled inside the block, enabled again after it (an exception included)."""
        self.disable()
        try:
            yield
        finally:
            self.enable()

    def toxics(self) -> list[dict[str, Any]]:
        return self.client.request("GET", f"{self.path}/toxics")

    def add_toxic(self, kind: str, attributes: dict[str, int], *, name: str | None = None,
                  stream: Stream = "downstream", toxicity: float = 1.0) -> Toxic:
        name = name or f"{kind}_{stream}"
        self.client.request("POST", f"{self.path}/toxics", {"name": name, "type": kind, "stream": stream,
                                                            "toxicity": toxicity, "attributes": attributes})
        return Toxic(self, name)

    def latency(self, ms: int, jitter_ms: int = 0, stream: Stream = "downstream") -> Toxic:
        """Every chunk of data delayed by `ms` (± `jitter_ms`)."""
        return self.add_toxic("latency", {"latency": ms, "jitter": jitter_ms}, stream=stream)

    def bandwidth(self, kb_per_second: int, stream: Stream = "downstream") -> Toxic:
        """The connection's rate capped at `kb_per_second` KB/s."""
        return self.add_toxic("bandwidth", {"rate": kb_per_second}, stream=stream)

    def reset_peer(self, after_ms: int = 0, stream: Stream = "downstream") -> Toxic:
        """Connections reset (TCP RST) `after_ms` after data first flows, 0: at once."""
        return self.add_toxic("reset_peer", {"timeout": after_ms}, stream=stream)

    def timeout(self, after_ms: int = 0, stream: Stream = "downstream") -> Toxic:
        """Data stops flowing (a black hole: the connection stays open); closed after `after_ms`, 0: never."""
        return self.add_toxic("timeout", {"timeout": after_ms}, stream=stream)


@dataclass(frozen=True)
class Toxic:
    """One toxic on a proxy; `remove` ends its fault, as leaving a `with` block of it does."""

    proxy: Proxy
    name: str

    def remove(self) -> None:
        self.proxy.client.request("DELETE", f"{self.proxy.path}/toxics/{self.name}")

    def __enter__(self) -> Toxic:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.remove()


@dataclass
class Toxiproxy(LocalProcess):
    """A Toxiproxy server whose API listens on 127.0.0.1:`port`; pid and log in `home`."""

    label = "Toxiproxy"
    # Its log is JSON lines (zerolog): "level":"error"; a Go panic starts with `panic:`.
    error_line = re.compile(r'"level":"(error|fatal)"|^panic:')
    start_timeout = 30.0

    home: Path
    port: int = 0  # the API's; 0: a free port, chosen by `start` (a running server's is read from its command)

    def __post_init__(self) -> None:
        self.home = Path(self.home).resolve()

    @property
    def pid_path(self) -> Path:
        return self.home / "toxiproxy.pid"

    @property
    def log_path(self) -> Path:
        return self.home / "toxiproxy.log"

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def client(self) -> ToxiproxyClient:
        return ToxiproxyClient(self.url)

    def command(self) -> list[str]:
        return [server_binary(), "-host", HOST, "-port", str(self.port)]

    def start(self, timeout: float | None = None) -> Toxiproxy:
        if self.pid() is None and self.port == 0:
            self.port = free_port()
        return super().start(timeout)

    def adopt(self, pid: int) -> None:
        found = re.search(r"-port (\d+)", command_line(pid))
        if found is None or (self.port and int(found[1]) != self.port):
            raise RuntimeError(f"Toxiproxy pid {pid} from {self.home} is not one of this folder's on port {self.port}")
        self.port = int(found[1])
        if not port_open(self.port):
            raise RuntimeError(f"Toxiproxy pid {pid} from {self.home} does not serve port {self.port}")

    def unready(self, pid: int, deadline: float) -> str | None:
        if not port_open(self.port):
            return f"no API on {self.url}"
        try:
            self.client.version()
        except OSError as error:
            return f"no answer from {self.url}/version: {error}"
        return None

