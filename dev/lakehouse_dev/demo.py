"""`lakehouse dev demo` (`make demo`): the pipeline end to end on this machine, as an operator runs it.

Each step prints `$ lakehouse ...` and runs that very command as a subprocess, so the demo shows what an
operator types and what each command answers; the environment the commands share (lake, Kafka, metastore,
source, Pushgateway) is set for them, not printed. Spark, Hudi and library logs go to `<dir>/logs/`.

The source is the real one (PostgreSQL + Debezium) where PostgreSQL 15 is installed (`make setup` installs
it), else the generator; `--source` chooses. The workload comes in two rounds, each ingested and
transformed: a new database (snapshot and changes), an erasure of customer 7, then changes on it, an
incremental cycle. Every writer registers its tables in a Hive Metastore beside (LAKEHOUSE_METASTORE_URI);
the demo ends reading gold by name, now and as of the end of the first round (time travel). Prometheus runs
beside it: the first round is ingested by `ingest --once`, the second by the supervised stream while the
changes come (its exporter scraped; `stream wait` returns once bronze holds them all), which runs on to the
end; the demo ends on each table's freshness and the stream's lag as Prometheus recorded them
(`lakehouse dev metrics show`). Whatever happens, even Ctrl-C, it stops what it started.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import click

from lakehouse_dev.pg_source import postgres_available
from pipelines.runtime.local_process import HOST

FIRST_ROUND = ("--seed", "42", "--customers", "2000", "--orders", "6000", "--changes", "20000")
SECOND_ROUND = ("--changes", "5000")
SHOWN = ("gold/customer_ltv", "gold/daily_revenue")
ERASED_CUSTOMER = "7"
BY_COUNTRY = ("SELECT country, count(*) AS customers, sum(orders_count) AS orders FROM gold.customer_ltv "
              "GROUP BY country ORDER BY orders DESC LIMIT 5")
ERASED = ("SELECT count(*) AS customers, sum(orders_count) AS orders, "
          f"count_if(customer_id = {ERASED_CUSTOMER}) AS erased_{ERASED_CUSTOMER} FROM gold.customer_ltv")


class StepFailed(Exception):
    """A step's command exited non-zero: the demo stops there, with that exit code, after cleaning up."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


@dataclass(frozen=True)
class Ports:
    """Where the demo's services listen on 127.0.0.1: apart from those of `make kafka-up` and the others."""

    kafka: int
    postgres: int
    connect: int
    metastore: int
    prometheus: int
    pushgateway: int
    exporter: str  # host:port of the stream's exporter, which Prometheus scrapes


@dataclass(frozen=True)
class Demo:
    """One run: its folder (relative as the steps print it), its ports, and whether the source is PostgreSQL."""

    home: Path
    ports: Ports
    postgres: bool

    def env(self) -> dict[str, str]:
        """The environment every step runs in: the demo's own lake, broker, metastore, source and Pushgateway."""
        home = self.home.resolve()
        return {**os.environ,
                "LAKEHOUSE_ROOT": str(home / "lake"), "LAKEHOUSE_SOURCE_STATE": str(home / "shop_state.json"),
                "LAKEHOUSE_ERASURE_KEY_FILE": str(home / "erasure.key"), "LAKEHOUSE_LOG_DIR": str(home / "logs"),
                "KAFKA_BOOTSTRAP_SERVERS": f"{HOST}:{self.ports.kafka}",
                "LAKEHOUSE_METASTORE_URI": f"thrift://{HOST}:{self.ports.metastore}",
                "LAKEHOUSE_SOURCE_DSN": f"postgresql://postgres@{HOST}:{self.ports.postgres}/shop",
                "LAKEHOUSE_PUSHGATEWAY": f"{HOST}:{self.ports.pushgateway}"}

    def path(self, name: str) -> str:
        return str(self.home / name)

    def run(self, *args: str, quiet: bool = False) -> int:
        """`lakehouse ARGS` (the console script beside this interpreter) in the demo's environment: its exit code."""
        lakehouse = Path(sys.executable).with_name("lakehouse")
        return subprocess.run([str(lakehouse), *args], env=self.env(), check=False,
                              stdout=subprocess.DEVNULL if quiet else None).returncode

    def step(self, *args: str) -> None:
        """Print `$ lakehouse ARGS`, then run it; StepFailed if it fails."""
        click.echo(f"\n$ {shlex.join(['lakehouse', *args])}")
        if code := self.run(*args):
            raise StepFailed(code)


def start_services(demo: Demo) -> None:
    """The metastore, Prometheus with its Pushgateway, and with PostgreSQL the real source (its status shown)."""
    demo.step("dev", "catalog", "start", "--home", demo.path("metastore"), "--port", str(demo.ports.metastore))
    demo.step("dev", "metrics", "start", "--home", demo.path("metrics"), "--port", str(demo.ports.prometheus),
              "--pushgateway-port", str(demo.ports.pushgateway), "--stream-target", demo.ports.exporter)
    if demo.postgres:
        demo.step("dev", "source", "start", "--home", demo.path("source"), "--pg-port", str(demo.ports.postgres),
                  "--rest-port", str(demo.ports.connect))
        demo.step("dev", "source", "status", "--home", demo.path("source"))


def generate(demo: Demo, workload: tuple[str, ...]) -> None:
    """The workload as the connector's records (generator) or as SQL transactions Debezium captures (PostgreSQL)."""
    demo.step("dev", "generate", *(("--sink", "sql") if demo.postgres else ()), *workload)


def first_round(demo: Demo) -> str:
    """A new database ingested once and transformed, then an erasure: the time the round ended, for time travel."""
    generate(demo, FIRST_ROUND)
    demo.step("ingest", "--once")
    demo.step("etl")
    demo.step("gdpr", "erase", "--customer-id", ERASED_CUSTOMER, "--reference", "DEMO-ERASURE-1",
              "--requested-by", "demo")
    ended = time.strftime("%Y-%m-%d %H:%M:%S")
    time.sleep(1)  # the second round's commits fall after that second, so `--as-of` reads the first round's end
    return ended


def second_round(demo: Demo) -> None:
    """Changes ingested by the supervised stream while they come, then an incremental cycle; the stream runs on."""
    demo.step("stream", "start", "--run-dir", demo.path("run"))
    generate(demo, SECOND_ROUND)
    demo.step("stream", "wait", "--run-dir", demo.path("run"))
    demo.step("etl")


def read_back(demo: Demo, first_round_ended: str) -> None:
    """What an operator reads: status, gold samples, quality, dead letters, the catalog, SQL now and as of then."""
    demo.step("status")
    for table in SHOWN:
        demo.step("show", table, "--limit", "5")
    demo.step("quality")
    demo.step("dead-letters", "list", "--limit", "5")
    demo.step("catalog", "status")
    demo.step("sql", BY_COUNTRY)
    demo.step("sql", "--as-of", first_round_ended, ERASED)
    demo.step("sql", ERASED)
    demo.step("dev", "metrics", "show", "--home", demo.path("metrics"), "--window", "15m")


def clean_up(demo: Demo) -> None:
    """Stop the stream, the source, Prometheus, the metastore and Kafka, each whether or not the others stop."""
    demo.run("stream", "stop", "--run-dir", demo.path("run"), quiet=True)
    if demo.postgres:
        demo.run("dev", "source", "stop", "--home", demo.path("source"))
    demo.run("dev", "metrics", "stop", "--home", demo.path("metrics"))
    demo.run("dev", "catalog", "stop", "--home", demo.path("metastore"))
    demo.run("dev", "kafka", "stop", "--data-dir", demo.path("kafka"))


def run_demo(demo: Demo) -> None:
    """Every step in order on a fresh folder; whatever started is stopped at the end, on failure or Ctrl-C too."""
    shutil.rmtree(demo.home, ignore_errors=True)
    demo.home.mkdir(parents=True)
    source = "postgres" if demo.postgres else "generator"
    click.echo(f"demo on the {source} source; lake in {demo.path('lake')}, logs in {demo.path('logs')}")
    try:
        demo.step("dev", "kafka", "start", "--port", str(demo.ports.kafka), "--data-dir", demo.path("kafka"))
        start_services(demo)
        ended = first_round(demo)
        second_round(demo)
        read_back(demo, ended)
    finally:
        clean_up(demo)


@click.command("demo")
@click.option("--dir", "home", type=click.Path(file_okay=False, path_type=Path), default=Path(".demo"),
              show_default=True, help="The demo's folder, emptied first: lake, logs, services' data, source state.")
@click.option("--source", type=click.Choice(["postgres", "generator"]), default=None,
              help="The real source (PostgreSQL + Debezium) or the generator  [default: postgres where PostgreSQL "
                   "15 is installed]")
@click.option("--kafka-port", "kafka", type=click.IntRange(1, 65535), default=19092, show_default=True,
              help="The Kafka broker's port.")
@click.option("--pg-port", "postgres", type=click.IntRange(1, 65535), default=15433, show_default=True,
              help="PostgreSQL's port (the real source).")
@click.option("--connect-port", "connect", type=click.IntRange(1, 65535), default=18083, show_default=True,
              help="Kafka Connect's REST port (the real source).")
@click.option("--metastore-port", "metastore", type=click.IntRange(1, 65535), default=19083, show_default=True,
              help="The Hive Metastore's thrift port.")
@click.option("--prometheus-port", "prometheus", type=click.IntRange(1, 65535), default=19190, show_default=True,
              help="Prometheus' port (its UI and /alerts).")
@click.option("--pushgateway-port", "pushgateway", type=click.IntRange(1, 65535), default=19191, show_default=True,
              help="The Pushgateway's port, where the batch jobs push.")
@click.option("--exporter", default=f"{HOST}:9464", show_default=True,
              help="host:port of the stream's exporter (stream.toml [metrics] port), scraped by Prometheus.")
def demo(home: Path, source: str | None, exporter: str, **ports: int) -> None:
    """The pipeline end to end on this machine, each step the `lakehouse` command an operator types (`make demo`).

    Kafka, the real source (PostgreSQL + Debezium) or the generator, a Hive Metastore and Prometheus; two rounds
    of ingest and etl with an erasure between them; then status, gold samples, quality, dead letters, SQL by name
    and as of the first round, and Prometheus' record of freshness and lag. Everything it started is stopped at
    the end, on a failure or Ctrl-C too. Exit code: that of the first step that failed, else 0.
    """
    postgres = postgres_available() if source is None else source == "postgres"
    try:
        run_demo(Demo(home, Ports(**ports, exporter=exporter), postgres))
    except StepFailed as failed:
        raise SystemExit(failed.code) from None
