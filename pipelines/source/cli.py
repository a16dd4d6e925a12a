"""`lakehouse source check|sync`: the configured source database and Kafka Connect (`[source]`, `[connect]`) against
the declaration, and brought in line with it (pipelines.source.check and pipelines.source.sync say what each
does)."""

from __future__ import annotations

import click

from pipelines.runtime.commands import JSON_OPTION, echo_json, pass_lake
from pipelines.runtime.lake import Lake


@click.group("source")
def source() -> None:
    """The source database and its Debezium connector, as lakehouse.toml's [source] and [connect] name them."""


def declared_names(lake: Lake, given: tuple[str, ...]) -> tuple[str, ...]:
    """`--table` values as declared names: a table's lake name or its `schema.table`; unknown ones are bad input."""
    by_source = {t.source: name for name, t in lake.declaration.tables.items()}
    out = []
    for value in given:
        name = value if value in lake.declaration.tables else by_source.get(value)
        if name is None:
            raise click.BadParameter(f"{value!r} is not declared in {lake.declaration.path} (its tables: "
                                     f"{', '.join(lake.declaration.tables)})", param_hint="--table")
        out.append(name)
    return tuple(out)


@source.command("check")
@click.option("--table", "tables", multiple=True, metavar="NAME",
              help="Only this declared table's findings besides the source-wide ones (its name or schema.table); "
                   "repeatable  [default: every declared table]")
@JSON_OPTION
@pass_lake
def check(lake: Lake, tables: tuple[str, ...], as_json: bool) -> None:
    """Every reason a declared table's changes would not reach its topic, one line each with how to fix it: the
    server's wal_level and max_slot_wal_keep_size, the publication, the replication slot, each table's primary
    key, replica identity and columns, the connector's config and state. Exit 1 when an error is found
    (warnings alone: 0); --json prints the findings as a list (table, check, problem, fix, severity, fixable).
    A check of every table pushes its counts per check to [metrics] pushgateway (`lakehouse_source_findings`,
    which the alert LakehouseSourceCannotCapture watches)."""
    from pipelines.monitoring import metric_names
    from pipelines.monitoring.pushgateway import JobMetrics
    from pipelines.source.check import Target, counts, errors, run_check

    # Only a check of every declared table is the source's state: a --table check pushes nothing, so that it
    # cannot clear an alert on another table's finding.
    run = None if tables else JobMetrics(metric_names.SOURCE_CHECK, lake.root)
    try:
        target = Target.of(lake.config)
        found = run_check(target, lake.declaration, declared_names(lake, tables), root=lake.root)
    except Exception:
        if run is not None:
            run.push(succeeded=False)
        raise
    if run is not None:
        gauge = run.gauge(metric_names.SOURCE_FINDINGS)
        for (name, severity), n in counts(found).items():
            gauge.labels(name, severity).set(n)
        run.push()
    if as_json:
        echo_json([f.document() for f in found])
    else:
        for finding in found:
            click.echo(finding.line())
        click.echo(f"source check: {len(errors(found))} errors, {len(found) - len(errors(found))} warnings "
                   f"({target.source.host}:{target.source.port}/{target.source.database}, "
                   f"connector {target.connect.connector} at {target.connect.url})", err=True)
    if errors(found):
        raise SystemExit(1)


@source.command("sync")
@click.option("--timeout", default=120.0, show_default=True,
              help="Seconds to wait for the connector's task to stream again after its config changed.")
@JSON_OPTION
@pass_lake
def sync(lake: Lake, timeout: float, as_json: bool) -> None:
    """Make the source capture exactly the declared tables: checks first and changes nothing while the declaration
    does not match the database (or an error remains that only the operator can fix); then the signal table,
    REPLICA IDENTITY DEFAULT, the connector's table.include.list (its task restarts from its offsets: nothing is
    lost), the publication (tables added, and dropped only when the connector captured them and the declaration
    no longer has them), an incremental snapshot of each newly captured table; then checks again."""
    from pipelines.source.check import Target
    from pipelines.source.sync import SyncOptions
    from pipelines.source.sync import sync as run_sync

    report = run_sync(Target.of(lake.config), lake.declaration, SyncOptions(timeout=timeout))
    if as_json:
        echo_json(report.document())
        return
    for line in report.lines():
        click.echo(line)
