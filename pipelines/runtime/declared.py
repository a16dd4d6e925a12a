"""Which declaration of tables the configuration names, read: what a job declares before any lake exists (the
lake object, pipelines.runtime.lake, holds one; the Spark session ships one to a cluster's executors)."""

from __future__ import annotations

from pipelines.lake.declaration import Declaration, load, packaged
from pipelines.runtime.config import Loaded, load_config


def read_declaration(loaded: Loaded | None = None) -> Declaration:
    """The declaration the configuration names (`[lake] tables`, `LAKEHOUSE_TABLES`; else the packaged one), read
    and checked now; `loaded` default: the configuration as the environment finds it (`load_config`)."""
    return load((loaded or load_config()).config.lake.tables or packaged())
