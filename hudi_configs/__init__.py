"""Every Spark and Hudi option of the project, in TOML files beside this module.

Options live here, not in the code, so that an operator can read and tune one
place, and so that the EMR target ships the same files as the local one.

`LAKEHOUSE_HUDI_OVERRIDES` may name a further TOML file whose tables `[<name>.<part>]`
are merged over `[<part>]` of `<name>.toml`: tuning a deployment (or a test's file
sizes) without editing the project's files.
"""

from __future__ import annotations

import os
import tomllib
from functools import cache
from pathlib import Path

_DIR = Path(__file__).resolve().parent


@cache
def _read(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"no config file {path}")
    with path.open("rb") as fh:
        return tomllib.load(fh)


def _load(name: str) -> dict:
    return _read(_DIR / f"{name}.toml")


def section(name: str, part: str) -> dict[str, str]:
    """Options of `[part]` in `<name>.toml`, as the strings Spark and Hudi expect."""
    doc = _load(name)
    if part not in doc:
        raise KeyError(f"{name}.toml has no [{part}] section (has: {', '.join(doc)})")
    options = dict(doc[part])
    if overrides := os.environ.get("LAKEHOUSE_HUDI_OVERRIDES"):
        options |= _read(Path(overrides)).get(name, {}).get(part, {})
    return {k: _as_option(v) for k, v in options.items()}


def _as_option(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
