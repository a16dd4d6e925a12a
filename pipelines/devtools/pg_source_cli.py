"""`lakehouse source up/down/status` (`make source-up`): the real source (pipelines.devtools.pg_source) as
operators start it, with its state in one folder.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import click

from pipelines.contract import TABLES, topic
from pipelines.devtools.pg_source import CONNECTOR, DEFAULT_HOME, SLOT, RealSource, SourceError, slot_status
from pipelines.settings import kafka_bootstrap

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

    A folder that ran a source before keeps the ports and converter setting it ran with.
    """
    real = RealSource(home, pg_port, rest_port, bootstrap or kafka_bootstrap(), schemas_enable)
    try:
        postgres, _ = real.up()
    except SourceError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"source streaming: {postgres.dsn} -> Debezium -> Kafka {real.bootstrap} "
               f"(topics {', '.join(topic(t) for t in TABLES)})")


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
