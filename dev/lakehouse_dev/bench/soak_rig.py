"""What the soak runs on and breaks: the real source, Kafka behind Toxiproxy, the supervised stream.

Every piece is the project's own dev tool, started as the fault tests start them (tests/test_faults_kafka.py,
tests/test_real_source.py): PostgreSQL and Debezium in Kafka Connect (`RealSource`) publish to the
broker's own listener; the stream reads Kafka through Toxiproxy (`KafkaBroker(proxy_port=...)`: every
connection of the stream goes through the proxy, Connect's and the probes' do not), Debezium reaches
PostgreSQL through a second proxy (the SQL load and the checker do not), and the stream runs as
`lakehouse stream start` runs it, under `lakehouse stream ensure` every few minutes as the
`bronze_ingest_stream` DAG runs it. Everything lives in one folder; `Rig.clean` stops what a run
that was interrupted left running there (by its pid files, never by name).

`inject` runs one fault to its end: the broker SIGKILLed and started again (same ports, same data),
a blackout of the stream's proxy, PostgreSQL stopped (fast shutdown) and started again, a blackout of
Debezium's proxy to PostgreSQL, or a toxic (latency, bandwidth, connection resets) on either proxy for a while.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lakehouse_dev.bench.common import say
from lakehouse_dev.bench.memory import jvm_memory, live_set
from lakehouse_dev.bench.soak_plan import Fault
from lakehouse_dev.bench.visibility import WRITER_TZ, LagProbe
from lakehouse_dev.connect_config import CONNECTOR
from lakehouse_dev.connect_worker import slot_status
from lakehouse_dev.kafka_local import KafkaBroker
from lakehouse_dev.pg_source import RealSource
from lakehouse_dev.supervised import Supervised
from lakehouse_dev.toxiproxy import Proxy, Toxiproxy
from pipelines.deploy.connector import restart_failed
from pipelines.lake.declaration import Declaration
from pipelines.runtime.local_process import HOST, free_port

# The toxics' strength: a slow link, a thin one, and one that resets every connection as data flows.
LATENCY_MS, JITTER_MS = 1000, 250
BANDWIDTH_KB_S = 256


@dataclass
class Rig:
    """The running pieces of one soak, under `home`."""

    home: Path
    toxiproxy: Toxiproxy
    broker: KafkaBroker
    proxy: Proxy
    source: RealSource
    stream: Supervised
    pg_link: Proxy  # Debezium's way to PostgreSQL

    @staticmethod
    def clean(home: Path) -> None:
        """Stop whatever an earlier run left running under `home` (its pid files), then remove its files."""
        if home.exists():
            Supervised(home, "").kill()
            with suppress(Exception):
                RealSource(home / "source").down()
            KafkaBroker(home / "kafka").stop()
            Toxiproxy(home / "toxiproxy").stop()
            shutil.rmtree(home)
        home.mkdir(parents=True)


@contextmanager
def rig(home: Path, env: dict[str, str], trigger_seconds: float, load_snapshot: Callable[[str], None],
        declaration: Declaration) -> Iterator[Rig]:
    """Toxiproxy, the broker, the source capturing `declaration`'s tables (`load_snapshot(dsn)` fills the database
    before Debezium's first snapshot), the supervised stream's settings; everything stopped at the end. The stream
    is not started."""
    Rig.clean(home)
    with ExitStack() as stack:
        toxiproxy = Toxiproxy(home / "toxiproxy").start()
        stack.callback(toxiproxy.stop)
        broker = KafkaBroker(home / "kafka", proxy_port=free_port()).start()
        stack.callback(broker.stop)
        proxy = toxiproxy.client.create("kafka", broker.proxied_bootstrap, broker.proxied_upstream)
        say(f"Kafka at {broker.bootstrap}, the stream's way to it through Toxiproxy at {broker.proxied_bootstrap}")
        pg_port, via = free_port(), free_port()
        pg_link = toxiproxy.client.create("postgres", f"{HOST}:{via}", f"{HOST}:{pg_port}")
        source = RealSource(home / "source", pg_port, free_port(), broker.bootstrap, debezium_port=via)
        stack.callback(source.down)
        load_snapshot(source.postgres.start().dsn)
        source.up(declaration)
        say(f"source: PostgreSQL at {source.postgres.dsn}, Debezium streaming (Kafka Connect at {source.connect.url})")
        # The exporter on a port of its own: another stream on this machine may hold the default.
        stream = Supervised(home, broker.proxied_bootstrap, f"[stream.metrics]\nport = {free_port()}\n",
                            trigger_seconds, {**env, "TZ": WRITER_TZ})
        stack.callback(stream.kill)
        yield Rig(home, toxiproxy, broker, proxy, source, stream, pg_link=pg_link)


def inject(r: Rig, fault: Fault) -> dict[str, Any]:
    """Run `fault` to its end: its start and end (epoch seconds; the end when the broken piece serves again), and
    what `lakehouse stream status` said half-way through (an operator's view of it)."""
    said: list[str] = []

    def meanwhile() -> None:
        time.sleep(fault.seconds / 2)
        try:
            said.append(r.stream.run("status"))
        except Exception as exc:  # what status could not say is part of the record
            said.append(f"status failed: {exc}")
        time.sleep(max(0.0, start + fault.seconds - time.time()))

    start = time.time()
    if fault.kind == "broker_kill":
        r.broker.kill()
        meanwhile()
        r.broker.start()
    elif fault.kind == "kafka_blackout":
        with r.proxy.blackout():
            meanwhile()
    elif fault.kind == "postgres_restart":
        r.source.postgres.stop()
        meanwhile()
        r.source.postgres.start()
    elif fault.kind == "postgres_blackout":
        with r.pg_link.blackout():
            meanwhile()
    else:
        toxic = {"kafka_latency": lambda: r.proxy.latency(LATENCY_MS, JITTER_MS),
                 "kafka_bandwidth": lambda: r.proxy.bandwidth(BANDWIDTH_KB_S),
                 "kafka_reset_peer": lambda: r.proxy.reset_peer(),
                 "postgres_latency": lambda: r.pg_link.latency(LATENCY_MS, JITTER_MS)}[fault.kind]()
        try:
            meanwhile()
        finally:
            toxic.remove()
    return {"kind": fault.kind, "planned_at": fault.at, "start": start, "end": time.time(), "status": said[0]}


def restart_failed_task(r: Rig) -> str | None:
    """Restart Debezium's task if Connect says it FAILED (pipelines.deploy.connector: why Connect never does);
    the first line of its trace, else None. In production the `debezium_connector` DAG does this every few
    minutes; here the soak does, within seconds of PostgreSQL answering again, and counts each one."""
    found = restart_failed(r.source.connect.url, CONNECTOR)
    return None if found is None else (found.trace or "FAILED")


@dataclass
class Sampler:
    """Readings every `seconds` on threads of their own until `stop`: the stream driver JVM's memory and the
    slot's lag (never blocks long), and the consumer lag (blocks while the broker is down, so apart). The first
    also restarts Debezium's task when it failed (`restart_failed_task`), each restart in `connector_restarts`.
    Every `live_seconds`, on a third thread, the driver's live set (`memory.live_set`: a full collection, so
    rarely), in `live`."""

    r: Rig
    seconds: float = 5.0
    live_seconds: float = 120.0
    memory: list[dict[str, Any]] = field(default_factory=list)
    live: list[dict[str, Any]] = field(default_factory=list)
    lag: list[dict[str, Any]] = field(default_factory=list)
    connector_restarts: list[dict[str, Any]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    threads: list[threading.Thread] = field(default_factory=list)

    def start(self, probe: LagProbe) -> None:
        self.threads = [threading.Thread(target=target, daemon=True)
                        for target in (self._memory, lambda: self._lag(probe), self._live)]
        for thread in self.threads:
            thread.start()

    def close(self, timeout: float = 60.0) -> None:
        """Stop sampling and wait for the threads (the probe's Kafka consumer is not to be shared between threads)."""
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout)

    def _memory(self) -> None:
        while not self.stop.wait(self.seconds):
            pid = self.r.stream.pid()
            read = jvm_memory(pid) if pid else None
            slot = None
            with suppress(Exception):  # the way Debezium reaches it: a cut network is PostgreSQL away to Debezium
                slot = (slot_status(self.r.source.connect.database_port) or {}).get("lag_bytes")
            # Once PostgreSQL answers again (the slot was read): a task restarted before would fail again.
            with suppress(Exception):
                if slot is not None and (why := restart_failed_task(self.r)) is not None:
                    self.connector_restarts.append({"t": time.time(), "trace": why})
                    say(f"Debezium's task had FAILED ({why}); restarted it through Connect's REST API")
            self.memory.append({"t": time.time(), "pid": read.pid if read else None,
                                "rss_mib": read.rss_mib if read else None,
                                "heap_used_mib": read.heap_used_mib if read else None,
                                "old_used_mib": read.old_used_mib if read else None, "slot_lag_bytes": slot})

    def _live(self) -> None:
        while not self.stop.wait(self.live_seconds):
            pid = self.r.stream.pid()
            if pid and (read := live_set(pid)) is not None:
                self.live.append({"t": time.time(), "pid": read.pid, "live_mib": read.live_mib,
                                  "classes": read.classes})
                say(f"driver JVM {read.pid}: live set {read.live_mib:,.0f} MiB after a full collection")

    def _lag(self, probe: LagProbe) -> None:
        while not self.stop.wait(self.seconds):
            with suppress(Exception):
                self.lag.append({"t": time.time(), **probe.lag()})

    def latest(self) -> dict[str, Any]:
        """The newest of each reading, for a progress line."""
        return {**(self.lag[-1] if self.lag else {}), **(self.memory[-1] if self.memory else {})}


@dataclass
class Ensure:
    """`lakehouse stream ensure` every `seconds` on a thread, as the bronze_ingest_stream DAG runs it; what it did
    when it did more than find the stream running."""

    stream: Supervised
    seconds: float
    acted: list[dict[str, Any]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while not self.stop.wait(self.seconds):
            try:
                said = self.stream.run("ensure")
            except Exception as exc:  # a failed ensure is a figure of the run, not its end
                said = f"failed: {exc}"
            if not said.startswith("running"):
                self.acted.append({"t": time.time(), "said": said[:500]})
