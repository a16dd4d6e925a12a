"""What the `lakehouse` commands of every layer share, so that they speak one dialect: the `--json` flag and
its one document, and the parameter type of a table's name.

Here, below the layers, because each layer's commands sit beside its code (pipelines/cli gathers them).
"""

from __future__ import annotations

import json
from typing import Any

import click

from pipelines.errors import UnknownTable

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
            return table_name(str(value))
        except UnknownTable as exc:
            self.fail(str(exc), param, ctx)


TABLE = TableName()
