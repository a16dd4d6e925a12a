"""The soak's pure parts: which faults come when (from a seed), and what the checker counts.

No JVM, no Kafka, no database: `lakehouse dev bench soak` (dev/lakehouse_dev/bench/soak.py) feeds these
its readings, and tests/test_bench_soak.py checks them in milliseconds.

- **Schedule**: after a warm-up (a new JVM compiles its code, as `bench freshness` says), the
  run is cut into slots of `every` seconds, up to a quiet tail that leaves time for the last
  recovery; each slot gets one fault that starts at a random time and ends inside its slot. Kinds
  are dealt from a deck that is shuffled again once used up, so each kind comes about equally
  often (a plain draw would leave a kind out of six slots one time in three).
- **Tally**: per table, the lake's rows against the source's (the oracle read with SQL): rows
  lost (live in the source, missing from the lake), duplicated (a key more than once in the lake,
  each extra copy), resurrected (live in the lake, deleted or never there in the source), stale
  (both hold it, with other values).
- **Live set**: the driver's memory after full collections, per JVM: its trend and the classes that grew.
- **Recovery**: a fault is recovered when everything the source committed before its end is
  visible in bronze: the latest visibility among the changes committed before the end, minus the
  end. The same figure at instants away from every fault is the quiet baseline it compares to.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

# The faults the pipeline survives, those of the default schedule first.
# `postgres_blackout` and `postgres_latency` are on the network between Debezium and PostgreSQL (Toxiproxy), the
# `kafka_*` ones on the stream's way to Kafka.
KINDS = ("broker_kill", "kafka_blackout", "postgres_restart", "postgres_blackout", "kafka_latency", "kafka_bandwidth",
         "kafka_reset_peer", "postgres_latency")
DEFAULT_KINDS = KINDS[:4]
# How long each lasts, in seconds: a 30-s broker pause and 60-s blackouts; PostgreSQL down
# long enough that Debezium's task fails and restarts (it retries after 10 s); toxics a minute each.
DURATIONS = {"broker_kill": 30.0, "kafka_blackout": 60.0, "postgres_restart": 20.0, "postgres_blackout": 60.0,
             "kafka_latency": 60.0, "kafka_bandwidth": 60.0, "kafka_reset_peer": 30.0, "postgres_latency": 60.0}


@dataclass(frozen=True)
class Fault:
    """One planned fault: its kind, when it starts (seconds after the steady load started), how long it lasts."""

    kind: str
    at: float
    seconds: float

    @property
    def end(self) -> float:
        return self.at + self.seconds


def schedule(seed: int, minutes: float, every_minutes: float, kinds: Sequence[str] = DEFAULT_KINDS,
             warmup_minutes: float = 3.0, tail_minutes: float = 3.0,
             durations: Mapping[str, float] = DURATIONS) -> list[Fault]:
    """One fault per slot of `every_minutes` between the warm-up and the tail, kinds dealt from a shuffled deck.

    A fault starts at least 10 s into its slot's (after the previous one's recovery had a start) and
    ends before the slot does; a slot shorter than a fault's duration plus 10 s gets none.
    """
    if not kinds or any(k not in KINDS for k in kinds):
        raise ValueError(f"fault kinds must be among {', '.join(KINDS)}: {kinds}")
    rng = random.Random(seed)
    slot, begin, end = every_minutes * 60, warmup_minutes * 60, (minutes - tail_minutes) * 60
    deck: list[str] = []
    faults = []
    at = begin
    while at + slot <= end + 1e-9:
        if not deck:
            deck = list(dict.fromkeys(kinds))
            rng.shuffle(deck)
        kind = deck.pop()
        seconds = durations[kind]
        latest = at + slot - seconds
        if latest >= at + 10:
            faults.append(Fault(kind, round(rng.uniform(at + 10, latest), 1), seconds))
        at += slot
    return faults


@dataclass(frozen=True)
class Tally:
    """One table of the lake against the source's state."""

    source_rows: int
    lake_rows: int
    lost: int
    duplicated: int
    resurrected: int
    stale: int

    @property
    def exact(self) -> bool:
        return not (self.lost or self.duplicated or self.resurrected or self.stale)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "exact": self.exact}


def tally(source: Mapping[Any, Mapping[str, Any]], lake: Iterable[Mapping[str, Any]], key: str,
          columns: Sequence[str]) -> Tally:
    """`lake`'s rows (every copy, as read) against `source` (key -> row): what is lost, duplicated, resurrected, stale.

    Values compare on `columns` only (the lake adds its own); a duplicated key counts once as stale
    if any of its copies differs.
    """
    copies: dict[Any, list[Mapping[str, Any]]] = {}
    for row in lake:
        copies.setdefault(row[key], []).append(row)
    counts = Counter({k: len(v) for k, v in copies.items()})
    stale = sum(1 for k in source.keys() & copies.keys()
                if any(any(r[c] != source[k][c] for c in columns) for r in copies[k]))
    return Tally(source_rows=len(source), lake_rows=sum(counts.values()),
                 lost=len(source.keys() - copies.keys()), duplicated=sum(n - 1 for n in counts.values()),
                 resurrected=len(copies.keys() - source.keys()), stale=stale)


class CatchUp:
    """When everything committed before an instant was visible: changes' (source commit, visibility) times."""

    def __init__(self, committed: Sequence[float], visible: Sequence[float]) -> None:
        order = np.argsort(np.asarray(committed, dtype=float), kind="stable")
        self.committed = np.asarray(committed, dtype=float)[order]
        self.latest = np.maximum.accumulate(np.asarray(visible, dtype=float)[order]) if len(order) else np.zeros(0)

    def seconds_after(self, instant: float) -> float | None:
        """Seconds from `instant` until every change committed before it was visible (0 if already); None if none."""
        n = int(np.searchsorted(self.committed, instant, side="left"))
        return None if n == 0 else round(max(0.0, float(self.latest[n - 1]) - instant), 1)


def affected(committed: np.ndarray, windows: Sequence[tuple[float, float]]) -> np.ndarray:
    """Which changes were committed inside any of `windows` ([from, to) each): a boolean mask."""
    mask = np.zeros(len(committed), dtype=bool)
    for start, end in windows:
        mask |= (committed >= start) & (committed < end)
    return mask


def percentiles(values: np.ndarray) -> dict[str, float | int | None]:
    """p50, p95, max and how many; Nones when there are none (a window without changes)."""
    if not len(values):
        return {"p50": None, "p95": None, "max": None, "n": 0}
    return {"p50": round(float(np.percentile(values, 50)), 2), "p95": round(float(np.percentile(values, 95)), 2),
            "max": round(float(values.max()), 2), "n": len(values)}


def live_summary(readings: list[dict[str, Any]], counted_from: float, growers: int = 8) -> dict[str, Any]:
    """The driver's live set over the counted run, per JVM (a restarted stream is a new one): first and last
    reading, the trend in MiB per minute over all its readings and over their second half (a live set that
    fills bounded stores, then levels off, has a flat second half; a leak does not), and the classes that grew
    most between its first and last reading.

    The trend is Theil-Sen's, the median of the slopes between every two readings: a collection that lands
    while a batch holds its rows (three times the live set around it) moves a least-squares line
    by tens of MiB per minute, and the median by little."""
    jvms: dict[int, list[dict[str, Any]]] = {}
    for r in readings:
        if r["t"] >= counted_from:
            jvms.setdefault(r["pid"], []).append(r)

    def slope(rows: list[dict[str, Any]]) -> float | None:
        if len(rows) < 3:
            return None
        pairs = [(b["live_mib"] - a["live_mib"]) / ((b["t"] - a["t"]) / 60)
                 for i, a in enumerate(rows) for b in rows[i + 1:]]
        return round(float(np.median(pairs)), 2)

    out = []
    for pid, rows in jvms.items():
        first, last = rows[0], rows[-1]
        grew = {c: round(last["classes"].get(c, 0.0) - first["classes"].get(c, 0.0), 2)
                for c in set(first["classes"]) | set(last["classes"])}
        out.append({"pid": pid, "readings": len(rows), "minutes": round((last["t"] - first["t"]) / 60, 1),
                    "live_first_mib": first["live_mib"], "live_last_mib": last["live_mib"],
                    "trend_mib_per_min": slope(rows), "second_half_trend_mib_per_min": slope(rows[len(rows) // 2:]),
                    "grew_most_mib": dict(sorted(grew.items(), key=lambda kv: -kv[1])[:growers])})
    return {"jvms": out}
