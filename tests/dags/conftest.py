"""Airflow tests, run in .venv-airflow (`make test`): a throwaway AIRFLOW_HOME with a migrated database.

The lake tables they work on are built by the real pipeline, through the project's CLI in
.venv (Airflow's environment has no Spark, as in production).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parents[2]
DAGS = PROJECT / "dags"
LAKEHOUSE = PROJECT / ".venv" / "bin" / "lakehouse"

# Before anything imports airflow: its settings are read at import.
_home = Path(tempfile.mkdtemp(prefix="airflow-home-"))
os.environ.update({
    "AIRFLOW_HOME": str(_home),
    "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
    "TZ": "UTC",
})
sys.path[:0] = [str(DAGS), str(PROJECT)]  # the DAGs' helper module; tests.hudi_files


@pytest.fixture(scope="session", autouse=True)
def airflow_db() -> Iterator[None]:
    subprocess.run([str(Path(sys.executable).with_name("airflow")), "db", "migrate"], check=True,
                   capture_output=True)
    yield


def lakehouse(*args: str, env: dict[str, str] | None = None, timeout: float = 900) -> str:
    """Run the project's CLI in .venv; fail with its stderr."""
    done = subprocess.run([str(LAKEHOUSE), *args], env={**os.environ, **(env or {})}, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"lakehouse {' '.join(args)}: {done.stderr[-3000:]}"
    return done.stdout
