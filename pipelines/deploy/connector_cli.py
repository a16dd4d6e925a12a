"""`lakehouse connector status/ensure`: Debezium's connector in Kafka Connect, checked and restarted where it failed
(pipelines.deploy.connector says why Connect needs a watchdog). Connect is the configuration's `[connect]`, its
credentials and CA included; the flags override its URL and the connector's name."""

from __future__ import annotations

import click

from pipelines.deploy import connector as watch
from pipelines.runtime.commands import JSON_OPTION, echo_json, pass_lake
from pipelines.runtime.lake import Lake
from pipelines.source.connect_rest import ConnectClient

URL_OPTION = click.option("--connect-url", "url", default=None,
                          help=f"Kafka Connect's REST API  [default: [connect] url, ${watch.CONNECT_URL_VARIABLE}, "
                               f"else {watch.DEFAULT_CONNECT_URL}]")
NAME_OPTION = click.option("--connector", "name", default=None,
                           help=f"The Debezium connector's name  [default: [connect] connector, "
                                f"${watch.CONNECTOR_VARIABLE}, else {watch.DEFAULT_CONNECTOR}]")


def _target(lake: Lake, url: str | None, name: str | None) -> tuple[ConnectClient, str]:
    """The REST client of `[connect]` (at --connect-url when given) and the connector's name."""
    settings = lake.config.connect
    return ConnectClient.from_settings(settings, url), name or settings.connector


@click.group("connector")
def connector() -> None:
    """Debezium's connector in Kafka Connect: its state, and a restart of what failed."""


@connector.command()
@URL_OPTION
@NAME_OPTION
@JSON_OPTION
@pass_lake
def status(lake: Lake, url: str | None, name: str | None, as_json: bool) -> None:
    """The connector's and its tasks' states, with the first line of a failure's trace; exit 1 if one FAILED,
    or when Connect does not answer."""
    state = watch.connector_state(*_target(lake, url, name))
    if as_json:
        echo_json({"name": state.name, "state": state.state,
                   "tasks": [{"id": i, "state": s} for i, s in sorted(state.tasks.items())],
                   "trace": state.trace, "failed": state.failed, "running": state.running})
    else:
        click.echo(state.line())
    if state.failed:
        raise SystemExit(1)


@connector.command()
@URL_OPTION
@NAME_OPTION
@click.option("--wait", "wait_seconds", default=60.0, show_default=True,
              help="Seconds a restarted task has to run again before this fails.")
@pass_lake
def ensure(lake: Lake, url: str | None, name: str | None, wait_seconds: float) -> None:
    """Restart the connector's FAILED task (or the connector) with its offsets, and wait until it runs: what Kafka
    Connect never does by itself. Nothing when all runs. Exit 1 when Connect does not answer, or the restarted
    task does not run within --wait (the database still away, say: the next call tries again)."""
    found, after = watch.ensure_running(*_target(lake, url, name), wait_seconds=wait_seconds)
    click.echo(found.line() if after is None else f"{found.line()}\nrestarted: {after.line()}")
