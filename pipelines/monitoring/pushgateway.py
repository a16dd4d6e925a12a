"""The batch jobs' metrics, pushed to Prometheus' Pushgateway at the end of each run (pure Python, no Spark).

A batch job lives for minutes: nothing would be there for Prometheus to scrape, so each run pushes its
figures to the Pushgateway (LAKEHOUSE_PUSHGATEWAY, `host:port`; unset: no push), which Prometheus scrapes
as the job `pushgateway` keeping the pushed labels (docker/prometheus/prometheus.yml, `honor_labels`).
Following Prometheus' advice for batch jobs, every run pushes its duration and, when it succeeded, the
time of its success; the figures of its work are its own (pipelines/monitoring/metric_names.py names them all).

One group per job and lake: the grouping key is `job` (the command, `lakehouse_etl`) and `lake` (the
lake root), so two lakes' runs do not overwrite each other. A push (POST) replaces the metrics it
pushes, each with all its series, and keeps the group's others (a failed run pushes its duration only,
and the counters stay). So what a run pushes of a metric is made whole first, from what the group held
before (read back from the gateway):

- a counter's series (and a histogram's) is the group's last value plus this run's count: a counter
  counts over all the job's runs, as metric_names' docstring says, and `increase()` sees each run's
  rows. A gateway that lost its groups (restarted without its persistence file) starts them again
  from the next run's count: a reset, which `rate()` and `increase()` take in their stride. A series'
  first push is its first sample, which `increase()` does not count (as with a process's new series);
  the jobs push every table's series from their first run, at 0 where nothing happened, so only that
  first run's own counts are not seen;
- a gauge's series that this run did not set keeps its last value (a table the run did not touch,
  the last success of a run that failed).

A push that fails logs one warning and the job goes on: its data is written, and a missing point is
what Prometheus' `absent()` and the last-success age are for. Runs of one job on one lake must not
overlap (the DAGs run them one at a time): two at once would each add to the same last value.
"""

from __future__ import annotations

import logging
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.metrics_core import Metric as Family
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

import hudi_configs
from pipelines.monitoring import metric_names
from pipelines.monitoring.metric_names import Metric

log = logging.getLogger(__name__)

VARIABLE = hudi_configs.PUSHGATEWAY_VARIABLE
# The labels of the group a run pushes to (the gateway adds `instance=""` to every series it keeps).
GROUP_LABELS = ("job", "lake", "instance")
# Seconds a push (and the read of the group before it) may take: a gateway that hangs must not hold the job.
TIMEOUT = 10.0
_CUMULATIVE = ("counter", "histogram", "summary")

SampleKey = tuple[str, frozenset[tuple[str, str]]]


def gateway() -> str | None:
    """LAKEHOUSE_PUSHGATEWAY (`host:port`), None when unset: the jobs push nothing (Hudi's reporter is off too)."""
    return hudi_configs.pushgateway()


class JobMetrics:
    """One run's metrics, in a registry of their own, pushed with `push` at the end of the run.

    `started` is taken when the run starts (construct it first), for the duration pushed.
    """

    def __init__(self, job: str, lake: str, only: Iterable[Metric] | None = None) -> None:
        """`only`: push these metrics of the registries and no others (and the run's duration and success)."""
        prometheus_client.disable_created_metrics()  # the `_created` series: nothing queries them
        self.job, self.lake = job, lake
        self.only = None if only is None else frozenset(
            x.name for x in (*only, metric_names.JOB_DURATION, metric_names.JOB_LAST_SUCCESS))
        self.registry = CollectorRegistry()
        self.started = time.monotonic()
        self._made: dict[str, Any] = {}

    def counter(self, metric: Metric) -> Counter:
        assert metric.kind == "counter", metric
        return self._made.get(metric.name) or self._make(metric, Counter)

    def gauge(self, metric: Metric) -> Gauge:
        assert metric.kind == "gauge", metric
        return self._made.get(metric.name) or self._make(metric, Gauge)

    def _make(self, metric: Metric, kind: type) -> Any:
        made = self._made[metric.name] = kind(metric.name, metric.help, metric.labels, registry=self.registry)
        return made

    def push(self, *also: CollectorRegistry, succeeded: bool | None = True) -> bool:
        """Push the run's figures, its duration, and (`succeeded`) its success time; False (logged) if it failed.

        `succeeded` None: a group that is a state, not a run's (the erasure inbox): no duration, no success.
        `also`: further registries pushed with the run's, in its group (one push replaces the group).
        """
        if succeeded is not None:
            self.gauge(metric_names.JOB_DURATION).set(time.monotonic() - self.started)
        if succeeded:
            self.gauge(metric_names.JOB_LAST_SUCCESS).set(time.time())
        return push(self.job, self.lake, (self.registry, *also), self.only)


def push(job: str, lake: str, registries: Iterable[CollectorRegistry], only: frozenset[str] | None = None) -> bool:
    """Push the registries as the group {job, lake}, made whole from the group's last push (module docstring);
    `only`: the names of the metrics pushed, None for all.

    Nothing when LAKEHOUSE_PUSHGATEWAY is unset (True). Any failure is one warning and False: the job's
    work is done and must not fail for its metrics.
    """
    if (where := gateway()) is None:
        return True
    key = {"lake": lake}
    try:
        before = _group(where, job, lake)
        prometheus_client.pushadd_to_gateway(where, job=job, registry=_Merged(registries, before, only),
                                             grouping_key=key, timeout=TIMEOUT)
    except (OSError, ValueError, urllib.error.URLError) as error:  # HTTPError too: the gateway refused the push
        log.warning("metrics of %s not pushed to the Pushgateway %s (%s=%s): %s", job, where, VARIABLE, where, error)
        return False
    log.info("metrics of %s pushed to the Pushgateway %s", job, where)
    return True


def _url(where: str) -> str:
    return where if "://" in where else f"http://{where}"


def _group(where: str, job: str, lake: str) -> dict[SampleKey, float]:
    """The samples the group {job, lake} holds now, without the group's labels; empty when there is none."""
    with urllib.request.urlopen(f"{_url(where)}/metrics", timeout=TIMEOUT) as response:
        text = response.read().decode()
    found: dict[SampleKey, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("job") == job and sample.labels.get("lake") == lake:
                found[_key(sample.name, sample.labels)] = sample.value
    return found


def _key(name: str, labels: dict[str, str]) -> SampleKey:
    """A sample's identity across expositions: `le` and `quantile` as numbers (Go writes 1, Python 1.0)."""
    kept = {k: (repr(float(v)) if k in ("le", "quantile") else v) for k, v in labels.items() if k not in GROUP_LABELS}
    return name, frozenset(kept.items())


class _Merged:
    """Registries' families with the group's last values folded in (a collector for push_to_gateway)."""

    def __init__(self, registries: Iterable[CollectorRegistry], before: dict[SampleKey, float],
                 only: frozenset[str] | None) -> None:
        self.registries, self.before = tuple(registries), before
        self.only = None if only is None else {name.removesuffix("_total") for name in only}

    def collect(self) -> Iterable[Family]:
        for family in (f for registry in self.registries for f in registry.collect()):
            if self.only is not None and family.name not in self.only:
                continue
            merged = Family(family.name, family.documentation, family.type, family.unit)
            prefix = family.name
            cumulative = family.type in _CUMULATIVE
            seen = set()
            for s in family.samples:
                if s.name.endswith("_created"):
                    continue
                key = _key(s.name, s.labels)
                seen.add(key)
                value = s.value + self.before.get(key, 0.0) if cumulative else s.value
                merged.samples.append(Sample(s.name, s.labels, value))
            for (name, labels), value in self.before.items():
                if (key := (name, labels)) not in seen and _of(name, prefix, family.type):
                    merged.samples.append(Sample(name, dict(labels), value))
            yield merged


def _of(sample: str, family: str, kind: str) -> bool:
    """Whether a sample name is one of a family's series (a counter's `_total`, a histogram's three)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                "summary": ("", "_sum", "_count")}.get(kind, ("",))
    return any(sample == family + suffix for suffix in suffixes)
