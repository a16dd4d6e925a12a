"""The product's packages import only from the layers below them (docs/architecture.md, "Layers"), and never
the dev tools: read from the source with `ast`, every import, at the top of a module or inside a function."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pipelines

pytestmark = pytest.mark.unit

# Lowest first; a package may import those of a lower rank (and `pipelines.errors`, which every layer raises).
RANKS = {"lake": 0, "runtime": 1, "metastore": 2, "monitoring": 2, "source": 3, "ingest": 3, "transform": 4,
         "services": 5, "deploy": 5, "gdpr": 6, "reconcile": 6, "cli": 7}
PACKAGE = Path(pipelines.__file__).parent


def _imports(path: Path) -> list[str]:
    """Every module `path` imports, absolute."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found += [f"{node.module}.{a.name}" for a in node.names] if node.module == "pipelines" else [node.module]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names]
    return found


def test_every_import_goes_down_the_layers_and_none_reaches_the_dev_tools() -> None:
    upward, dev = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).parts
        if len(parts) < 2:
            continue
        layer = parts[0]
        assert layer in RANKS, f"{layer}/ is a package of no layer: give it a rank here and in docs/architecture.md"
        for module in _imports(path):
            if module.startswith("lakehouse_dev"):
                dev.append(f"{path.relative_to(PACKAGE)} imports {module}")
            names = module.split(".")
            if names[0] != "pipelines" or len(names) < 2 or names[1] in ("errors", layer):
                continue
            if RANKS[names[1]] >= RANKS[layer]:
                upward.append(f"{path.relative_to(PACKAGE)} ({layer}) imports {module}")
    assert not upward, "imports that do not go down the layers:\n" + "\n".join(upward)
    assert not dev, "the product imports the dev tools:\n" + "\n".join(dev)
