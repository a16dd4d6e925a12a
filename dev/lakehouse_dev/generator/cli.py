"""`lakehouse dev generate`: play the source onto Kafka (or as SQL on the real source), continuing a saved state."""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path

import click
from kafka.errors import KafkaError

from lakehouse_dev.generator.kafka import KafkaUnavailableError, ensure_topics, produce
from lakehouse_dev.generator.source import STAT_KEYS, ShopSource
from lakehouse_dev.generator.values import Message, WorkloadConfig
from lakehouse_dev.sql_sink import play
from pipelines.runtime import settings
from pipelines.runtime.commands import command_lake
from pipelines.runtime.config import KafkaSettings
from pipelines.runtime.kafka_clients import at


def summary_of(stats: Counter[str]) -> str:
    """The run's counts in STAT_KEYS order, the zeros left out: one line a person can compare between runs."""
    return " ".join(f"{key}={stats[key]}" for key in STAT_KEYS if stats[key])


DEFAULTS = WorkloadConfig()


@click.command("generate")
@click.option("--seed", type=int, default=DEFAULTS.seed, show_default=True,
              help="Seed of a new simulation (ignored when the state file exists: that one continues).")
@click.option("--customers", type=click.IntRange(min=0), default=DEFAULTS.customers, show_default=True,
              help="Customers in the initial snapshot.")
@click.option("--orders", type=click.IntRange(min=0), default=DEFAULTS.orders, show_default=True,
              help="Orders in the initial snapshot.")
@click.option("--changes", type=click.IntRange(min=0), default=DEFAULTS.changes, show_default=True,
              help="Inserts, updates and deletes after the snapshot.")
@click.option("--malformed-fraction", type=click.FloatRange(0, 1), default=DEFAULTS.malformed_fraction,
              show_default=True, help="Share of changes followed by a malformed record.")
@click.option("--replays", type=click.IntRange(min=0), default=DEFAULTS.replay_runs, show_default=True,
              help="Simulated connector restarts, each re-delivering a run of older records.")
@click.option("--schema-fraction", type=click.FloatRange(0, 1), default=DEFAULTS.schema_fraction,
              show_default=True, help="Share of records in the schemas.enable=true format.")
@click.option("--move-fraction", type=click.FloatRange(0, 1), default=DEFAULTS.move_fraction,
              show_default=True, help="Share of order updates that give the order to another customer.")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Maximum records per second, for steady-load runs  [default: unlimited]")
@click.option("--partitions", type=click.IntRange(min=1), default=3, show_default=True,
              help="Partitions of the topics when they have to be created.")
@click.option("--state-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Saved simulation  [default: $LAKEHOUSE_SOURCE_STATE or .source/shop_state.json]")
@click.option("--bootstrap", default=None,
              help="Kafka brokers, with [kafka]'s authentication  [default: [kafka] bootstrap_servers]")
@click.option("--sink", type=click.Choice(["kafka", "sql"]), default="kafka", show_default=True,
              help="kafka: produce the simulated connector's records; sql: play the changes as SQL transactions "
                   "on the real source's database (`make source-up`) and wait until Debezium delivered them.")
@click.option("--dsn", default=None,
              help="Database of --sink sql  [default: $LAKEHOUSE_SOURCE_DSN or that of `lakehouse dev source status`]")
@click.option("--declared", is_flag=True,
              help="With --sink sql: random changes (--changes, --seed) on every table of the declaration in force "
                   "(LAKEHOUSE_TABLES), typed by the database's catalog, instead of the shop's workload.")
@click.option("--dry-run", is_flag=True, help="Generate and print the stats; produce and save nothing.")
def generate(
    seed: int,
    customers: int,
    orders: int,
    changes: int,
    malformed_fraction: float,
    replays: int,
    schema_fraction: float,
    move_fraction: float,
    rate: float | None,
    partitions: int,
    state_file: Path | None,
    bootstrap: str | None,
    sink: str,
    dsn: str | None,
    declared: bool,
    dry_run: bool,
) -> None:
    """Play the upstream `shop` database: produce Debezium change events to Kafka.

    The first run produces the initial snapshot and then CHANGES change events; later runs load the
    saved simulation and produce only further changes, continuing its LSNs, ids and clock. The state
    is saved only after Kafka acknowledged every record, so a failed run is simply repeated.

    With --sink sql the same changes are real INSERT, UPDATE, DELETE and TRUNCATE transactions on
    PostgreSQL, and Debezium makes the records (tombstones and replays included); the state file
    still follows the simulation, so that later runs continue it.
    """
    path = state_file or settings.source_state_file()
    brokers = at(command_lake().config.kafka, bootstrap)
    if declared:
        if sink != "sql":
            raise click.UsageError("--declared plays SQL on the real source: add --sink sql")
        click.echo(play_declared(dsn, changes, seed))
        return
    cfg = WorkloadConfig(
        seed=seed,
        customers=customers,
        orders=orders,
        changes=changes,
        malformed_fraction=malformed_fraction,
        replay_runs=replays,
        schema_fraction=schema_fraction,
        move_fraction=move_fraction,
    )
    resumed = path.exists()
    try:
        source = ShopSource.from_json(path.read_text(encoding="utf-8")) if resumed else ShopSource(cfg.seed)
    except (ValueError, KeyError) as exc:
        raise click.ClickException(f"cannot continue from state file {path}: {exc!r}") from exc
    before = source.stats.copy()
    messages = [] if resumed else source.snapshot(cfg)
    messages += source.changes(cfg)
    run_stats = source.stats - before
    if dry_run:
        click.echo(f"dry run: would produce {len(messages)} records ({summary_of(run_stats)})")
        return
    if sink == "sql":
        summary = play_sql(messages, dsn, brokers)
        save_state(source, path)
        click.echo(f"{summary}, delivered by Debezium to {brokers.bootstrap_servers}; state {path}")
        return
    try:
        ensure_topics(brokers, partitions)
        with click.progressbar(length=len(messages), label="producing", file=sys.stderr) as bar:
            sent = produce(
                messages, brokers, rate=rate, progress=lambda done, _total: bar.update(done - bar.pos)
            )
    except KafkaUnavailableError as exc:
        raise click.ClickException(str(exc)) from exc
    save_state(source, path)
    verb = "continued" if resumed else "snapshot +"
    click.echo(f"{verb} {sent} records to {brokers.bootstrap_servers} ({summary_of(run_stats)}); lsn={source.lsn}; "
               f"state {path}")


def save_state(source: ShopSource, path: Path) -> None:
    """Write the state beside `path`, then rename it over: a run stopped mid-write keeps the previous state."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(source.to_json(), encoding="utf-8")
    os.replace(partial, path)


def _source_dsn(dsn: str | None) -> str:
    from lakehouse_dev import pg_source

    dsn = dsn or os.environ.get("LAKEHOUSE_SOURCE_DSN") or pg_source.default_dsn()
    if dsn is None:
        raise click.ClickException("--sink sql needs the real source: `make source-up`, "
                                   "or --dsn / LAKEHOUSE_SOURCE_DSN")
    return dsn


def play_declared(dsn: str | None, changes: int, seed: int) -> str:
    """Random changes on the declared tables of the real source (lakehouse_dev.generator.declared)."""
    import psycopg

    from lakehouse_dev.generator.declared import DeclaredWorkload
    from pipelines.runtime.declared import read_declaration

    dsn = _source_dsn(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        stats = DeclaredWorkload(conn, read_declaration(), seed=seed).play(changes)
    return f"played {' '.join(f'{k}={v}' for k, v in sorted(stats.items())) or 'no changes'} on {dsn}"


def play_sql(messages: list[Message], dsn: str | None, brokers: KafkaSettings) -> str:
    """The changes as SQL on the real source, then wait until Debezium put the last one on Kafka."""
    dsn = _source_dsn(dsn)
    try:
        run = play(messages, dsn, brokers)
    except (RuntimeError, TimeoutError, KafkaError) as exc:
        raise click.ClickException(str(exc)) from exc
    counts = " ".join(f"{op}={run.stats[op]}" for op in ("c", "u", "d", "t") if run.stats[op]) or "no changes"
    return f"played {counts} on {dsn}"
