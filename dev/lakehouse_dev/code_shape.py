"""Functions a reader can hold: report every function longer than 60 lines or wider than 6 parameters.

`make lint` runs it on the product package (`python -m lakehouse_dev.code_shape pipelines`) so that a
long function or a long parameter list fails the build where it is written, not in a later review.
A function's length runs from its `def` line to its last line: decorators are not counted, its
docstring is. Its width is the number of parameters a caller can pass: `self` and `cls` are not
counted, `*args` and `**kwargs` count as one each, keyword-only parameters count like the others.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

MAX_LINES = 60
MAX_PARAMETERS = 6

# The receiver of a method is passed by Python, not by the caller.
_RECEIVERS = ("self", "cls")


@dataclass(frozen=True)
class Shape:
    """One function's size: where it is, how many lines it spans and how many parameters it takes."""

    path: str
    line: int
    name: str
    lines: int
    parameters: int

    @property
    def too_long(self) -> bool:
        return self.lines > MAX_LINES

    @property
    def too_wide(self) -> bool:
        return self.parameters > MAX_PARAMETERS

    def describe(self) -> str:
        """The line a reader sees: `path:line name: N lines, M parameters`, with what is over the limit."""
        over = [f"{self.lines} lines > {MAX_LINES}"] if self.too_long else []
        over += [f"{self.parameters} parameters > {MAX_PARAMETERS}"] if self.too_wide else []
        return f"{self.path}:{self.line} {self.name}: {', '.join(over)}"


def parameter_count(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The parameters a caller can pass, the receiver of a method left out."""
    arguments = function.args
    positional = [*arguments.posonlyargs, *arguments.args]
    if positional and positional[0].arg in _RECEIVERS:
        positional = positional[1:]
    variadic = [a for a in (arguments.vararg, arguments.kwarg) if a is not None]
    return len(positional) + len(arguments.kwonlyargs) + len(variadic)


def _functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function and method in `tree`, named by its enclosing classes and functions (`Class.method`)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            name = f"{prefix}{node.name}"
            yield name, node
            yield from _functions(node, f"{name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


def file_shapes(path: Path) -> list[Shape]:
    """The shape of every function in one source file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [
        Shape(str(path), node.lineno, name, (node.end_lineno or node.lineno) - node.lineno + 1, parameter_count(node))
        for name, node in _functions(tree)
    ]


def source_files(roots: Sequence[Path]) -> list[Path]:
    """The .py files under each root (a root may be a file itself), in a stable order."""
    files: list[Path] = []
    for root in roots:
        files.extend([root] if root.is_file() else sorted(root.rglob("*.py")))
    return files


def offenders(roots: Sequence[Path]) -> list[Shape]:
    """The functions under `roots` over either limit."""
    return [s for path in source_files(roots) for s in file_shapes(path) if s.too_long or s.too_wide]


def main(argv: Sequence[str] | None = None) -> int:
    """Report the offenders under the given paths; exit status 1 when there is any, 0 otherwise."""
    parser = argparse.ArgumentParser(
        prog="python -m lakehouse_dev.code_shape",
        description=f"Report functions over {MAX_LINES} lines (def line to last line, decorators excluded) "
        f"or over {MAX_PARAMETERS} parameters (self/cls excluded). Exit status 1 when there is any.",
    )
    parser.add_argument("paths", nargs="+", type=Path, help="source files or directories to check")
    parser.add_argument("--json", action="store_true", help="print the offenders as a JSON list")
    args = parser.parse_args(argv)
    found = offenders(args.paths)
    if args.json:
        print(json.dumps([asdict(s) for s in found], indent=2))
    else:
        for shape in found:
            print(shape.describe())
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
