"""Where things are: the lake root, the brokers, the project's resolved JVM artifacts.

Environment variables are the contract's way to point the pipeline somewhere
(section 5); defaults keep a fresh clone runnable with no configuration.
"""

from __future__ import annotations

import os
from pathlib import Path

from pipelines.contract import TABLES

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def lake_root() -> str:
    """`LAKEHOUSE_ROOT`, a local path or a URI; default `./lake` in the checkout (git-ignored)."""
    return os.environ.get("LAKEHOUSE_ROOT") or str(PROJECT_ROOT / "lake")


def kafka_bootstrap() -> str:
    return os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")


def jvm_dir() -> Path:
    """Folder that `make setup` resolves jvm/pom.xml into (`spark/` and `kafka/` below it)."""
    return Path(os.environ.get("LAKEHOUSE_JVM_DIR") or PROJECT_ROOT / ".jvm")


# Lake tables whose changes `lakehouse changes` serves (pure Python: the CLI lists them without Spark).
CHANGE_FEED_TABLES: tuple[str, ...] = tuple(
    f"{layer}/{table}" for layer in ("bronze", "silver") for table in TABLES)


def table_path(layer: str, table: str, root: str | None = None) -> str:
    """`$LAKEHOUSE_ROOT/<layer>/<table>`, the contract's location of every table."""
    return f"{(root or lake_root()).rstrip('/')}/{layer}/{table}"


def source_state_file() -> Path:
    """The simulated source database of `lakehouse generate`.

    Outside the lake root on purpose: it holds names and e-mails, and erasure must be
    able to prove that nothing under the lake root does.
    """
    return Path(os.environ.get("LAKEHOUSE_SOURCE_STATE") or PROJECT_ROOT / ".source" / "shop_state.json")
