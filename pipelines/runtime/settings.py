"""Where things are: the lake root, the brokers, the project's resolved JVM artifacts.

Environment variables are the contract's way to point the pipeline somewhere
(section 5); defaults keep a fresh clone runnable with no configuration.
"""

from __future__ import annotations

import os
from pathlib import Path

from pipelines.errors import SetupError

PROJECT_ROOT = Path(__file__).resolve().parents[2]
# The ingest stream's micro-batch interval: with the etl schedule, it sets how many commits a
# retention window holds (hudi_configs/table_services.toml, "Retention"). A batch longer than it
# starts the next at once, so under load the stream runs back to back, and a change waits for
# at most one batch before its own instead of up to a whole interval.
# It still bounds the commit rate of a quiet stream, for the timelines' sake
# (`keep.*.commits`).
INGEST_TRIGGER_SECONDS = 5.0
# Debezium's `unavailable.value.placeholder`: what an update carries instead of a TOASTed value it
# left unchanged. The connector (lakehouse_dev.pg_source) is configured with this same string.
DEFAULT_UNAVAILABLE_PLACEHOLDER = "__debezium_unavailable_value"


def unavailable_placeholder() -> str:
    """`LAKEHOUSE_UNAVAILABLE_PLACEHOLDER`, the connector's `unavailable.value.placeholder` (its default if unset)."""
    return os.environ.get("LAKEHOUSE_UNAVAILABLE_PLACEHOLDER") or DEFAULT_UNAVAILABLE_PLACEHOLDER


def default_lake_root() -> str:
    """The lake when the configuration names none: `lake/` in the checkout (git-ignored)."""
    return str(PROJECT_ROOT / "lake")


def lake_root() -> str:
    """`LAKEHOUSE_ROOT`, a local path or a URI; default `./lake` in the checkout (git-ignored)."""
    return os.environ.get("LAKEHOUSE_ROOT") or default_lake_root()


def kafka_bootstrap() -> str:
    return os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")


def log_dir() -> Path:
    """`LAKEHOUSE_LOG_DIR`: where each command's log file goes (Spark, Hudi, libraries); default `.logs/`."""
    return Path(os.environ.get("LAKEHOUSE_LOG_DIR") or PROJECT_ROOT / ".logs")


def lineage_dir() -> Path:
    """`LAKEHOUSE_LINEAGE_DIR`: where the local OpenLineage transports append their events (`spark.jsonl`,
    `airflow.jsonl`; docs/deploying.md, "Lineage"); default `lineage/` in the log folder."""
    return Path(os.environ.get("LAKEHOUSE_LINEAGE_DIR") or log_dir() / "lineage")


def jvm_dir() -> Path:
    """Folder that `make setup` resolves jvm/pom.xml into (`spark/` and `kafka/` below it)."""
    return Path(os.environ.get("LAKEHOUSE_JVM_DIR") or PROJECT_ROOT / ".jvm")


def spark_home() -> Path:
    """The pip pyspark of the project's environment (.venv): Spark's home for spark-submit and spark-class.

    Looked up in .venv, not in the running interpreter: Airflow's environment has no pyspark (or
    the jar-less pyspark-client), and its tasks and the cluster's daemons still need the real one.
    """
    homes = sorted((PROJECT_ROOT / ".venv" / "lib").glob("python3*/site-packages/pyspark"))
    if homes:
        return homes[-1]
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise SetupError(f"no pyspark in {PROJECT_ROOT / '.venv'}: run `make setup`")
    return Path(spec.origin).parent


def source_state_file() -> Path:
    """The simulated source database of `lakehouse dev generate`.

    Outside the lake root on purpose: it holds names and e-mails, and erasure must be
    able to prove that nothing under the lake root does.
    """
    return Path(os.environ.get("LAKEHOUSE_SOURCE_STATE") or PROJECT_ROOT / ".source" / "shop_state.json")


def erasure_key_file() -> Path:
    """Key of the ids' pseudonyms when LAKEHOUSE_ERASURE_KEY is unset: outside the lake, like the source state."""
    return Path(os.environ.get("LAKEHOUSE_ERASURE_KEY_FILE") or PROJECT_ROOT / ".secrets" / "erasure.key")
