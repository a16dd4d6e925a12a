"""`lakehouse.zip`: the project's code as a cluster's Python imports it.

EMR's steps get it with `--py-files` (pipelines/deploy/package.py, `lakehouse package`); a job on
a local standalone cluster sends it to its executors (pipelines/runtime/spark.py, `ship_code`). Pure Python.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from pipelines.lake.declaration import BUNDLED, SHOP, Declaration
from pipelines.runtime.config import BUNDLED_FILE
from pipelines.runtime.settings import PROJECT_ROOT

PACKAGES = ("pipelines", "hudi_configs")


def write_archive(archive: Path, decl: Declaration, config: str | None = None) -> Path:
    """The packages the jobs import, TOML files included (read through importlib.resources, which
    reads them inside the zip); the job's declaration of tables (`decl`, checked whole when it was read)
    as `pipelines/lake/tables.toml`, which jobs on a cluster read; and the configuration `config` (a file's text,
    pipelines.runtime.config.config_text), which they read when given no file."""
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for package in PACKAGES:
            for path in sorted((PROJECT_ROOT / package).rglob("*")):
                name = path.relative_to(PROJECT_ROOT).as_posix()
                if path.is_file() and path.suffix in (".py", ".toml", ".properties"):
                    zf.write(path, name)
        zf.writestr(f"pipelines/lake/{BUNDLED}", Path(decl.path).read_text() if Path(decl.path).is_file()
                    else (PROJECT_ROOT / "pipelines" / "lake" / SHOP).read_text())
        if config is not None:
            zf.writestr(f"pipelines/runtime/{BUNDLED_FILE}", config)
    return archive
