"""Every Spark and Hudi option of the project, in TOML files beside this module.

Options live here, not in the code, so that an operator can read and tune one
place, and so that the EMR target ships the same files as the local one.
"""

from __future__ import annotations

import tomllib
from functools import cache
from pathlib import Path

_DIR = Path(__file__).resolve().parent


@cache
def _load(name: str) -> dict:
    path = _DIR / f"{name}.toml"
    if not path.is_file():
        raise FileNotFoundError(f"no config {name!r}: expected {path}")
    with path.open("rb") as fh:
        return tomllib.load(fh)


def section(name: str, part: str) -> dict[str, str]:
    """Options of `[part]` in `<name>.toml`, as the strings Spark and Hudi expect."""
    doc = _load(name)
    if part not in doc:
        raise KeyError(f"{name}.toml has no [{part}] section (has: {', '.join(doc)})")
    return {k: _as_option(v) for k, v in doc[part].items()}


def _as_option(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
