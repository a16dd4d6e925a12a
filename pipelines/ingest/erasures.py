"""The erasure registry as the ingest stream filters with it: events and malformed records of erased
customers (and of their rows in every declared table with a `subject`) never reach the lake again.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame

from pipelines.lake.declaration import Declaration
from pipelines.lake.erasure_registry import (
    dead_letters_without_erased,
    read_registry,
    registry_path,
    without_erased,
)
from pipelines.lake.frames import materialized
from pipelines.lake.hudi_timeline import latest_completion
from pipelines.lake.table_stats import has_completed_commit
from pipelines.runtime.lake import Lake


@dataclass(frozen=True)
class Erased:
    """The registry (cached), the key of its pseudonyms, the registry's version (its newest commit's completion)
    and the declaration whose tables' subjects and keys it filters by (the stream's query's)."""

    registry: DataFrame
    key: str
    version: str
    decl: Declaration

    def changes(self, changes: DataFrame, table: str) -> DataFrame:
        """`changes` of declared `table` without those of erased customers and their rows (none without a subject)."""
        return without_erased(changes, table, self.registry, self.key, self.decl)

    def dead_letters(self, rows: DataFrame) -> DataFrame:
        """Dead letters without those of erased customers: a malformed record of one is not kept either."""
        return dead_letters_without_erased(rows, self.registry, self.key, self.decl)


class ErasureRegistry:
    """The registry, looked up every batch (an erasure may have added to it) and read again only when it changed.

    `lake`: the stream's lake under its query's declaration. Its erasure key is read when the registry is first
    found, not before: a lake nobody was erased from never reads the secret.
    """

    def __init__(self, lake: Lake) -> None:
        self.lake = lake
        self._erased: Erased | None = None

    def erased(self) -> Erased | None:
        """The registry as of now; None before any erasure."""
        spark, root = self.lake.spark, self.lake.root
        path = registry_path(root)
        version = latest_completion(spark, path) if has_completed_commit(path) else None
        if version is None:
            return None
        if self._erased is None or self._erased.version != version:
            registry = read_registry(spark, root)
            assert registry is not None, "a registry with a completed commit reads as a frame"
            self._erased = Erased(materialized(registry), self.lake.erasure_key, version, self.lake.declaration)
        return self._erased
