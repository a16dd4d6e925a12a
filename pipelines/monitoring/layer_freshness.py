"""How far silver and gold are behind bronze: how long the oldest change that bronze holds and a table does not
has waited for it.

Read from the tables' timelines alone (pipelines.lake.timeline_files: no JVM, no Spark), so `lakehouse status` and
the stream's exporter can say it at any moment, between ETL cycles too. Each output's newest ETL commit records what
it consumed of each input (`_lakehouse.checkpoint`); the input's first commit completed after that which changed rows
holds what the output waits for, since that commit's completion. An output also waits for what its inputs wait for
(gold for what silver has not read of bronze). Nothing waiting is 0, as for bronze: a quiet table is not stale.

Bronze's own part, a change that Kafka holds and bronze does not yet, is the stream's freshness
(`lakehouse_table_freshness_seconds`), not counted here: it is in no timeline.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from functools import cache

from prometheus_client.core import GaugeMetricFamily, Metric

import hudi_configs
from pipelines.errors import StorageError
from pipelines.lake.catalog import lake_catalog
from pipelines.lake.declaration import Declaration
from pipelines.lake.hudi_timeline import CHECKPOINT_META
from pipelines.lake.layout import lake_relative
from pipelines.lake.timeline_files import Instant, instant_datetime, instant_metadata, timeline
from pipelines.monitoring import metric_names

log = logging.getLogger(__name__)

LAYERS = ("silver", "gold")


@dataclass(frozen=True)
class LayerFreshness:
    """One silver or gold table's wait: `waiting_seconds` 0 when it holds every change its inputs hold."""

    table: str
    waiting_seconds: float
    waiting_commits: int  # commits that changed rows, of its inputs since its checkpoint, and those they wait for
    target_seconds: float

    @property
    def behind(self) -> bool:
        return self.waiting_seconds > self.target_seconds

    def as_dict(self) -> dict[str, object]:
        return {"waiting_seconds": round(self.waiting_seconds, 1), "waiting_commits": self.waiting_commits,
                "target_seconds": self.target_seconds, "behind": self.behind}


def target_seconds() -> float:
    """hudi_configs/table_services.toml `[freshness] target_seconds`: how far behind bronze silver and gold may be."""
    return float(hudi_configs.section("table_services", "freshness")["target_seconds"])


def _marks(path: str, commits: list[Instant]) -> dict[str, str] | None:
    """The checkpoint of the newest commit that has one (services' and erasures' commits have none)."""
    for instant in reversed(commits):
        extra = instant_metadata(path, instant).get("extraMetadata") or {}
        if CHECKPOINT_META in extra:
            return {lake_relative(k): v for k, v in json.loads(extra[CHECKPOINT_META]).items()}
    return None


def _oldest_waiting(commits: Iterable[Instant], since: str | None) -> tuple[str | None, int]:
    """(completion of the first commit after `since` that changed rows, how many did) of an input's commits."""
    waiting = [i.completed for i in commits
               if i.changes_data and i.completed and (since is None or i.completed > since)]
    return (min(waiting), len(waiting)) if waiting else (None, 0)


def layer_freshness(root: str, decl: Declaration, now: datetime | None = None) -> dict[str, LayerFreshness]:
    """Every silver and gold table written yet, by name (`silver/orders`, `gold/_customer_orders`, ...)."""
    now = now or datetime.now()  # instants are in the timeline's time zone, Hudi's default LOCAL (as the project's)
    target = target_seconds()
    paths = {t.name: t.path(root) for t in lake_catalog(decl)}

    @cache
    def commits(name: str) -> list[Instant]:  # listed only for the outputs and what they read
        return [i for i in timeline(paths[name]) if i.is_commit] if name in paths else []

    waits: dict[str, tuple[str | None, int]] = {}

    def wait(name: str) -> tuple[str | None, int]:
        """(completion the table has waited since, or None; input commits waiting) of one output, inputs first."""
        if name in waits:
            return waits[name]
        waits[name] = (None, 0)  # a cycle of checkpoints (none is written) cannot recurse for ever
        marks = _marks(paths[name], commits(name)) or {}
        since: list[str] = []
        count = 0
        for source, mark in marks.items():
            first, n = _oldest_waiting(commits(source), mark)
            upstream, m = wait(source) if source in paths and source.split("/")[0] in LAYERS else (None, 0)
            count += n + m
            since += [s for s in (first, upstream) if s]
        waits[name] = (min(since) if since else None, count)
        return waits[name]

    found = {}
    for name in (n for n in paths if n.split("/")[0] in LAYERS and commits(n)):
        first, count = wait(name)
        age = 0.0 if first is None else max(0.0, (now - instant_datetime(first)).total_seconds())
        found[name] = LayerFreshness(name, age, count, target)
    return found


class LayerFreshnessCollector:
    """Silver's and gold's freshness for a Prometheus registry (the stream's exporter), computed as it is scraped.

    The timelines are read at most every `[freshness] every_seconds`; in between, a waiting table's figure is
    aged by the time since. A lake that cannot be read fails no scrape: it is logged, and no figure is given.
    """

    def __init__(self, root: str, decl: Declaration) -> None:
        self.root, self.decl = root, decl
        self.every = float(hudi_configs.section("table_services", "freshness")["every_seconds"])
        self._found: dict[str, LayerFreshness] = {}
        self._read_at: float | None = None

    def follow(self, root: str, decl: Declaration) -> None:
        """The stream's next query runs under `decl`: tables declared since get figures at the next read."""
        self.root, self.decl = root, decl

    def describe(self) -> list[Metric]:
        return []  # registered without a first read of the lake

    def collect(self) -> Iterator[Metric]:
        now = time.monotonic()
        if self._read_at is None or now - self._read_at >= self.every:
            try:
                self._found = layer_freshness(self.root, self.decl)
            except (OSError, StorageError) as error:
                log.warning("silver's and gold's freshness: the lake's timelines cannot be read: %s", error)
                self._found = {}
            self._read_at = now
        aged = now - self._read_at
        m = metric_names
        fresh = GaugeMetricFamily(m.LAYER_FRESHNESS.name, m.LAYER_FRESHNESS.help, labels=m.LAYER_FRESHNESS.labels)
        target = GaugeMetricFamily(m.LAYER_FRESHNESS_TARGET.name, m.LAYER_FRESHNESS_TARGET.help,
                                   labels=m.LAYER_FRESHNESS_TARGET.labels)
        for name, f in sorted(self._found.items()):
            fresh.add_metric([name], f.waiting_seconds + aged if f.waiting_commits else 0.0)
            target.add_metric([name], f.target_seconds)
        yield fresh
        yield target
