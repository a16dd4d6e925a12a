"""`lakehouse schema`: each bronze table's columns with the commit that introduced them, and the
acceptance of an incompatible source change (pipelines.ingest.schema). Read with hudi-rs: no Spark.

Each command works on one lake (`_lake`): the root group's, else one built from the environment once for the
command, which its TABLE argument and its body share."""

from __future__ import annotations

import json

import click

from pipelines.errors import UnknownTable
from pipelines.ingest.schema import COLUMNS_META, Shape, accept, held_column, read_accepted
from pipelines.lake import layout
from pipelines.lake.catalog import table_name
from pipelines.lake.declaration import Declaration
from pipelines.runtime.commands import JSON_OPTION, echo_json
from pipelines.runtime.lake import Lake

BATCH_ID_META = "_lakehouse.batch_id"  # as pipelines.ingest.bronze writes it (not imported: that pulls in Spark)


def _commits(path: str) -> list[tuple[str, dict[str, str]]]:
    """(instant, extra metadata) of the table's completed delta commits in the active timeline, oldest first."""
    from pipelines.lake.table_stats import open_table

    timeline = open_table(path).get_timeline()
    out = []
    for instant in timeline.get_completed_deltacommits():
        meta = json.loads(timeline.get_instant_metadata_in_json(instant))
        out.append((instant.timestamp, meta.get("extraMetadata") or {}))
    return out


def history(table: str, root: str, decl: Declaration) -> list[dict[str, str]]:
    """The columns of bronze/`table` (a table of `decl`) in the lake at `root`, oldest first: name, type, and where
    each came from (commit instant, batch, time)."""
    from pipelines.lake.table_stats import has_completed_commit

    path = layout.main_path(table, root)
    if not has_completed_commit(path):
        return []
    commits = _commits(path)
    recorded = next((m[COLUMNS_META] for _, m in reversed(commits) if COLUMNS_META in m), None)
    first_of_batch: dict[str, str] = {}
    for instant, meta in commits:
        first_of_batch.setdefault(meta.get(BATCH_ID_META, ""), instant)
    rows = []
    for column in Shape.from_meta(decl.table(table), recorded).columns.values():
        if column.batch is None:
            since = f"table creation ({commits[0][0] if commits else '?'})"
        else:
            instant = first_of_batch.get(str(column.batch), "archived")
            since = f"commit {instant} (batch {column.batch}, {column.at})"
        widened = "; ".join(f"widened from {old} in batch {batch} ({at})" for old, batch, at in column.widened)
        rows.append({"column": column.name, "type": column.type,
                     "typed by": "schema" if column.declared else "inference", "since": since, "widened": widened})
    return rows


@click.group()
def schema() -> None:
    """Bronze's columns as the source's tables change (contract section 6)."""


def _lake(ctx: click.Context) -> Lake:
    """The command's lake: the root group's (`lakehouse`), else one built from the environment now and kept on the
    root context, so that a command's TABLE argument and its body read one declaration."""
    lake = ctx.find_object(Lake)
    if lake is None:
        lake = Lake.from_environment(app="lakehouse-schema")
        if (root := ctx.find_root()).obj is None:
            root.obj = lake
    return lake


def _declared_table(ctx: click.Context, _parameter: click.Parameter, value: str | None) -> str | None:
    """TABLE: a declared table by its own name (`orders`) or by its bronze table's, in either spelling
    (`bronze/orders`, `bronze.orders`); its declared name."""
    decl = _lake(ctx).declaration
    if value is None or value in decl.names:
        return value
    try:
        layer, _, name = table_name(value, decl).partition("/")
    except UnknownTable:
        layer = name = ""
    if layer == "bronze" and name in decl.names:
        return name
    raise click.BadParameter(f"no declared table {value!r} (declared: {', '.join(decl.names)}; "
                             "or their bronze tables, bronze/<name> or bronze.<name>)")


@schema.command("show")
@click.argument("table", required=False, callback=_declared_table)
@JSON_OPTION
@click.pass_context
def show(ctx: click.Context, table: str | None, as_json: bool) -> None:
    """List each bronze table's columns with the commit that introduced each (and any widening)."""
    lake = _lake(ctx)
    decl = lake.declaration
    shown = {name: history(name, lake.root, decl) for name in ([table] if table else decl.names)}
    if as_json:
        echo_json({"tables": [{"table": f"bronze/{name}", "created": bool(rows), "columns": [
            {"column": r["column"], "type": r["type"], "typed_by": r["typed by"], "since": r["since"],
             "widened": r["widened"] or None} for r in rows]} for name, rows in shown.items()]})
        return
    for name, rows in shown.items():
        click.echo(f"bronze/{name}" + ("" if rows else "  (not created yet)"))
        for r in rows:
            extra = f"  {r['widened']}" if r["widened"] else ""
            click.echo(f"  {r['column']:<16}{r['type']:<9}{r['typed by']:<11}{r['since']}{extra}")


@schema.command("accept")
@click.argument("table", callback=_declared_table)
@click.argument("column")
@click.pass_context
def accept_change(ctx: click.Context, table: str, column: str) -> None:
    """Accept the incompatible change of TABLE.COLUMN (a narrowed type: bronze keeps the wider one; a
    declared column dropped or renamed: null from then on, silver quarantines what its rules reject).
    Then replay the held events: `lakehouse dead-letters replay --reason schema`."""
    lake = _lake(ctx)
    accepted = accept(lake.root, table, column, lake.declaration)
    click.echo(f"accepted: {', '.join(sorted(accepted))}")


def held_tables(reasons: list[tuple[str, str]], root: str) -> dict[str, tuple[int, str]]:
    """From (topic, reason) of the dead letters of the lake at `root`: per table held by a schema change not
    accepted there, (events, first reason)."""
    accepted = read_accepted(root)
    held: dict[str, tuple[int, str]] = {}
    for _, reason in reasons:
        found = held_column(reason or "")
        if found is None:
            continue
        table, columns = found
        if all(f"{table}.{c}" in accepted for c in columns):
            continue
        n, first = held.get(table, (0, reason.split(" (at ", 1)[0]))
        held[table] = (n + 1, first)
    return held
