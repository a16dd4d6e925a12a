"""What every benchmark shares: its output folder, a private broker, the backlog workload, timed commands.

The backlog goes to Kafka one of two ways (`lakehouse dev bench --sink`, `LAKEHOUSE_BENCH_SINK`):
`kafka`, the generator's records produced as they are (the default: its noise, replays and
malformed records included), or `sql`, its changes played as SQL on a real PostgreSQL captured
by Debezium (dev/lakehouse_dev/pg_source.py), which the benchmark's broker then starts beside it.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from lakehouse_dev import sql_sink
from lakehouse_dev.generator.kafka import ensure_topics, produce
from lakehouse_dev.generator.source import ShopSource
from lakehouse_dev.generator.values import Message, WorkloadConfig
from lakehouse_dev.kafka_local import KafkaBroker, free_port
from lakehouse_dev.pg_source import RealSource
from lakehouse_dev.spark_cluster import AppTasks, LocalCluster
from pipelines.runtime.spark_conf import MASTER_VARIABLE

PARTITIONS = 3
# The backlog's mix: about 60% snapshot rows,
# then changes of which 5% of all events are deletes and 20% updates. The generator draws
# deletes with `delete_fraction` per change and splits the rest 40/60 between inserts and
# updates, so changes = 40% of the events with delete_fraction 0.125 gives 0.4 x 0.125 = 5%
# deletes and 0.4 x 0.875 x 0.6 = 21% updates.
SNAPSHOT_SHARE = 0.6
DELETE_FRACTION = 0.125
CUSTOMER_SHARE_OF_SNAPSHOT = 0.25
_CHUNK = 50_000
# Snapshot rows are produced and acknowledged in chunks of this many (memory and producer timeouts).
_SNAPSHOT_CHUNK = 200_000
SINKS = ("kafka", "sql")
# The real source's DSN per benchmark broker (bootstrap) when the sink is `sql`.
_DATABASES: dict[str, str] = {}


def launch_ingest(env: dict[str, str], log: Path, trigger_seconds: float) -> subprocess.Popen:
    """`lakehouse ingest` with `env` in its own process group (so that a bench can kill it whole), its output
    appended to `log`."""
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "pipelines.cli", "ingest", "--trigger-seconds",
                                 str(trigger_seconds)], env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def sink() -> str:
    """`LAKEHOUSE_BENCH_SINK`: how backlogs reach Kafka, `kafka` (default) or `sql`."""
    chosen = os.environ.get("LAKEHOUSE_BENCH_SINK") or "kafka"
    if chosen not in SINKS:
        raise click.ClickException(f"LAKEHOUSE_BENCH_SINK={chosen!r}: expected one of {', '.join(SINKS)}")
    return chosen


def bench_dir() -> Path:
    """`LAKEHOUSE_BENCH_DIR`, default `.bench/` (git-ignored)."""
    path = Path(os.environ.get("LAKEHOUSE_BENCH_DIR") or ".bench").resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    mem = 0
    with suppress(ValueError, OSError):
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()
    return {"cpus": os.cpu_count(), "memory_gib": round(mem / 2**30, 1), "python": platform.python_version(),
            "platform": platform.platform(), "java": java[0] if java else "?"}


def save(name: str, figures: dict[str, Any]) -> Path:
    """`<bench dir>/<name>.json`: the figures, the machine and when."""
    path = bench_dir() / f"{name}.json"
    doc = {"benchmark": name, "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
           "machine": machine(), **figures}
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    click.echo(f"figures: {path}", err=True)
    return path


@contextmanager
def spark_cluster(work: Path) -> Iterator[dict[str, str]]:
    """A standalone cluster of its own for one contender (master and two one-core workers, free ports):
    the environment that puts a job on it, its event logs under `work/cluster-logs`."""
    with LocalCluster(work / "cluster", port=0, ui_port=0) as running:
        say(f"Spark cluster {running.url} (web UI {running.master.ui_url})")
        yield {MASTER_VARIABLE: running.url, "LAKEHOUSE_LOG_DIR": str(work / "cluster-logs")}


def cluster_tasks(env: dict[str, str]) -> dict[str, Any]:
    """Where the tasks of the jobs run with `env` (from `spark_cluster`) spent their time, summed."""
    total = AppTasks()
    for events in (Path(env["LAKEHOUSE_LOG_DIR"]) / "spark-events").iterdir():
        app = AppTasks.read(events)
        total.succeeded += app.succeeded
        total.failed += app.failed
        total.seconds += app.seconds
        total.shuffle_bytes += app.shuffle_bytes
    return {**total.summary(), "tasks_per_executor": dict(total.succeeded)}


def peak_memory(pid: int) -> dict[str, float] | None:
    """Peak resident memory in MiB of a process and of the JVM among its descendants, from the kernel's
    high-water marks (`VmHWM`, /proc/<pid>/status): the true peaks, which sampling could miss, read
    while the processes still live. None where there is no /proc (not Linux).

    An ingest is a Python process whose Spark driver is a `java` child: `jvm` is that driver's (with
    local[2] its executors' tasks too), `python` the CLI's own, `tree` the sum of every process's.
    """
    proc = Path("/proc")
    if not (proc / str(pid) / "status").exists():
        return None
    peaks: dict[int, tuple[str, float]] = {}
    for p in process_tree(pid):
        with suppress(OSError):
            status = dict(line.split(":", 1) for line in (proc / str(p) / "status").read_text().splitlines()
                          if ":" in line)
            if "VmHWM" in status:  # an exited child not yet reaped (a zombie) has no memory left to count
                peaks[p] = (status["Name"].strip(), int(status["VmHWM"].split()[0]) / 1024)
    jvm = [mib for name, mib in peaks.values() if name == "java"]
    return {"jvm": round(max(jvm, default=0.0), 1), "python": round(peaks.get(pid, ("", 0.0))[1], 1),
            "tree": round(sum(mib for _, mib in peaks.values()), 1), "processes": len(peaks)}


def process_tree(pid: int) -> list[int]:
    """`pid` and every process below it (from /proc; empty where there is none): a Python CLI's JVM is a
    grandchild (spark-submit's launcher in between), so it is found by walking down, not by parent."""
    proc = Path("/proc")
    children: dict[int, list[int]] = {}
    for stat in proc.glob("[0-9]*/stat"):
        with suppress(OSError, ValueError, IndexError):
            # The command name (field 2) may hold spaces: the parent pid is the second field after it.
            children.setdefault(int(stat.read_text().rsplit(")", 1)[1].split()[1]), []).append(int(stat.parent.name))
    if not (proc / str(pid)).exists():
        return []
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo += children.get(tree[-1], [])
    return tree


def say(message: str) -> None:
    """Progress, on stderr (stdout is for the results table)."""
    click.echo(f"[{time.strftime('%H:%M:%S')}] {message}", err=True)


@contextmanager
def broker(name: str, sinks: tuple[str, ...] = SINKS, topics: Iterable[str] | None = None) -> Iterator[KafkaBroker]:
    """A fresh broker for one benchmark, data under the bench dir, stopped afterwards; with the
    `sql` sink, a real source beside it. `sinks`: those the benchmark's own producing supports;
    `topics`: those it produces to, created with PARTITIONS partitions (default the shop's)."""
    if sink() not in sinks:
        raise click.ClickException(f"bench {name} produces its records itself: it runs with --sink "
                                   f"{' or '.join(sinks)} only, not {sink()}")
    data = bench_dir() / name / "kafka"
    if data.exists():
        KafkaBroker(data).stop()
        shutil.rmtree(data)
    node = KafkaBroker(data)
    node.start()
    real = None
    try:
        if sink() == "sql":
            real = RealSource(data.parent / "source", free_port(), free_port(), node.bootstrap)
            real.up()  # Connect creates the topics, with PARTITIONS partitions
            _DATABASES[node.bootstrap] = real.postgres.dsn
        else:
            ensure_topics(node.bootstrap, PARTITIONS, topics)
        yield node
    finally:
        if real is not None:
            real.down()
            _DATABASES.pop(node.bootstrap, None)
        node.stop()


def _send(messages: list[Message], bootstrap: str) -> int:
    """The generator's records to Kafka: produced as they are, or, beside a real source, their
    changes as SQL that Debezium delivers (counted as statements played)."""
    dsn = _DATABASES.get(bootstrap)
    if dsn is None:
        return produce(messages, bootstrap)
    return sql_sink.play(messages, dsn, bootstrap).stats.total()


@dataclass
class Backlog:
    """What was produced: the generator's counts, by kind of record."""

    events: int = 0
    records: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    source: ShopSource | None = field(default=None, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {"events": self.events, "kafka_records": self.records, "by_kind": self.kinds,
                "produce_seconds": round(self.seconds, 1)}


def backlog_config(events: int, seed: int = 7) -> tuple[WorkloadConfig, int]:
    """The snapshot's config and the number of change events for a backlog of about `events`."""
    snapshot = int(events * SNAPSHOT_SHARE)
    customers = int(snapshot * CUSTOMER_SHARE_OF_SNAPSHOT)
    cfg = WorkloadConfig(seed=seed, customers=customers, orders=snapshot - customers, changes=0,
                         delete_fraction=DELETE_FRACTION)
    return cfg, events - snapshot


def produce_backlog(bootstrap: str, events: int, seed: int = 7, source: ShopSource | None = None) -> Backlog:
    """Produce about `events` change events (plus the contract's noise) in chunks, with progress.

    With `source`, only changes are added (a lake that already had its snapshot).
    """
    cfg, changes = backlog_config(events, seed)
    fresh = source is None
    source = source or ShopSource(seed)
    before = source.stats.copy()
    started = time.monotonic()
    done = 0
    with click.progressbar(length=events, label=f"producing {events:,} events", file=sys.stderr) as bar:
        if fresh:
            messages = source.snapshot(cfg)
            done += _send(messages, bootstrap)
            bar.update(cfg.customers + cfg.orders)
        else:
            changes = events
        left = changes
        while left > 0:
            step = min(_CHUNK, left)
            done += _send(source.changes(WorkloadConfig(**{**cfg.__dict__, "changes": step})), bootstrap)
            bar.update(step)
            left -= step
    kinds = dict(source.stats - before)
    row_events = sum(kinds.get(k, 0) for k in ("r", "c", "u", "d"))
    return Backlog(events=row_events, records=done, kinds=kinds, seconds=time.monotonic() - started,
                   source=source)


def produce_snapshot(source: ShopSource, bootstrap: str, rows: int, seed: int) -> int:
    """Produce a snapshot of about `rows` live rows (a quarter customers); returns the records sent.

    Snapshot envelopes go without the converter's schema (`schemas.enable=false`): it would
    multiply the Kafka bytes of a setup step several times over. The measured batches carry the
    contract's mix of both converter formats.
    """
    customers = rows // 4
    cfg = WorkloadConfig(seed=seed, customers=customers, orders=rows - customers, changes=0,
                         delete_fraction=DELETE_FRACTION, schema_fraction=0.0)
    messages = source.snapshot(cfg)
    sent = 0
    for i in range(0, len(messages), _SNAPSHOT_CHUNK):
        sent += produce(messages[i:i + _SNAPSHOT_CHUNK], bootstrap)
        say(f"  snapshot: {sent:,} of {len(messages):,} records produced")
    return sent


def lakehouse(*args: str, env: dict[str, str], log: Path, timeout: float = 3600) -> float:
    """Run `lakehouse ARGS` in its own process (own JVM, like production); seconds of wall time.

    Fails naming the log when the command fails: a benchmark of a failed run is no figure.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with log.open("ab") as out:
        done = subprocess.run([sys.executable, "-m", "pipelines.cli", *args], env={**os.environ, **env},
                              stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
    seconds = time.monotonic() - started
    if done.returncode:
        tail = log.read_text(errors="replace")[-3000:]
        raise click.ClickException(f"lakehouse {' '.join(args)} failed ({done.returncode}); log {log}:\n{tail}")
    return seconds


def table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """A plain-text results table (also pasted into BENCHMARKS.md)."""
    cells = [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    line = "| " + " | ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)) + " |"
    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = ["| " + " | ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) + " |" for row in cells]
    return "\n".join([line, rule, *body])
