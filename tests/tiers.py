"""Every test belongs to exactly one tier, by its marker; both suites' conftests enforce it at collection.

- `unit`: starts no JVM, Kafka broker, PostgreSQL, Airflow, Prometheus or Toxiproxy: passes after
  `make dev` alone, JAVA_HOME pointing nowhere (`make test-unit`).
- `integration`: the rest of what `make test` runs (real Spark, Hudi, Kafka, PostgreSQL + Debezium,
  Airflow, Debian's Prometheus, Toxiproxy).
- `environment`: the pipeline on an environment other than the embedded local default (`make test-environments`).

A file whose tests are all one tier says so once (`pytestmark = pytest.mark.unit`); a file that mixes tiers
marks each test. A test with no tier or two fails its file's collection, and so every run, whatever `-m`
selects: it cannot drop out of all three targets unnoticed.
"""

from __future__ import annotations

import pytest

TIERS = ("unit", "integration", "environment")


def check_tiers(report: pytest.CollectReport) -> None:
    """Turn the collection report of a module or class into a failure if a test it holds has no tier or two."""
    wrong = []
    for item in report.result:
        if isinstance(item, pytest.Item):
            tiers = sorted({mark.name for mark in item.iter_markers() if mark.name in TIERS})
            if len(tiers) != 1:
                wrong.append(f"  {item.nodeid}: {', '.join(tiers) or 'no tier'}")
    if wrong:
        report.outcome = "failed"
        report.longrepr = (f"each test needs exactly one of the markers {', '.join(TIERS)} (tests/tiers.py):\n"
                           + "\n".join(wrong))
