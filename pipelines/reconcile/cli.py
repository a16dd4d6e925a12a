"""`lakehouse reconcile`: each declared table's bronze rows against the source database, or its silver and quarantine
against bronze and the declared rules (pipelines.reconcile)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from pipelines.runtime.commands import JSON_OPTION, echo_json, pass_lake
from pipelines.runtime.lake import Lake
from pipelines.source.cli import declared_names

if TYPE_CHECKING:
    from pipelines.monitoring.pushgateway import JobMetrics
    from pipelines.reconcile.compare import Options, TableReport


@click.command("reconcile")
@click.option("--table", "tables", multiple=True, metavar="NAME",
              help="A declared table to reconcile (its name or schema.table); repeatable  [default: every declared "
                   "table]")
@click.option("--settle", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="Seconds between two looks at a row that differs: a running stream is behind the source by up "
                   "to a table's freshness target, so a difference seen once may be a change on its way.")
@click.option("--rounds", type=click.IntRange(min=0), default=3, show_default=True,
              help="How many times a differing row is looked at again; 0: what differs at the first look is drift "
                   "(a lake no stream writes).")
@click.option("--limit", type=click.IntRange(min=0), default=20, show_default=True,
              help="Keys of each kind listed per table (the counts are whole).")
@click.option("--heal", is_flag=True,
              help="Re-deliver what drifted through the pipeline (an incremental snapshot of the keys the lake lacks "
                   "or holds otherwise, a delete event for the keys only the lake holds), then reconcile again until "
                   "the lake matches; needs the stream running. Exit 0 once every table matches.")
@click.option("--heal-timeout", type=click.FloatRange(min=0), default=900.0, show_default=True,
              help="Seconds to wait, with --heal, for the healed tables to match the source.")
@click.option("--layer", type=click.Choice(["bronze", "silver"]), default="bronze", show_default=True,
              help="bronze: bronze against the source database. silver: silver/<table> and its quarantine against "
                   "what the declared rules make of bronze's live rows, as of the version of bronze each consumed "
                   "last (a silver merely behind bronze is not drift); reads the lake only, no database, and "
                   "takes neither --settle, --rounds nor --heal.")
@JSON_OPTION
@pass_lake
def reconcile(lake: Lake, tables: tuple[str, ...], heal: bool, heal_timeout: float, as_json: bool,
              **looks: Any) -> None:
    """Compare bronze with the source database ([source] of lakehouse.toml), table by table, without moving every
    row: per table, the rows on each side, the keys the lake lacks, the keys it holds that the source does not,
    and the keys whose values differ (with the columns). With --layer silver, compare each table's silver and
    quarantine with what the ETL should have made of bronze, the same way. Exit 1 when any table drifted (with
    --heal: when any still drifts after healing). --json: a list of the tables' reports; with --heal, an object
    with the first reports (`found`), what was asked of the source and the topics (`heal`) and the reports after
    (`after`)."""
    from pipelines.monitoring import metric_names
    from pipelines.monitoring.pushgateway import JobMetrics
    from pipelines.reconcile.compare import Options, reconcile_table
    from pipelines.source.postgres import connect

    tables = declared_names(lake, tables)
    run = JobMetrics(metric_names.RECONCILE, lake.root)
    options = Options(settle=looks["settle"], rounds=int(looks["rounds"]), listed=int(looks["limit"]))
    if looks["layer"] == "silver":
        if heal:
            raise click.UsageError("--heal re-delivers rows through the source and the stream: it heals bronze "
                                   "(--layer bronze); silver follows bronze through `lakehouse etl`")
        _silver(lake, tables or lake.declaration.names, options.listed, run, as_json)
        return
    reports: list[TableReport] = []
    try:
        with connect(lake.config.source) as conn:
            for name in tables or lake.declaration.names:
                click.echo(f"reconciling {name} ...", err=True)
                reports.append(reconcile_table(lake, conn, name, options))
                _record(run, reports[-1])
                if not as_json:
                    click.echo(_lines(reports[-1]))
            healed = _heal(lake, conn, reports, options, heal_timeout, as_json) if heal else None
    except Exception:
        run.push(succeeded=False)
        raise
    run.push()
    if as_json:
        echo_json([r.document() for r in reports] if healed is None else
                  {"found": [r.document() for r in reports], **healed})
    still = any(r.drift for r in reports) if healed is None else any(r["drift"] for r in healed["after"])
    if still:
        raise SystemExit(1)


def _silver(lake: Lake, tables: tuple[str, ...], listed: int, run: JobMetrics, as_json: bool) -> None:
    """`--layer silver`: each table's silver and quarantine reports, printed as they come; exit 1 on drift."""
    from pipelines.reconcile.silver import reconcile_silver

    reports: list[TableReport] = []
    try:
        for name in tables:
            click.echo(f"reconciling silver/{name} ...", err=True)
            for report in reconcile_silver(lake, name, listed):
                reports.append(report)
                _record(run, report)
                if not as_json:
                    click.echo(_lines(report))
    except Exception:
        run.push(succeeded=False)
        raise
    run.push()
    if as_json:
        echo_json([r.document() for r in reports])
    if any(r.drift for r in reports):
        raise SystemExit(1)


def _heal(lake: Lake, conn: object, reports: list[TableReport], options: Options, timeout: float,
          as_json: bool) -> dict[str, list[dict[str, Any]]]:
    """Heal the drifted tables of `reports` and wait for them to match: what was asked and the reports after."""
    from pipelines.reconcile.heal import heal_table, wait_healed

    actions = [heal_table(lake, conn, r) for r in reports if r.drift]
    for action in actions:
        click.echo(f"healing {action.table}: snapshot {action.snapshot or 'none'} ({action.snapshot_keys} keys, "
                   f"{len(action.signal_ids)} signals), {action.deletes} delete events"
                   + (f", {action.inserted_meanwhile} keys inserted at the source meanwhile left alone"
                      if action.inserted_meanwhile else ""), err=True)
    after = wait_healed(lake, conn, actions, options, timeout) if actions else []
    for action, report in zip(actions, after, strict=True):
        if not as_json:
            click.echo(("healed: " if action.healed else "NOT healed: ") + _lines(report))
    return {"heal": [a.document() for a in actions], "after": [r.document() for r in after]}


def _record(run: JobMetrics, report: TableReport) -> None:
    """The table's figures as the run's metrics (pushed at its end, with LAKEHOUSE_PUSHGATEWAY); a silver or
    quarantine report's table label is `silver/<table>` or `silver_quarantine/<table>`, its sides the expected
    (`source`) and the table (`lake`)."""
    from pipelines.monitoring import metric_names

    table = report.table if report.layer == "bronze" else f"{report.layer}/{report.table}"
    rows = run.gauge(metric_names.RECONCILE_ROWS)
    rows.labels(table, "source").set(report.source_rows)
    rows.labels(table, "lake").set(report.lake_rows)
    for kind in ("missing", "extra", "differ"):
        run.gauge(metric_names.RECONCILE_DRIFT).labels(table, kind).set(report.counts.get(kind, 0))


def _lines(report: TableReport) -> str:
    """A table's result as a person reads it."""
    if report.layer != "bronze":
        return _derived_lines(report)
    counts = report.counts
    state = "DRIFT" if report.drift else "ok"
    lines = [f"{report.table} ({report.source}): {state}: source {report.source_rows} rows, lake {report.lake_rows}; "
             f"missing from the lake {counts.get('missing', 0)}, only in the lake {counts.get('extra', 0)}, "
             f"values differ {counts.get('differ', 0)}, still changing {counts.get('unsettled', 0)} "
             f"({report.buckets_differing} of {report.buckets} buckets differed; rows read: source "
             f"{report.rows_read.get('source', 0)}, lake {report.rows_read.get('lake', 0)}; {report.seconds:.1f} s)"]
    lines += [f"  missing: {k}" for k in report.missing]
    lines += [f"  only in the lake: {k}" for k in report.extra]
    lines += [f"  differs: {d['key']}: " + ", ".join(f"{c} source {v['source']!r} lake {v['lake']!r}"
                                                    for c, v in d["columns"].items()) for d in report.differ]
    lines += [f"  still changing: {k}" for k in report.unsettled]
    if report.erased_left_out:
        lines.append(f"  {report.erased_left_out} source rows of erased customers left out (the lake erased them)")
    if report.source_only:
        lines.append(f"  columns bronze does not hold yet (not compared): {', '.join(report.source_only)}")
    if report.not_compared:
        lines.append(f"  columns of a type reconcile does not compare: {', '.join(report.not_compared)}")
    return "\n".join(lines)


def _derived_lines(report: TableReport) -> str:
    """A silver or quarantine report as a person reads it: `_lines`'s shape, its sides the expectation and the
    table."""
    counts, held = report.counts, "silver" if report.layer == "silver" else "the quarantine"
    state = "DRIFT" if report.drift else "ok"
    bronze = f"{report.source} as of {report.as_of}" if report.as_of else \
        f"{report.source}'s newest version (the one it consumed is unknown or cleaned: being behind shows as drift)"
    lines = [f"{report.layer}/{report.table} (against {bronze} and the declared rules): {state}: expected "
             f"{report.source_rows} rows, {held} {report.lake_rows}; missing from {held} {counts.get('missing', 0)}, "
             f"only in {held} {counts.get('extra', 0)}, values differ {counts.get('differ', 0)} "
             f"({report.seconds:.1f} s)"]
    lines += [f"  missing: {k}" for k in report.missing]
    lines += [f"  only in {held}: {k}" for k in report.extra]
    lines += [f"  differs: {d['key']}: " + ", ".join(f"{c} expected {v['source']!r} {held} {v['lake']!r}"
                                                    for c, v in d["columns"].items()) for d in report.differ]
    if report.source_only:
        lines.append(f"  columns the rules give that {held} does not hold (not compared): "
                     f"{', '.join(report.source_only)}")
    if report.not_compared:
        lines.append(f"  columns not compared: {', '.join(report.not_compared)}")
    return "\n".join(lines)
