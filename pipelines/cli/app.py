"""`lakehouse`: the one entry point for operators, Airflow tasks and acceptance checks.

The contract's commands (`ingest --once`, `etl`, `gdpr erase`) and the operator's others; every command exits
non-zero with a message naming the problem when it cannot do its job (pipelines/cli/root.py: the exit codes).
"""

from __future__ import annotations

import logging
import signal
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import click

from pipelines.cli.catalog import catalog, sql
from pipelines.cli.config import config
from pipelines.cli.doctor import doctor
from pipelines.cli.lake import dead_letters, show, status
from pipelines.cli.lineage import lineage
from pipelines.cli.root import EXIT_CODES, VERSION_OPTION, LakehouseGroup
from pipelines.deploy.connector_cli import connector
from pipelines.deploy.stream_local import stream
from pipelines.errors import RecordsLost, UnknownTable
from pipelines.gdpr.cli import gdpr
from pipelines.ingest.schema_cli import schema
from pipelines.lake.catalog import change_feed_tables, table_name
from pipelines.lake.declaration import Declaration
from pipelines.metastore import catalog_sync
from pipelines.reconcile.cli import reconcile
from pipelines.runtime import console, settings
from pipelines.runtime.commands import TABLE, command_lake, pass_lake
from pipelines.runtime.config import export, load_config
from pipelines.runtime.kafka_clients import at, described, require_kafka
from pipelines.runtime.lake import Lake
from pipelines.source.cli import source


@click.group(cls=LakehouseGroup, epilog=EXIT_CODES, context_settings={"help_option_names": ["-h", "--help"]})
@VERSION_OPTION
@click.option("-v", "--verbose", is_flag=True,
              help="The full log on the console (Spark, Hudi, libraries; debug for the pipeline), no log file.")
@click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The configuration file  [default: $LAKEHOUSE_CONFIG, else ./lakehouse.toml if there is one, "
                   "else the embedded local defaults]")
@click.option("--profile", default=None, help="The file's profile  [default: $LAKEHOUSE_PROFILE, else local]")
@click.pass_context
def main(ctx: click.Context, verbose: bool, config_file: Path | None, profile: str | None) -> None:
    """Lakehouse CDC pipeline: Debezium change events on Kafka into Apache Hudi tables (bronze, silver, gold).

    \b
    Configuration comes from one file, lakehouse.toml, with profiles (docs/configuration.md);
    an environment variable overrides a setting of the file, a flag overrides both. The main ones:
      [lake] root              LAKEHOUSE_ROOT           [default: lake/ in the checkout]
      [lake] tables            LAKEHOUSE_TABLES         [default: the shop's declaration]
      [kafka] bootstrap_servers KAFKA_BOOTSTRAP_SERVERS [default: 127.0.0.1:9092]
      [spark] target           LAKEHOUSE_TARGET         local or emr  [default: local]
      [catalog] metastore_uri  LAKEHOUSE_METASTORE_URI  [default: none]
    `lakehouse config show` prints every setting and where it came from.

    Each command prints what it did; Spark, Hudi and library logs go to a log file under
    LAKEHOUSE_LOG_DIR, named when Spark starts and when the command fails.
    """
    # The one lake of the command, its configuration and declaration read now: a wrong one stops the command
    # (exit 2) before it writes anything. Its Spark session starts when the command first needs one.
    loaded = load_config(config_file, profile)
    export(loaded)  # for the jobs it starts, and the code that still reads a variable
    ctx.obj = Lake.from_environment(app=f"lakehouse-{ctx.invoked_subcommand or 'lakehouse'}", loaded=loaded)
    console.setup(ctx.invoked_subcommand or "lakehouse", verbose)
    ctx.call_on_close(console.teardown)
    # Last commits' catalog syncs (LAKEHOUSE_METASTORE_URI) before the process ends: a no-op without any.
    ctx.call_on_close(catalog_sync.flush)
    logging.getLogger("kafka").setLevel(logging.WARNING)
    logging.getLogger("py4j").setLevel(logging.WARNING)


main.add_command(config)
main.add_command(doctor)
main.add_command(stream)
main.add_command(connector)
main.add_command(source)
main.add_command(reconcile)
main.add_command(schema)
main.add_command(gdpr)
main.add_command(catalog)
main.add_command(sql)
main.add_command(lineage)
main.add_command(status)
main.add_command(show)
main.add_command(dead_letters)
# Commands of other installed distributions (`lakehouse dev ...` from dev/pyproject.toml), found by
# entry point so that the product never imports them: a production install has the operator's only.
for entry in metadata.entry_points(group="lakehouse.commands"):
    try:
        main.add_command(entry.load(), entry.name)
    except ModuleNotFoundError:  # its metadata installed, its code not importable here (python -S)
        logging.getLogger(__name__).debug("commands %s not importable", entry.value)


@main.command()
@click.option("--once", is_flag=True,
              help="Consume what is on the topics at start, commit it to bronze, exit 0.")
@click.option("--trigger-seconds", type=click.FloatRange(min=0), default=settings.INGEST_TRIGGER_SECONDS,
              show_default=True,
              help="Micro-batch interval when running continuously.")
@click.option("--max-offsets-per-trigger", type=click.IntRange(min=1), default=None,
              help="Cap on Kafka records per micro-batch  [default: bronze.toml [kafka] maxOffsetsPerTrigger]")
@click.option("--bootstrap", default=None, help="Kafka brokers  [default: [kafka] bootstrap_servers]")
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=None,
              help="Port of the stream's Prometheus exporter on 127.0.0.1 (batches, commits, freshness, lag, dead "
                   "letters, heartbeat; scraped by `lakehouse dev metrics start`), 0 for none  "
                   "[default: stream.toml [metrics] port, 9464]")
@click.option("--spark-ui-port", type=click.IntRange(0, 65535), default=None,
              help="Port of the driver's Spark UI, which serves Spark's own metrics for Prometheus "
                   "(/metrics/prometheus), 0 for none  [default: stream.toml [metrics] spark_ui_port, 4040]")
@click.option("--accept-lost", is_flag=True,
              help="Where Kafka no longer holds records a table has not read (retention passed them, or the topic "
                   "was recreated), start the partition at its log start instead of stopping: the ranges are logged "
                   "and kept in <lake>/_source/lost.jsonl, and later starts start there too. Then `lakehouse "
                   "reconcile --table T --heal` re-delivers what they held.")
def ingest(once: bool, bootstrap: str | None, metrics_port: int | None, spark_ui_port: int | None,
           **stream: Any) -> None:
    """Stream the declared tables' topics (LAKEHOUSE_TABLES) into bronze (until stopped, or --once); a changed
    declaration is followed between batches."""
    from pipelines.ingest.bronze import IngestOptions, run_ingest
    from pipelines.ingest.exporter import configured_port, configured_spark_ui_port

    lake = command_lake()
    brokers = at(lake.config.kafka, bootstrap)
    require_kafka(brokers, click.ClickException)
    # SIGTERM (how schedulers and `kill` stop a job) ends the stream like Ctrl-C: the query is
    # stopped; a batch cut short is re-run on the next start, by design.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    started = time.monotonic()
    try:
        # `stream`: trigger_seconds, max_offsets_per_trigger, accept_lost, as IngestOptions names them.
        run_ingest(lake, once=once, bootstrap=bootstrap, options=IngestOptions(
            metrics_port=configured_port() if metrics_port is None else metrics_port,
            spark_ui_port=configured_spark_ui_port() if spark_ui_port is None else spark_ui_port, **stream))
    except KeyboardInterrupt:
        click.echo(f"ingest stopped after {time.monotonic() - started:.0f} s", err=True)
        return
    except RecordsLost as exc:  # every line: each range lost, its table, the way back (the trace to the log file)
        console.failure("ingest", exc)
        raise click.ClickException(f"ingest failed: {exc}{console.see_log()}") from exc
    except Exception as exc:  # the stream's failure, already logged by Spark: name it and exit 1
        raise click.ClickException(console.failure("ingest", exc)) from exc
    if once:
        click.echo(f"ingest: caught up with {described(brokers)} in {time.monotonic() - started:.1f} s")


@main.command()
@pass_lake
def etl(lake: Lake) -> None:
    """One incremental cycle: bronze changes -> silver (+ quarantine) -> gold, each since its checkpoint."""
    from pipelines.monitoring import job_metrics, metric_names
    from pipelines.monitoring.pushgateway import JobMetrics
    from pipelines.transform.etl import output_paths, run_etl

    run = JobMetrics(metric_names.ETL, lake.root)
    started = time.monotonic()
    outputs = output_paths(lake.root, lake.declaration)
    before = {name: job_metrics.commits(path) for name, path in outputs.items()}
    try:
        report = run_etl(lake)
    except Exception as exc:  # Spark/Hudi failures: name them and exit 1
        run.push(succeeded=False)
        raise click.ClickException(console.failure("etl", exc)) from exc
    job_metrics.etl(run, report, outputs, before)
    run.push()
    changed = [table for table, counts in report.items() if counts]
    click.echo(f"etl: {len(changed)} of {len(report)} tables changed in {time.monotonic() - started:.1f} s"
               + (f" ({', '.join(changed)})" if changed else ""))


def _table_services(tables: tuple[str, ...], decl: Declaration) -> tuple[list[str], dict[str, tuple[str, ...]]]:
    """`--table` values: the tables' lake names, and the services of those given with their own
    (`NAME:SERVICE,...`); a name as every command takes it (`silver/orders`, `silver.orders`)."""
    from pipelines.services.due import SERVICES

    names, own = [], {}
    for value in tables:
        given, colon, listed = value.partition(":")
        try:
            name = table_name(given, decl)
        except UnknownTable as exc:
            raise click.BadParameter(str(exc), param_hint="--table") from exc
        names.append(name)
        if colon:
            chosen = listed.split(",")
            if unknown := [s for s in chosen if s not in SERVICES]:
                raise click.BadParameter(f"{value!r}: {', '.join(map(repr, unknown))} not among "
                                         f"{', '.join(SERVICES)}", param_hint="--table")
            own[name] = tuple(s for s in SERVICES if s in chosen)
    return names, own


@main.command()
@click.option("--table", "tables", multiple=True, metavar="NAME[:SERVICE,...]",
              help="A table (bronze/orders, silver/_quarantine/customers, bronze.orders, ...), optionally with "
                   "its own services instead of --only's (bronze/orders:compact,clean,archive); repeatable  "
                   "[default: every table]")
@click.option("--only", type=click.Choice(["compact", "expire", "cluster", "clean", "archive"]), multiple=True,
              help="Run only these services, in the default's order; repeatable  "
                   "[default: compact, expire, cluster, clean, archive]")
@pass_lake
def services(lake: Lake, tables: tuple[str, ...], only: tuple[str, ...]) -> None:
    """Compaction (merge-on-read tables, when they have log files), expiry of consumed old days
    and clustering of small files (bronze's change logs), cleaning and archival.

    Safe beside running writers when they run with LAKEHOUSE_TABLE_SERVICES=external (see
    hudi_configs/table_services.toml). Prints one JSON line per table: what each service did.
    A table whose services fail does not stop the other tables'; the command then exits 1 naming it.
    """
    import json

    from pipelines.monitoring import job_metrics, metric_names
    from pipelines.monitoring.pushgateway import JobMetrics
    from pipelines.services.due import SERVICES
    from pipelines.services.table_services import ServicesPlan, run_services

    names, own = _table_services(tables, lake.declaration)
    run = JobMetrics(metric_names.SERVICES, lake.root)
    timings: dict[str, dict[str, float]] = {}
    try:
        plan = ServicesPlan(names or None, tuple(s for s in SERVICES if s in only) if only else SERVICES, own)
        report = run_services(lake, plan, keep_going=True, timings=timings)
    except (UnknownTable, ValueError) as exc:  # a table the lake does not have, a setting that cannot be used
        raise click.ClickException(str(exc)) from exc
    except Exception as exc:  # Spark/Hudi failures: name them and exit 1
        run.push(succeeded=False)
        raise click.ClickException(console.failure("services", exc)) from exc
    job_metrics.services(run, report, timings)
    run.push(succeeded=not any("failed" in done for done in report.values()))
    for table, done in report.items():
        click.echo(json.dumps({"table": table, **done}, default=str))
    if failed := [table for table, done in report.items() if "failed" in done]:
        raise click.ClickException(f"services failed on {len(failed)} of {len(report)} tables: "
                                   f"{', '.join(failed)}{console.see_log()}")


def _suite_name(value: str, decl: Declaration) -> str:
    """A suite as `--suite` names it, its tables in either spelling (`bronze.orders`, `gold.customer_ltv ->
    silver.customers`), as the suites are named (by the tables' lake names); a part that is no table as it is."""
    parts = []
    for part in value.split(" -> "):
        try:
            parts.append(table_name(part.strip(), decl))
        except UnknownTable:
            parts.append(part)
    return " -> ".join(parts)


@main.command()
@click.option("--layer", "layers", type=click.Choice(["bronze", "silver", "gold"]), multiple=True,
              help="Validate only this layer; repeatable  [default: all]")
@click.option("--suite", "suites", multiple=True, metavar="NAME",
              help="Validate only this suite, as the summary names it (bronze/orders, "
                   "\"gold/customer_ltv -> silver/customers\"); repeatable  [default: every suite of the layers]")
@click.option("--max-age-hours", type=click.FloatRange(min=0, min_open=True), default=24.0, show_default=True,
              help="Freshness: bronze's newest row must be younger than this.")
@pass_lake
def quality(lake: Lake, layers: tuple[str, ...], suites: tuple[str, ...], max_age_hours: float) -> None:
    """Great Expectations suites of the lake's tables; exit 1 naming every failed expectation.

    Data Docs (HTML) are written to $LAKEHOUSE_ROOT/_quality/data_docs/index.html. Each suite that
    passes records what it checked in $LAKEHOUSE_ROOT/_quality/checked/: the data_quality DAG checks
    again only the suites whose tables changed since.
    """
    from datetime import timedelta

    from pipelines.services.quality import LAYERS, data_docs_index, run_quality
    from pipelines.services.quality_due import quality_suites

    known = [spec.name for spec in quality_suites(lake.declaration)]
    suites = tuple(_suite_name(s, lake.declaration) for s in suites)
    if unknown := [s for s in suites if s not in known]:
        raise click.BadParameter(f"{', '.join(map(repr, unknown))}: the suites are {', '.join(known)}",
                                 param_hint="--suite")
    from pipelines.monitoring import job_metrics, metric_names
    from pipelines.monitoring.pushgateway import JobMetrics

    root = lake.root
    run = JobMetrics(metric_names.QUALITY, root)
    started = time.monotonic()
    try:
        outcomes = run_quality(lake, layers or LAYERS,
                               timedelta(hours=max_age_hours), suites)
    except Exception:
        run.push(succeeded=False)
        raise
    # A suite that fails is the job's finding, not its failure: the run succeeded.
    job_metrics.quality(run, outcomes)
    run.push()
    passed = sum(o.success for o in outcomes)
    click.echo(f"quality: {passed} of {len(outcomes)} suites passed in {time.monotonic() - started:.1f} s; "
               f"data docs: {data_docs_index(root)}")
    if failed := [o.suite for o in outcomes if not o.success]:
        raise click.ClickException(f"{len(failed)} of {len(outcomes)} quality suites failed: {', '.join(failed)}")


@main.command()
@click.argument("table", type=TABLE)
@click.option("--since", default=None, help="Checkpoint returned by the previous call  [default: from the start]")
@click.option("--checkpoint-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Read --since from this file if it exists, and store the new checkpoint in it after printing.")
@pass_lake
def changes(lake: Lake, table: str, since: str | None, checkpoint_file: Path | None) -> None:
    """Rows of TABLE (`<layer>/<name>`: bronze/orders, silver/customers, gold/customer_ltv, any declared table's;
    or its catalog name: silver.customers) changed since a checkpoint, one JSON object per line, deletions included.

    Each row has `_change`: "upsert" (the row as it is now) or "delete" (the key only). The new
    checkpoint goes to stderr as `checkpoint: ...` (and into --checkpoint-file). When the rows are
    the whole table instead (first read, or a checkpoint that was cleaned or archived), stderr
    also says `snapshot: ...`.
    """
    if table not in (feeds := change_feed_tables(lake.declaration)):
        raise click.BadParameter(f"{table!r} is not a table with a change feed (tables: {', '.join(feeds)})",
                                 param_hint="TABLE")
    from pipelines.transform.changes import read_changes

    if since is None and checkpoint_file is not None and checkpoint_file.exists():
        since = checkpoint_file.read_text().strip() or None
    change_set = read_changes(lake, table, since)
    for line in change_set.rows.toJSON().toLocalIterator():
        click.echo(line)
    if checkpoint_file is not None:
        checkpoint_file.write_text(change_set.checkpoint + "\n")
    if change_set.snapshot:
        click.echo("snapshot: these rows are the whole table (first read, or the checkpoint is no longer "
                   "readable): replace your copy rather than merging", err=True)
    click.echo(f"checkpoint: {change_set.checkpoint}", err=True)


@main.command()
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("dist/emr"),
              show_default=True, help="Folder to write the bundle into.")
@pass_lake
def package(lake: Lake, out: Path) -> None:
    """Build the EMR target's code bundle: lakehouse.zip (with the configuration of the chosen profile, from its
    file alone, and the declaration), cli.py, requirements.txt, bootstrap.sh, aws-msk-iam-auth.jar.

    Copy the folder to the s3:// prefix named by the Airflow Variable `lakehouse_code_uri`, and
    give the cluster `bootstrap.sh <that prefix>` as a bootstrap action.
    """
    from pipelines.deploy.package import build
    from pipelines.runtime.config import load_config

    # The file's values only: this machine's variables (a local LAKEHOUSE_ROOT) are not the cluster's.
    config = load_config(lake.loaded.path, lake.loaded.profile, environ={}).config
    click.echo(f"configuration: {lake.loaded.path or 'the defaults'}, profile {lake.loaded.profile}", err=True)
    for path in build(out, lake.declaration, config):
        click.echo(f"{path} ({path.stat().st_size:,} bytes)")

