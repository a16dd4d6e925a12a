"""The lake a job works on, in one object: where it is, which tables it holds, the configuration it was found
by, the Spark session that reads and writes it and the key of its pseudonyms.

Built once where a job starts (a CLI command, a DAG task's command, a test) and handed down, so that every part
of one job sees the same root and the same declaration: nothing below reads them from the environment or keeps
a copy of its own. The Spark session and the erasure key are made on first use: a command that reads only
the timeline never starts a JVM, and one that hashes nothing never reads a secret.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pipelines.lake.declaration import Declaration
from pipelines.runtime import settings
from pipelines.runtime.config import Config, Loaded, load_config
from pipelines.runtime.declared import read_declaration

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@dataclass
class Lake:
    """One lake: `root` (a path or URI), its `declaration`, and, made when first asked for, `spark` and
    `erasure_key`.

    `app` names the Spark application (`lakehouse-<command>`) and `spark_options` are set on the session as it
    starts; `session` is one already running (tests, a job that made its own). `loaded` is the configuration
    (pipelines.runtime.config) the lake was found by, with where each setting came from.
    """

    root: str
    declaration: Declaration
    app: str = "lakehouse"
    loaded: Loaded = field(default_factory=lambda: Loaded(Config()), repr=False)
    spark_options: dict[str, str] = field(default_factory=dict)
    session: SparkSession | None = field(default=None, repr=False)
    key: str | None = field(default=None, repr=False)

    @classmethod
    def from_environment(cls, app: str = "lakehouse", loaded: Loaded | None = None, **given: object) -> Lake:
        """The lake the configuration points at (`loaded`, default: `load_config()`, the file, profile and
        environment variables as found): its `[lake] root` and `tables`, else the checkout's `lake/` and the
        packaged declaration; `given` overrides any field."""
        loaded = loaded or load_config()
        fields: dict = {"root": loaded.config.lake.root or settings.default_lake_root(), "app": app,
                        "loaded": loaded, **given}
        if "declaration" not in fields:
            fields["declaration"] = read_declaration(loaded)
        return cls(**fields)

    @property
    def config(self) -> Config:
        """The effective configuration: every section, checked."""
        return self.loaded.config

    @classmethod
    def at(cls, root: str, spark: SparkSession | None = None) -> Lake:
        """The lake at `root` with the environment's declaration, on `spark` if given (tests, benchmarks)."""
        return cls.from_environment(root=root, session=spark)

    @property
    def spark(self) -> SparkSession:
        """The job's Spark session, started on first use with `app` and `spark_options`."""
        if self.session is None:
            from pipelines.runtime.spark import get_spark

            self.session = get_spark(self.app, self.spark_options, self.declaration)
        return self.session

    @property
    def erasure_key(self) -> str:
        """The secret of the pseudonymising hash, read on first use: where `[lake] erasure_key` says, else as
        pipelines.runtime.secrets finds it (its variables, else the key file)."""
        if self.key is None:
            from pipelines.runtime.secrets import checked_erasure_key, erasure_key

            where = self.config.lake.erasure_key
            self.key = erasure_key() if where is None else checked_erasure_key(where.reveal(), where.where())
        return self.key

    def with_declaration(self, declaration: Declaration) -> Lake:
        """The same lake and session under another declaration (a stream that moved to a changed file)."""
        return dataclasses.replace(self, declaration=declaration)
