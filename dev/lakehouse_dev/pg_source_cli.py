"""`lakehouse dev source up/down/status/sync` (`make source-up`): the real source (lakehouse_dev.pg_source) as
operators start it, with its state in one folder, capturing the declared tables (`LAKEHOUSE_TABLES`).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import click

from lakehouse_dev.connect_config import CONNECTOR, PUBLICATION, SLOT
from lakehouse_dev.connect_worker import SourceError, slot_status
from lakehouse_dev.pg_source import DEFAULT_HOME, RealSource
from lakehouse_dev.source_sync import SyncError, published
from pipelines.lake.declaration import DeclarationError, declared
from pipelines.runtime.settings import kafka_bootstrap

HOME_OPTION = click.option(
    "--home", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_HOME,
    show_default=True, help="Folder of the source's state: the PostgreSQL cluster, Connect's configs, offsets, logs.")


@click.group("source")
def source() -> None:
    """The real source: PostgreSQL 15 (database `shop`) captured by Debezium 2.7.3 in Kafka Connect."""


@source.command()
@HOME_OPTION
@click.option("--pg-port", default=5433, show_default=True, help="PostgreSQL's port on 127.0.0.1.")
@click.option("--rest-port", default=8083, show_default=True, help="Kafka Connect's REST port on 127.0.0.1.")
@click.option("--bootstrap", default=None, help="Kafka brokers  [default: $KAFKA_BOOTSTRAP_SERVERS]")
@click.option("--schemas/--no-schemas", "schemas_enable", default=True, show_default=True,
              help="Values with the Connect schema (schemas.enable=true) or the bare envelope.")
def up(home: Path, pg_port: int, rest_port: int, bootstrap: str | None, schemas_enable: bool) -> None:
    """Start PostgreSQL and Connect in the background (no-op if they run) and wait until the connector streams.

    The connector captures the declared tables (LAKEHOUSE_TABLES, else the shop), checked against
    the database first; a running source is brought in line with the declaration as `sync` does.
    A folder that ran a source before keeps the ports and converter setting it ran with.
    """
    real = RealSource(home, pg_port, rest_port, bootstrap or kafka_bootstrap(), schemas_enable)
    try:
        declaration = declared()
        postgres, _ = real.up(declaration)
    except (SourceError, SyncError, DeclarationError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"source streaming: {postgres.dsn} -> Debezium -> Kafka {real.bootstrap} "
               f"(topics {', '.join(declaration.topics())})")


@source.command()
@HOME_OPTION
@click.option("--timeout", default=120.0, show_default=True,
              help="Seconds to wait for the connector's task to stream again after its config changed.")
def sync(home: Path, timeout: float) -> None:
    """Make the running source capture exactly the declared tables (LAKEHOUSE_TABLES, else the shop).

    First checks the declaration against PostgreSQL's catalog (each table exists, `key` is its
    primary key in order, every named column exists) and changes nothing if it does not match.
    Then: REPLICA IDENTITY DEFAULT on the declared tables; the connector's `table.include.list`
    (its task restarts from its committed offset: nothing is lost or re-snapshotted); the
    publication (`ALTER PUBLICATION ... SET TABLE`); and for each newly declared table, an
    incremental snapshot through Debezium's signal table, which delivers its existing rows while
    the stream goes on (it may still run when sync returns). A table no longer declared stops
    being captured; its topic stays.
    """
    if not (home / "source.json").exists():
        raise click.ClickException(f"no source in {home}; `lakehouse dev source up` starts one")
    try:
        declaration = declared()
        report = RealSource(home).sync(declaration, timeout)
    except (SourceError, SyncError, DeclarationError) as exc:
        raise click.ClickException(str(exc)) from exc
    tables = ", ".join(f"{n} ({t.source})" for n, t in declaration.tables.items())
    click.echo(f"declaration {declaration.path}: {tables}")
    for line in report.lines():
        click.echo(line)


@source.command()
@HOME_OPTION
@click.option("--purge", is_flag=True, help="Also delete the folder: the cluster, offsets and logs.")
def down(home: Path, purge: bool) -> None:
    """Stop Connect (offsets committed), then PostgreSQL; their data stays for the next `up` unless --purge."""
    if not (home / "source.json").exists():
        click.echo(f"no source in {home}")
        return
    try:
        RealSource(home).down()
    except SourceError as exc:
        raise click.ClickException(str(exc)) from exc
    if purge:
        shutil.rmtree(home)
    click.echo("source stopped" + (" and purged" if purge else ""))


@source.command()
@HOME_OPTION
def status(home: Path) -> None:
    """The DSN for psql, the connector's state and the replication slot's lag; exit 1 unless it streams."""
    if not (home / "source.json").exists():
        click.echo(f"no source in {home}; `make source-up` starts one")
        raise SystemExit(1)
    real = RealSource(home)
    postgres, worker = real.postgres, real.connect
    click.echo(f"dsn: {postgres.dsn}")
    click.echo(f"postgres: {'running' if postgres.is_running() else 'stopped'} (data {postgres.data_dir})")
    state = worker.status()
    if state is None:
        click.echo(f"connector {CONNECTOR}: Connect not answering at {worker.url} (log {worker.log_path})")
    else:
        tasks = ", ".join(f"task {t['id']} {t['state']}" for t in state.get("tasks", []))
        click.echo(f"connector {CONNECTOR}: {state['connector']['state']} ({tasks or 'no tasks'}), "
                   f"schemas.enable={str(real.schemas_enable).lower()}, Kafka {real.bootstrap}")
    slot = None
    if postgres.is_running():
        try:
            slot = slot_status(real.pg_port)
        except SourceError as exc:
            click.echo(str(exc))
    if postgres.is_running():
        try:
            with postgres.connect() as conn:
                captured = published(conn)
        except Exception as exc:  # psycopg's errors: the line says so, status goes on
            click.echo(f"publication {PUBLICATION}: cannot be read ({exc})")
        else:
            click.echo(f"publication {PUBLICATION}: " + (", ".join(sorted(captured)) if captured is not None
                                                          else "none yet (the connector creates it)"))
    if not postgres.is_running():
        click.echo(f"replication slot {SLOT}: unknown (PostgreSQL not running)")
    elif slot is None:
        click.echo(f"replication slot {SLOT}: none")
    else:
        click.echo(f"replication slot {SLOT}: {'active' if slot['active'] else 'inactive'}, "
                   f"lag {slot['lag_bytes']} bytes (confirmed flush {slot['confirmed_flush_lsn']})")
    streaming = state is not None and state["connector"]["state"] == "RUNNING" and bool(slot and slot["active"])
    if not streaming:
        raise SystemExit(1)
