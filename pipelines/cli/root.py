"""The root group's own parts: the exit codes every command keeps, the one place a lake error becomes one, and
`--version`.

A command raises the lake's errors (pipelines.errors) as they come and leaves them to `LakehouseGroup`, which
prints the message on stderr and exits 2 for bad input, 1 for anything else; so a command says what went wrong
in the error it raises, and its exit code means the same as every other command's.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

import click

from pipelines.errors import DeclarationError, ErasureError, LakehouseError, QueryError, SettingError, UnknownTable

DISTRIBUTION = "lakehouse-cdc"

# The input a command was given, not the state of the lake, is wrong: the same as click's usage errors.
BAD_INPUT: tuple[type[LakehouseError], ...] = (DeclarationError, SettingError, UnknownTable, ErasureError, QueryError)

EXIT_CODES = """\b
Exit codes, the same in every command:
  0  done, or healthy
  1  what was checked is not as it should be (the stream not healthy, a quality suite failed,
     the catalog behind, a connector task FAILED), or the command's job failed; the message
     on stderr names the problem
  2  bad usage or bad input: an unknown option, a bad declaration or setting, an unknown table
     name, an invalid erasure request or SQL statement
"""


class BadInput(click.ClickException):
    """A command's input cannot be used (exit 2), said without click's usage line: the value is named in it."""

    exit_code = 2


class LakehouseGroup(click.Group):
    """The root group: a `LakehouseError` from any command, or from the group's own start, becomes its message on
    stderr and the exit code of its kind (BAD_INPUT: 2, else 1) instead of a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BAD_INPUT as exc:
            raise BadInput(str(exc)) from exc
        except LakehouseError as exc:
            raise click.ClickException(str(exc)) from exc


def installed_version() -> str:
    """The installed distribution's version; the EMR bundle's code (a zip on the path) is not installed as one."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "not installed (code from a bundle or a checkout on the path)"


def _print_version(ctx: click.Context, _: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(f"{DISTRIBUTION} {installed_version()}")
        ctx.exit()


VERSION_OPTION = click.option("--version", is_flag=True, expose_value=False, is_eager=True, callback=_print_version,
                              help=f"Print the installed version of {DISTRIBUTION} and exit.")
