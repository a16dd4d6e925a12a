"""`lakehouse dev ...`: the dev tools' commands, beside the operator's and apart from them.

Registered through the `lakehouse.commands` entry point (dev/pyproject.toml): an installation
without this distribution (the EMR bundle, a team's production image) has no `dev` command.
"""

from __future__ import annotations

import click

from lakehouse_dev.bench.cli import bench
from lakehouse_dev.demo import demo
from lakehouse_dev.generator.cli import generate
from lakehouse_dev.kafka_local import kafka
from lakehouse_dev.metastore import catalog
from lakehouse_dev.object_store import s3
from lakehouse_dev.pg_source_cli import source
from lakehouse_dev.prometheus import metrics
from lakehouse_dev.spark_cluster import cluster


@click.group(hidden=True)
def dev() -> None:
    """Local services, the contract's generator and benchmarks, for development and tests only.

    Every service listens on 127.0.0.1.
    """


for command in (demo, generate, source, kafka, s3, cluster, catalog, metrics, bench):
    dev.add_command(command)
