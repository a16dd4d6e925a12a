"""The alerting rules as Prometheus reads them: promtool's checks and unit tests, and the metric names they use.

No server: promtool (Debian's prometheus package, which `make setup` installs) parses and
evaluates the rules on the synthetic series of docker/prometheus/alerts_test.yml.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

from lakehouse_dev.prometheus import CONFIG_DIR, PUSHGATEWAY_JOB, SPARK_JOBS, STREAM_JOB, TEMPLATE
from pipelines.monitoring import metric_names

pytestmark = pytest.mark.integration

RULES = CONFIG_DIR / "alerts.yml"
RULE_TESTS = CONFIG_DIR / "alerts_test.yml"
STREAM_TOML = Path(__file__).resolve().parent.parent / "hudi_configs" / "stream.toml"
METRIC = re.compile(r"\blakehouse_[a-z_]+")
LABEL_VALUE = re.compile(r'"[^"]*"')  # `job="lakehouse_stream"` names a job, not a metric


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    found = shutil.which("promtool")
    assert found, "no `promtool` on PATH: `make prometheus` (part of `make setup`) installs Debian's prometheus"
    return subprocess.run([found, *args], capture_output=True, text=True, check=False, timeout=60)


def alerting_rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


@pytest.mark.parametrize("args", [("check", "config", str(TEMPLATE)), ("check", "rules", str(RULES)),
                                  ("test", "rules", str(RULE_TESTS))], ids=lambda args: " ".join(args[:2]))
def test_promtool_accepts_the_config_and_the_rules_pass_their_tests(args: tuple[str, ...]) -> None:
    done = promtool(*args)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    fired: set[str] = set()
    silent: set[str] = set()
    for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (fired if check.get("exp_alerts") else silent).add(check["alertname"])
    alerts = {rule["alert"] for rule in alerting_rules()}
    assert alerts <= fired, f"no case where these fire: {sorted(alerts - fired)}"
    assert alerts <= silent, f"no case where these stay silent: {sorted(alerts - silent)}"


def test_the_rules_name_only_defined_metrics_and_jobs() -> None:
    used = {name for rule in alerting_rules() for name in METRIC.findall(LABEL_VALUE.sub("", rule["expr"]))}
    assert used, "no lakehouse_ metric in the rules: the pattern no longer matches them"
    undefined = used - metric_names.series_names()
    assert not undefined, f"not in pipelines/monitoring/metric_names.py: {sorted(undefined)}"
    jobs = {job for rule in alerting_rules() for job in re.findall(r'job="([^"]+)"', rule["expr"])}
    scraped = {job["job_name"] for job in yaml.safe_load(TEMPLATE.read_text())["scrape_configs"]}
    assert scraped == {STREAM_JOB, PUSHGATEWAY_JOB, *SPARK_JOBS}
    assert jobs <= scraped, f"rules on jobs nothing scrapes: {sorted(jobs - scraped)}"


def test_the_metric_names_follow_prometheus_conventions() -> None:
    names = [m.name for m in metric_names.ALL]
    assert len(set(names)) == len(names)
    for metric in metric_names.ALL:
        assert re.fullmatch(r"lakehouse_[a-z]+(_[a-z]+)+", metric.name), metric.name
        # `_total` names a counter and nothing else; a histogram's own suffixes are added by the client.
        assert metric.name.endswith("_total") == (metric.kind == "counter"), metric.name
        assert not metric.name.endswith(metric_names.HISTOGRAM_SERIES), metric.name
        assert metric.help and all(re.fullmatch(r"[a-z_]+", label) for label in metric.labels), metric


def test_the_stale_heartbeat_alert_waits_as_long_as_the_supervisors() -> None:
    """A stream the supervisors still count alive must not page anyone, nor one they call dead stay silent."""
    (rule,) = [r for r in alerting_rules() if r["alert"] == "LakehouseStreamHeartbeatStale"]
    threshold = re.fullmatch(r"time\(\) - lakehouse_stream_heartbeat_timestamp_seconds > (\d+)", rule["expr"].strip())
    assert threshold, rule["expr"]
    dead_after = tomllib.loads(STREAM_TOML.read_text())["health"]["dead_after_seconds"]
    assert int(threshold.group(1)) == dead_after
