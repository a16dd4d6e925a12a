"""What the `lakehouse` commands of every layer share, so that they speak one dialect: the `--json` flag and
its one document, the parameter type of a table's name, and the lake a command works on.

Here, below the layers, because each layer's commands sit beside its code (pipelines/cli gathers them).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

import click

from pipelines.errors import UnknownTable
from pipelines.runtime.lake import Lake

P = ParamSpec("P")
R = TypeVar("R")

JSON_OPTION = click.option("--json", "as_json", is_flag=True,
                           help="One JSON document on stdout instead of the text (messages stay on stderr).")


def echo_json(document: Any) -> None:
    """A read command's answer under `--json`: one JSON document, alone on stdout (values JSON lacks as text)."""
    click.echo(json.dumps(document, default=str))


class TableName(click.ParamType):
    """A lake table as a command's argument: `silver/orders` or `silver.orders` (pipelines.lake.catalog.table_name),
    converted to its lake name; an unknown one is a usage error (exit 2) naming the value and the tables."""

    name = "table"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from pipelines.lake.catalog import table_name

        try:
            return table_name(str(value), command_lake(ctx).declaration)
        except UnknownTable as exc:
            self.fail(str(exc), param, ctx)


TABLE = TableName()


def command_lake(ctx: click.Context | None = None) -> Lake:
    """The lake of the running command: the one the root group built for it (`lakehouse`), else (a command
    invoked on its own, as tests and `python -m` do) one built now from the environment and kept on the context,
    so that every part of one command sees the same lake."""
    ctx = ctx or click.get_current_context(silent=True)
    if ctx is None:
        return Lake.from_environment()
    lake = ctx.find_object(Lake)
    if lake is None:
        lake = Lake.from_environment(app=f"lakehouse-{ctx.info_name or 'command'}")
        if (root := ctx.find_root()).obj is None:
            root.obj = lake
    return lake


def pass_lake(command: Callable[Concatenate[Lake, P], R]) -> Callable[P, R]:
    """A command's callback with the command's lake (`command_lake`) as its first argument."""
    @functools.wraps(command)
    def with_lake(*args: P.args, **kwargs: P.kwargs) -> R:
        return command(command_lake(), *args, **kwargs)
    return with_lake
