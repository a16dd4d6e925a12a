"""Every Spark and Hudi option of the project, in TOML files beside this module.

Options live here, not in the code, so that an operator can read and tune one
place, and so that the EMR target ships the same files as the local one.

`LAKEHOUSE_HUDI_OVERRIDES` may name further TOML files (separated by `os.pathsep`, merged
in that order) whose tables `[<name>.<part>]` are merged over `[<part>]` of `<name>.toml`:
tuning a deployment without editing the project's files. The test suite sizes Spark and Hudi
for its small data this way (`test_profile.toml`), and a test may add its own file after it.

`LAKEHOUSE_TABLE_SERVICES` (inline | external) and `LAKEHOUSE_TARGET` (local | emr) select
what `writer()` adds to a table's options: see table_services.toml; so does where the lake is
(a local disk or an object store): see storage.toml.
"""

from __future__ import annotations

import os
import tomllib
from functools import cache
from importlib import resources
from pathlib import Path


@cache
def _read(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"no config file {path}")
    with path.open("rb") as fh:
        return tomllib.load(fh)


@cache
def _load(name: str) -> dict:
    # Through importlib.resources: on EMR these files travel inside lakehouse.zip (--py-files).
    return tomllib.loads(resources.files(__package__).joinpath(f"{name}.toml").read_text())


def section(name: str, part: str) -> dict[str, str]:
    """Options of `[part]` in `<name>.toml`, as the strings Spark and Hudi expect."""
    doc = _load(name)
    if part not in doc:
        raise KeyError(f"{name}.toml has no [{part}] section (has: {', '.join(doc)})")
    options = dict(doc[part])
    for overrides in filter(None, os.environ.get("LAKEHOUSE_HUDI_OVERRIDES", "").split(os.pathsep)):
        options |= _read(Path(overrides)).get(name, {}).get(part, {})
    return {k: _as_option(v) for k, v in options.items()}


def test_profile() -> Path:
    """The test suite's sizing of Spark and Hudi for small data (an overrides file, see above)."""
    return Path(__file__).with_name("test_profile.toml")


SERVICE_MODES = ("inline", "external")
TARGETS = ("local", "emr")


def _choice(variable: str, default: str, allowed: tuple[str, ...]) -> str:
    value = os.environ.get(variable) or default
    if value not in allowed:
        raise ValueError(f"{variable}={value!r}: expected one of {', '.join(allowed)}")
    return value


def target() -> str:
    """`LAKEHOUSE_TARGET`: where Spark runs (local | emr)."""
    return _choice("LAKEHOUSE_TARGET", "local", TARGETS)


def service_mode() -> str:
    """`LAKEHOUSE_TABLE_SERVICES`: inline (writers run them) | external (a separate job does)."""
    return _choice("LAKEHOUSE_TABLE_SERVICES", "inline", SERVICE_MODES)


def writer(name: str, part: str) -> dict[str, str]:
    """Options of a writer of the tables of `[part]` in `<name>.toml`, with the table-services mode's own."""
    options = section(name, part) | _storage() | metrics()
    if service_mode() == "external":
        options |= section("table_services", "external") | _lock()
    return options


PUSHGATEWAY_VARIABLE = "LAKEHOUSE_PUSHGATEWAY"


def pushgateway() -> str | None:
    """`LAKEHOUSE_PUSHGATEWAY`: where the jobs push their metrics (`host:port`), None (unset): nowhere."""
    return os.environ.get(PUSHGATEWAY_VARIABLE) or None


def metrics() -> dict[str, str]:
    """Hudi's metrics reporter (metrics.toml [pushgateway]) pointed at LAKEHOUSE_PUSHGATEWAY; none when unset."""
    if (where := pushgateway()) is None:
        return {}
    host, _, port = where.removeprefix("http://").rstrip("/").rpartition(":")
    return section("metrics", "pushgateway") | {"hoodie.metrics.pushgateway.host": host,
                                                "hoodie.metrics.pushgateway.port": port}


def services(options: dict[str, str]) -> dict[str, str]:
    """Options of the table-services job on a table written with `options`."""
    return options | section("table_services", "services") | _lock()


def _lake_scheme() -> str:
    """LAKEHOUSE_ROOT's scheme, `file` for a local path or unset (jobs get their lake so: deploy.jobs.JOB_ENV)."""
    root = os.environ.get("LAKEHOUSE_ROOT", "")
    return root.split("://", 1)[0] if "://" in root else "file"


def _storage() -> dict[str, str]:
    """The options that follow where the lake is (storage.toml): a local disk's, none for an object store."""
    return section("storage", "local_disk") if _lake_scheme() == "file" else {}


def _lock() -> dict[str, str]:
    """The lock provider's options: the target's, or the local object store's (a file lock needs atomic creates)."""
    if target() == "local" and _lake_scheme() in ("s3", "s3a"):
        return section("table_services", "lock_local_object_store")
    return section("table_services", f"lock_{target()}")


def _as_option(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
