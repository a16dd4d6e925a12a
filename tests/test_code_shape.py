"""Functions a reader can hold: the checker `make lint` runs (dev/lakehouse_dev/code_shape.py) finds a function
over 60 lines and one over 6 parameters, counts what the limits say, and finds none in the product package."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lakehouse_dev.code_shape import MAX_LINES, MAX_PARAMETERS, file_shapes, main, offenders

pytestmark = pytest.mark.unit

REPOSITORY = Path(__file__).resolve().parent.parent


def _synthetic(tmp_path: Path) -> Path:
    """A module with one function too long, one too wide, and methods and decorators at the limits."""
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES - 2))
    at_limit = "\n".join(f"        y{i} = {i}" for i in range(MAX_LINES - 3))
    source = f'''
def long_one():
    """Docstring counts."""
{body}
    return x0


def wide_one(a, b, c, d, e, *args, f, **kwargs):
    return a


class Holder:
    @staticmethod
    @property
    def at_the_limits(a, b, c, d, e, f):
        """Six parameters, sixty lines: the decorators above are not counted."""
{at_limit}
        return a

    def method(self, a, b, c, d, e, f):
        return a

    @classmethod
    def build(cls, a, b, c, d, e, f):
        def inner(p, q, r, s, t, u, v):
            return p
        return inner
'''
    path = tmp_path / "shapes.py"
    path.write_text(source)
    return path


def test_a_long_and_a_wide_function_are_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _synthetic(tmp_path)
    shapes = {s.name: s for s in file_shapes(path)}
    assert shapes["long_one"].lines == MAX_LINES + 1 and shapes["long_one"].parameters == 0
    assert shapes["wide_one"].parameters == MAX_PARAMETERS + 2
    assert shapes["Holder.at_the_limits"].lines == MAX_LINES
    assert shapes["Holder.at_the_limits"].parameters == MAX_PARAMETERS
    assert shapes["Holder.method"].parameters == MAX_PARAMETERS
    assert shapes["Holder.build"].parameters == MAX_PARAMETERS
    assert shapes["Holder.build.inner"].parameters == MAX_PARAMETERS + 1

    assert [s.name for s in offenders([path])] == ["long_one", "wide_one", "Holder.build.inner"]
    assert main([str(tmp_path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{path}:2 long_one: {MAX_LINES + 1} lines > {MAX_LINES}"
    assert lines[1].endswith(f"wide_one: {MAX_PARAMETERS + 2} parameters > {MAX_PARAMETERS}")

    assert main(["--json", str(path)]) == 1
    reported = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in reported] == ["long_one", "wide_one", "Holder.build.inner"]
    assert reported[0] == {"path": str(path), "line": 2, "name": "long_one", "lines": MAX_LINES + 1, "parameters": 0}


def test_a_clean_file_exits_zero(tmp_path: Path) -> None:
    path = tmp_path / "clean.py"
    path.write_text("def short(a, b):\n    return a + b\n")
    assert main([str(path)]) == 0


def test_the_product_package_has_no_long_or_wide_function(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(REPOSITORY / "pipelines")]) == 0, capsys.readouterr().out
