"""`lakehouse dev source start/stop/status/sync` (`make source-up`): the real source (lakehouse_dev.pg_source) as
operators start it, with its state in one folder, capturing the declared tables (`LAKEHOUSE_TABLES`).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import click

from lakehouse_dev.connect_config import CONNECTOR, PUBLICATION, SLOT
from lakehouse_dev.connect_worker import SourceError, slot_status
from lakehouse_dev.pg_source import DEFAULT_HOME, RealSource
from lakehouse_dev.source_target import published
from pipelines.errors import LakehouseError
from pipelines.runtime.commands import echo_json
from pipelines.runtime.declared import read_declaration
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
def start(home: Path, pg_port: int, rest_port: int, bootstrap: str | None, schemas_enable: bool) -> None:
    """Start PostgreSQL and Connect in the background (no-op if they run) and wait until the connector streams.

    The connector captures the declared tables (LAKEHOUSE_TABLES, else the shop), checked against
    the database first; a running source is brought in line with the declaration as `sync` does.
    A folder that ran a source before keeps the ports and converter setting it ran with.
    """
    real = RealSource(home, pg_port, rest_port, bootstrap or kafka_bootstrap(), schemas_enable)
    try:
        declaration = read_declaration()
        postgres, _ = real.up(declaration)
    except (SourceError, LakehouseError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"source streaming: {postgres.dsn} -> Debezium -> Kafka {real.bootstrap} "
               f"(topics {', '.join(declaration.topics())})")


@source.command()
@HOME_OPTION
@click.option("--timeout", default=120.0, show_default=True,
              help="Seconds to wait for the connector's task to stream again after its config changed.")
def sync(home: Path, timeout: float) -> None:
    """Make the running source capture exactly the declared tables (LAKEHOUSE_TABLES, else the shop): the
    product's `lakehouse source sync` on this source's PostgreSQL and Connect, found from --home.

    First checks the declaration against PostgreSQL's catalog (each table exists, `key` is its
    primary key in order, every named column exists) and changes nothing if it does not match.
    Then: REPLICA IDENTITY DEFAULT on the declared tables; the connector's `table.include.list`
    (its task restarts from its committed offset: nothing is lost or re-snapshotted); the
    publication (`ALTER PUBLICATION ... ADD TABLE` / `DROP TABLE`); and for each newly declared table, an
    incremental snapshot through Debezium's signal table, which delivers its existing rows while
    the stream goes on (it may still run when sync returns). A table no longer declared stops
    being captured; its topic stays.
    """
    if not (home / "source.json").exists():
        raise click.ClickException(f"no source in {home}; `lakehouse dev source start` starts one")
    try:
        declaration = read_declaration()
        report = RealSource(home).sync(declaration, timeout)
    except (SourceError, LakehouseError) as exc:
        raise click.ClickException(str(exc)) from exc
    tables = ", ".join(f"{n} ({t.source})" for n, t in declaration.tables.items())
    click.echo(f"declaration {declaration.path}: {tables}")
    for line in report.lines():
        click.echo(line)


@source.command()
@HOME_OPTION
@click.option("--purge", is_flag=True, help="Also delete the folder: the cluster, offsets and logs.")
def stop(home: Path, purge: bool) -> None:
    """Stop Connect (offsets committed), then PostgreSQL; their data stays for the next `start` unless --purge."""
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
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout instead of lines.")
def status(home: Path, as_json: bool) -> None:
    """The DSN for psql, the connector's state and the replication slot's lag; exit 1 unless it streams."""
    if not (home / "source.json").exists():
        if as_json:
            echo_json({"streaming": False, "home": str(home)})
        else:
            click.echo(f"no source in {home}; `make source-up` starts one")
        raise SystemExit(1)
    state = source_status(RealSource(home))
    if as_json:
        echo_json(state)
    else:
        for line in status_lines(state):
            click.echo(line)
    if not state["streaming"]:
        raise SystemExit(1)


def source_status(real: RealSource) -> dict[str, Any]:
    """PostgreSQL, the connector, the publication and the replication slot, each as far as it can be read.

    What cannot be read says why in its `error` and leaves the rest: status reports a source half up.
    """
    postgres, worker = real.postgres, real.connect
    running = postgres.is_running()
    state = worker.status()
    connector = {"name": CONNECTOR, "url": worker.url, "log": str(worker.log_path), "kafka": real.bootstrap,
                 "schemas_enable": real.schemas_enable, "state": None, "tasks": []}
    if state is not None:
        connector |= {"state": state["connector"]["state"],
                      "tasks": [{"id": t["id"], "state": t["state"]} for t in state.get("tasks", [])]}
    publication: dict[str, Any] = {"name": PUBLICATION, "tables": None, "error": None}
    slot: dict[str, Any] = {"name": SLOT, "exists": None, "error": None}
    if running:
        try:
            found = slot_status(real.pg_port, postgres.source_settings()) or {}
            slot |= {"exists": bool(found), **{key: value for key, value in found.items() if key != "slot"}}
        except SourceError as exc:
            slot["error"] = str(exc)
        try:
            with postgres.connect() as conn:
                captured = published(conn)
            publication["tables"] = sorted(captured) if captured is not None else None
        except Exception as exc:  # psycopg's errors: reported, status goes on
            publication["error"] = f"cannot be read ({exc})"
    streaming = connector["state"] == "RUNNING" and bool(slot.get("active"))
    return {"streaming": streaming, "home": str(real.home), "dsn": postgres.dsn,
            "postgres": {"running": running, "data_dir": str(postgres.data_dir)},
            "connector": connector, "publication": publication, "slot": slot}


def status_lines(state: dict[str, Any]) -> list[str]:
    """`source status` for a person: one line each for the DSN, PostgreSQL, the connector, publication and slot."""
    postgres, connector, publication, slot = state["postgres"], state["connector"], state["publication"], state["slot"]
    lines = [f"dsn: {state['dsn']}",
             f"postgres: {'running' if postgres['running'] else 'stopped'} (data {postgres['data_dir']})"]
    if connector["state"] is None:
        lines.append(f"connector {CONNECTOR}: Connect not answering at {connector['url']} (log {connector['log']})")
    else:
        tasks = ", ".join(f"task {t['id']} {t['state']}" for t in connector["tasks"])
        lines.append(f"connector {CONNECTOR}: {connector['state']} ({tasks or 'no tasks'}), "
                     f"schemas.enable={str(connector['schemas_enable']).lower()}, Kafka {connector['kafka']}")
    if slot["error"]:
        lines.append(slot["error"])
    if publication["error"]:
        lines.append(f"publication {PUBLICATION}: {publication['error']}")
    elif postgres["running"]:
        lines.append(f"publication {PUBLICATION}: " + (", ".join(publication["tables"]) if publication["tables"]
                                                        is not None else "none yet (the connector creates it)"))
    if not postgres["running"]:
        lines.append(f"replication slot {SLOT}: unknown (PostgreSQL not running)")
    elif not slot.get("exists"):
        lines.append(f"replication slot {SLOT}: none")
    else:
        lines.append(f"replication slot {SLOT}: {'active' if slot['active'] else 'inactive'}, "
                     f"lag {slot['lag_bytes']} bytes (confirmed flush {slot['confirmed_flush_lsn']})")
    return lines
