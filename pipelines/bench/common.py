"""What every benchmark shares: its output folder, a private broker, the backlog workload, timed commands."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from pipelines.generator import ShopSource, WorkloadConfig, ensure_topics, produce
from pipelines.kafka_local import KafkaBroker, free_port

PARTITIONS = 3
# The backlog's mix (issue 6): about 60% snapshot rows, then changes of which 5% of all events
# are deletes and 20% updates. The generator draws deletes with `delete_fraction` per change and
# splits the rest 40/60 between inserts and updates, so changes = 40% of the events with
# delete_fraction 0.125 gives 0.4 x 0.125 = 5% deletes and 0.4 x 0.875 x 0.6 = 21% updates.
SNAPSHOT_SHARE = 0.6
DELETE_FRACTION = 0.125
CUSTOMER_SHARE_OF_SNAPSHOT = 0.25
_CHUNK = 50_000
# Snapshot rows are produced and acknowledged in chunks of this many (memory and producer timeouts).
_SNAPSHOT_CHUNK = 200_000


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


def say(message: str) -> None:
    """Progress, on stderr (stdout is for the results table)."""
    click.echo(f"[{time.strftime('%H:%M:%S')}] {message}", err=True)


@contextmanager
def broker(name: str) -> Iterator[KafkaBroker]:
    """A fresh broker for one benchmark, data under the bench dir, stopped afterwards."""
    data = bench_dir() / name / "kafka"
    if data.exists():
        KafkaBroker(data).stop()
        shutil.rmtree(data)
    node = KafkaBroker(data, port=free_port())
    node.start()
    try:
        ensure_topics(node.bootstrap, PARTITIONS)
        yield node
    finally:
        node.stop()


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
            done += produce(messages, bootstrap)
            bar.update(cfg.customers + cfg.orders)
        else:
            changes = events
        left = changes
        while left > 0:
            step = min(_CHUNK, left)
            done += produce(source.changes(WorkloadConfig(**{**cfg.__dict__, "changes": step})), bootstrap)
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
