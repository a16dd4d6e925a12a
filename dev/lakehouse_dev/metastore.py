"""A real Hive Metastore on this machine: the catalog the lake's tables are registered in by name.

It is the metastore of the Hive jars pip's pyspark already ships (Hive 2.3.9, the version Spark's
own Hive client speaks), serving thrift on 127.0.0.1, with its database (embedded Derby) and
warehouse in a folder of its own (`.metastore/` for `make catalog-up`). The writers register the
tables there when `LAKEHOUSE_METASTORE_URI` names it (pipelines/metastore/catalog_sync.py); consumers read
them by name (`lakehouse sql`). On EMR the same role is the Glue Data Catalog's.

Two settings are not Hive's defaults: `hive.async.log.enabled=false` (the asynchronous logger needs
LMAX Disruptor, which pyspark does not ship: NoClassDefFoundError at start), and the schema created
on first start (`datanucleus.schema.autoCreateAll`), which `schematool` would otherwise do. Hive
2.3.9 has no bind-address setting: the thrift port listens on every interface.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import click

from pipelines.runtime.local_process import HOST, LocalProcess, free_port, java_command, port_open, saved_state
from pipelines.runtime.settings import PROJECT_ROOT, spark_home

DEFAULT_DIR = PROJECT_ROOT / ".metastore"
DEFAULT_PORT = 9083
MAIN_CLASS = "org.apache.hadoop.hive.metastore.HiveMetaStore"
# Derby and the thrift server of a small catalog: the lake's tables are a few hundred rows of it.
HEAP = "512m"
PORT_TRIES = 3


@dataclass
class Metastore(LocalProcess):
    """The metastore daemon, its port kept in `<home>/metastore.json` for `stop` and later starts."""

    label = "Hive Metastore"
    # First start creates Derby's schema (about 15 s here); later starts take a few seconds.
    start_timeout = 120.0

    home: Path
    port: int = DEFAULT_PORT

    def __post_init__(self) -> None:
        self.home = Path(self.home).resolve()
        if saved := self._saved():
            self.port = saved["port"]

    @property
    def pid_path(self) -> Path:
        return self.home / "metastore.pid"

    @property
    def log_path(self) -> Path:
        return self.home / "metastore.log"

    @property
    def state_path(self) -> Path:
        return self.home / "metastore.json"

    @property
    def database(self) -> Path:
        """Derby's database folder: every database, table and partition entry of the catalog."""
        return self.home / "metastore_db"

    @property
    def warehouse(self) -> Path:
        """Where a managed table would go; the lake's tables are external (at their lake paths)."""
        return self.home / "warehouse"

    @property
    def uri(self) -> str:
        return f"thrift://{HOST}:{self.port}"

    @property
    def marker(self) -> str:
        return f"databaseName={self.database}"

    def _saved(self) -> dict[str, Any] | None:
        return saved_state(self.state_path)

    def command(self) -> list[str]:
        conf = {"hive.async.log.enabled": "false",
                "javax.jdo.option.ConnectionURL": f"jdbc:derby:;{self.marker};create=true",
                "datanucleus.schema.autoCreateAll": "true",
                "hive.metastore.schema.verification": "false",
                "hive.metastore.warehouse.dir": str(self.warehouse)}
        args = [a for k, v in conf.items() for a in ("--hiveconf", f"{k}={v}")]
        return java_command(MAIN_CLASS, "-p", str(self.port), *args,
                            classpath=str(spark_home() / "jars" / "*"), options=[f"-Xmx{HEAP}"])

    def popen_options(self) -> dict[str, Any]:
        return {"cwd": self.home}  # Derby writes derby.log into the working directory

    def unready(self, pid: int, deadline: float) -> str | None:
        return None if port_open(self.port) else f"not listening on {self.uri} yet"

    def up(self) -> Self:
        """Start it unless it runs (a first start chooses the port: `port` 0 is any free one).

        Hive 2.3.9 cannot bind port 0 itself, so a free port is chosen first, and another process can
        take it before the metastore binds it ("Address already in use"): a port
        chosen so is chosen again, up to PORT_TRIES times.
        """
        self.home.mkdir(parents=True, exist_ok=True)
        if self.pid() is not None:
            return self.start(self.start_timeout)
        chosen = not self.port
        for _ in range(PORT_TRIES - 1 if chosen else 0):
            try:
                return self._start_on(free_port())
            except RuntimeError as exc:
                if "Address already in use" not in str(exc):
                    raise
        return self._start_on(free_port() if chosen else self.port)

    def _start_on(self, port: int) -> Self:
        self.port = port
        self.state_path.write_text(json.dumps({"port": self.port}))
        return self.start(self.start_timeout)

    def down(self) -> None:
        """Stop it; the folder keeps the catalog, found again by the next start."""
        self.stop()

    def __enter__(self) -> Self:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()


_HOME = click.option("--home", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_DIR,
                     show_default=True, help="Folder of the metastore's database, warehouse, pid file and log.")


@click.group("catalog")
def catalog() -> None:
    """A local Hive Metastore (`lakehouse catalog status|sync` are the operator's side)."""


@catalog.command()
@click.option("--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT, show_default=True,
              help="The thrift port (0: any free one); a folder that ran before keeps its port.")
@_HOME
def start(port: int, home: Path) -> None:
    """Start the metastore (kept if it runs) and wait until it accepts connections."""
    try:
        running = Metastore(home, port).up()
    except RuntimeError as error:
        raise click.ClickException(str(error)) from error
    click.echo(f"Hive Metastore {running.uri} (database {running.database}, log {running.log_path})")
    click.echo(f"writers register the lake's tables there with: export LAKEHOUSE_METASTORE_URI={running.uri}")


@catalog.command()
@_HOME
def stop(home: Path) -> None:
    """Stop the metastore (its database stays in the folder)."""
    Metastore(home).down()
    click.echo("Hive Metastore stopped")
