"""The operator's view: each table's freshness, the stream's lag, its batches and the alerts firing, from Prometheus.

Why a terminal view of Prometheus' series (`lakehouse dev metrics show`, `--watch` to keep it on screen)
and not a Grafana board or a generated page: the people who run this are on a shell (this machine, the
EMR master), it needs nothing beside the Prometheus that already evaluates the alerts, and it reads the
very series the alert rules read, so what it shows and what fires cannot disagree. A team with Grafana
puts the same queries (`QUERIES`) on a board.

Every figure is a query over a window, not an instant: a stopped stream's series go stale at once, and
an operator asking "how far behind was it?" after the fact needs the last value recorded and the worst.
Series of the same table from several jobs (the stream's exporter, the Pushgateway's copy of an
`ingest --once` run) are taken together: the worst of them.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from pipelines.errors import PrometheusError
from pipelines.monitoring import metric_names as m


def prometheus_api(url: str, path: str, **params: str) -> Any:
    """The `data` of a GET on Prometheus' HTTP API (`/api/v1/...`); PrometheusError with its reason if it fails."""
    target = f"{url.rstrip('/')}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    try:
        with urllib.request.urlopen(target, timeout=10) as response:
            answer = json.load(response)
    except urllib.error.HTTPError as error:  # a bad query: 400 with the reason in the body
        answer = json.loads(error.read() or b"{}")
    except (urllib.error.URLError, OSError) as error:
        raise PrometheusError(f"no answer from Prometheus at {target}: {error}") from error
    if answer.get("status") != "success":
        raise PrometheusError(f"{target}: {answer.get('errorType')}: {answer.get('error')}")
    return answer["data"]


def query(url: str, expr: str) -> list[dict[str, Any]]:
    """An instant query's series, each `{"metric": {labels}, "value": [time, "value"]}`."""
    return prometheus_api(url, "/api/v1/query", query=expr)["result"]


# Each figure's query; `{w}` is the window. The names come from pipelines.monitoring.metric_names, as the alerts'.
_BATCHES = f'{m.BATCH_DURATION.name}_bucket{{{{phase="total"}}}}[{{w}}]'
QUERIES: dict[str, str] = {
    # Bronze's tables (`orders`: behind the source) and silver's and gold's (`gold/customer_ltv`: behind bronze).
    "freshness_last": f"max by (table) (last_over_time({m.TABLE_FRESHNESS.name}[{{w}}]) "
                      f"or last_over_time({m.LAYER_FRESHNESS.name}[{{w}}]))",
    "freshness_max": f"max by (table) (max_over_time({m.TABLE_FRESHNESS.name}[{{w}}]) "
                     f"or max_over_time({m.LAYER_FRESHNESS.name}[{{w}}]))",
    "target": f"max by (table) (last_over_time({m.TABLE_FRESHNESS_TARGET.name}[{{w}}]) "
              f"or last_over_time({m.LAYER_FRESHNESS_TARGET.name}[{{w}}]))",
    "records": f"sum by (table) (increase({m.BATCH_RECORDS.name}[{{w}}]))",
    "commits": f"sum by (table) (increase({m.COMMITS.name}[{{w}}]))",
    "dead_letters": f"sum by (table) (increase({m.DEAD_LETTERS.name}[{{w}}]))",
    "lag_last": f"max by (topic) (last_over_time({m.KAFKA_LAG.name}[{{w}}]))",
    "lag_max": f"max by (topic) (max_over_time({m.KAFKA_LAG.name}[{{w}}]))",
    "batch_p50": f"histogram_quantile(0.5, sum by (le) (increase({_BATCHES})))",
    "batch_p95": f"histogram_quantile(0.95, sum by (le) (increase({_BATCHES})))",
    "batches": f'sum(increase({m.BATCH_DURATION.name}_count{{{{phase="total"}}}}[{{w}}]))',
    "stream_up": 'max(last_over_time(up{{job="lakehouse_stream"}}[{w}]))',
    # 0 is the gauge before the stream's first heartbeat: no heartbeat.
    "heartbeat_age": f"time() - (max(last_over_time({m.STREAM_HEARTBEAT.name}[{{w}}])) > 0)",
    "alerts": 'ALERTS{{alertstate="firing"}}',
}


@dataclass(frozen=True)
class TableRow:
    table: str
    freshness_last: float | None
    freshness_max: float | None
    target: float | None
    records: float | None
    commits: float | None
    dead_letters: float | None


@dataclass(frozen=True)
class Snapshot:
    """One reading of every figure, at `at` (Unix time), over the `window` before it."""

    at: float
    window: str
    tables: list[TableRow]
    lag: dict[str, tuple[float | None, float | None]]  # topic -> (last, max)
    batches: float | None
    batch_p50: float | None
    batch_p95: float | None
    stream_up: float | None
    heartbeat_age: float | None
    alerts: list[dict[str, str]] = field(default_factory=list)


def _by(series: list[dict[str, Any]], label: str) -> dict[str, float]:
    return {s["metric"].get(label, ""): float(s["value"][1]) for s in series}


def _one(series: list[dict[str, Any]]) -> float | None:
    value = float(series[0]["value"][1]) if series else None
    return None if value is None or math.isnan(value) else value


def read(url: str, window: str = "15m") -> Snapshot:
    """Every figure of `QUERIES` over the last `window` (a PromQL duration: 90s, 15m, 2h)."""
    got = {name: query(url, expr.format(w=window)) for name, expr in QUERIES.items()}
    per_table = {name: _by(got[name], "table")
                 for name in ("freshness_last", "freshness_max", "target", "records", "commits", "dead_letters")}
    tables = sorted(set().union(*per_table.values()))
    lag_last, lag_max = _by(got["lag_last"], "topic"), _by(got["lag_max"], "topic")
    return Snapshot(
        at=time.time(), window=window,
        tables=[TableRow(t, *(per_table[name].get(t) for name in per_table)) for t in tables],
        lag={t: (lag_last.get(t), lag_max.get(t)) for t in sorted(set(lag_last) | set(lag_max))},
        batches=_one(got["batches"]), batch_p50=_one(got["batch_p50"]), batch_p95=_one(got["batch_p95"]),
        stream_up=_one(got["stream_up"]), heartbeat_age=_one(got["heartbeat_age"]),
        alerts=[s["metric"] for s in got["alerts"]])


def _num(value: float | None, unit: str = "", digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}{unit}"


def render(snap: Snapshot) -> str:
    """The snapshot as the text `lakehouse dev metrics show` prints: one line per table, per topic, per alert."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(snap.at))
    up = {None: "no series", 1.0: "up"}.get(snap.stream_up, "down")
    lines = [f"as Prometheus recorded them, the {snap.window} before {stamp}",
             f"stream: {up}, heartbeat {_num(snap.heartbeat_age, ' s')} ago; {_num(snap.batches)} batches, "
             f"p50 {_num(snap.batch_p50, ' s', 1)}, p95 {_num(snap.batch_p95, ' s', 1)}"]
    if snap.tables:
        width = max(len("table"), *(len(r.table) for r in snap.tables))
        lines.append(f"{'table':<{width}}  {'freshness':>9}  {'worst':>7}  {'target':>6}  {'records':>9}  "
                     f"{'commits':>7}  {'dead letters':>12}")
        for r in snap.tables:
            over = r.freshness_last is not None and r.target is not None and r.freshness_last > r.target
            late = "  OVER TARGET" if over else ""
            lines.append(f"{r.table:<{width}}  {_num(r.freshness_last, ' s', 1):>9}  "
                         f"{_num(r.freshness_max, ' s', 1):>7}  {_num(r.target, ' s'):>6}  "
                         f"{_num(r.records):>9}  {_num(r.commits):>7}  "
                         f"{_num(r.dead_letters):>12}{late}")
    else:
        lines.append(f"no table series in the last {snap.window}: is the stream's exporter scraped, "
                     "or did an `ingest --once` push?")
    if snap.lag:
        width = max(len("topic"), *map(len, snap.lag))
        lines.append(f"{'topic':<{width}}  {'Kafka lag':>9}  {'worst':>7}")
        lines += [f"{t:<{width}}  {_num(last):>9}  {_num(worst):>7}" for t, (last, worst) in snap.lag.items()]
    lines.append("alerts firing: " + (", ".join(
        a.get("alertname", "?") + "".join(f" {k}={v}" for k, v in sorted(a.items())
                                          if k in ("table", "topic", "instance")) for a in snap.alerts) or "none"))
    return "\n".join(lines)
