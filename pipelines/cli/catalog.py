"""`lakehouse catalog status|sync` and `lakehouse sql`: the lake's tables by name (pipelines/metastore/query.py).

`lakehouse dev catalog start|stop` (a local Hive Metastore) are the dev tools' (dev/lakehouse_dev/metastore.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from pipelines.cli.root import BadInput
from pipelines.errors import CatalogUnavailable
from pipelines.metastore import catalog_sync
from pipelines.runtime import console
from pipelines.runtime.commands import JSON_OPTION, echo_json, pass_lake
from pipelines.runtime.lake import Lake

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _require_catalog() -> str:
    """The catalog's kind, or an error saying how to get one (exit 2: there is none to ask); for HMS, one that
    answers (exit 1 when it does not)."""
    try:
        kind = catalog_sync.catalog_kind()
    except ValueError as exc:  # a LAKEHOUSE_METASTORE_URI that is no thrift:// URI
        raise BadInput(str(exc)) from exc
    if kind is None:
        raise BadInput(f"no catalog: set {catalog_sync.METASTORE_VARIABLE} to a Hive Metastore "
                       "(`make catalog-up` starts one and prints it), or run on the EMR target (Glue)")
    if kind == "hms":
        try:
            catalog_sync.require_metastore()
        except CatalogUnavailable as exc:
            raise click.ClickException(f"{exc}; `make catalog-up` starts the local one") from exc
    return kind


def _catalog_spark(lake: Lake) -> SparkSession:
    """The command's session, started with the catalog's options (Hive support, the metastore, Glue's factory)."""
    lake.spark_options.update(catalog_sync.catalog_session_conf())
    return lake.spark


@click.group("catalog")
def catalog() -> None:
    """The catalog the lake's tables are registered in by name (LAKEHOUSE_METASTORE_URI; Glue on EMR)."""


@catalog.command()
@JSON_OPTION
@pass_lake
def status(lake: Lake, as_json: bool) -> None:
    """Each lake table's newest commit against what the catalog last synced of it; exit 1 if any is behind
    or not registered (the writers sync after each commit and retry while the metastore is down)."""
    from pipelines.metastore.query import sync_states

    kind = _require_catalog()
    where = catalog_sync.metastore_uri() if kind == "hms" else "the Glue Data Catalog"
    states = [s for s in sync_states(_catalog_spark(lake), lake.root, lake.declaration)
              if s.newest is not None]
    lagging = [s.name for s in states if s.state != "in step"]
    if as_json:
        echo_json({"catalog": where, "in_step": not lagging, "behind": lagging, "tables": [
            {"table": s.table, "name": s.name, "state": s.state, "newest": s.newest, "synced": s.synced}
            for s in states]})
        if lagging:
            raise SystemExit(1)
        return
    width = max((len(s.name) for s in states), default=10)
    click.echo(f"catalog: {where}")
    for s in states:
        click.echo(f"{s.name:<{width}}  {s.state:<14}  newest commit {s.newest}  synced {s.synced or '-'}")
    if lagging:
        click.echo(f"catalog is behind on {len(lagging)} of {len(states)} tables: {', '.join(lagging)}")
        raise SystemExit(1)
    click.echo(f"catalog in step: {len(states)} tables")


@catalog.command()
@pass_lake
def sync(lake: Lake) -> None:
    """Register every lake table in the catalog now, or bring it up to date (a lake written before the
    catalog existed, a table behind); prints each table and how long its sync took."""
    import time

    from pipelines.lake.catalog import lake_tables
    from pipelines.lake.table_stats import has_completed_commit

    _require_catalog()
    spark = _catalog_spark(lake)
    for table in lake_tables(lake.root, lake.declaration):
        if not has_completed_commit(table.path):
            continue
        started = time.monotonic()
        try:
            catalog_sync.sync_now(spark, table.path, table.options)
        except Exception as exc:
            raise click.ClickException(f"sync of {table.name} failed: {console.first_line(exc)}{console.see_log()}") \
                from exc
        click.echo(f"{catalog_sync.catalog_name(table.name)}: synced in {time.monotonic() - started:.1f} s")


@click.command()
@click.argument("statement")
@click.option("--as-of", default=None, metavar="WHEN",
              help="Read every table of STATEMENT as it was then (Hudi time travel): an instant "
                   "(20261128183000123) or a time of the timeline's clock (2026-11-28 18:30:00[.123], or a date).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per row (JSON lines) instead of a table.")
@click.option("--limit", type=click.IntRange(min=1), default=1000, show_default=True,
              help="At most this many rows printed.")
@pass_lake
def sql(lake: Lake, statement: str, as_of: str | None, as_json: bool, limit: int) -> None:
    """Run Spark SQL on the lake's tables by name: bronze.<table> (and _rt, _ro), silver.<table>, gold.<table>.

    Example: lakehouse sql "SELECT country, ltv FROM gold.customer_ltv ORDER BY ltv DESC LIMIT 5"
    """
    from pipelines.errors import QueryError
    from pipelines.metastore.query import run_sql

    _require_catalog()
    spark = _catalog_spark(lake)
    try:
        rows = run_sql(spark, statement, as_of).limit(limit)
        if as_json:
            for line in rows.toJSON().toLocalIterator():
                click.echo(line)
            return
        frame = rows.toPandas()
    except QueryError:  # a statement the catalog cannot answer as asked: bad input, exit 2 (pipelines/cli/root.py)
        raise
    except Exception as exc:  # Spark's analysis and runtime errors: their first line names the problem
        raise click.ClickException(f"sql failed: {console.first_line(exc)}{console.see_log()}") from exc
    click.echo(frame.to_string(index=False) if len(frame) else "(no rows)")
    click.echo(f"({len(frame)} row{'s' if len(frame) != 1 else ''}{', as of ' + as_of if as_of else ''})", err=True)
