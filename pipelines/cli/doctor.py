"""`lakehouse doctor`: every endpoint the configuration names, tried for real, one line each.

What a team runs after writing its `lakehouse.toml` and before starting anything, and what a person runs when
a job fails to reach something: each line says ok, or what failed in words a person acts on (a refused
password, a certificate its CA did not sign, plaintext to a TLS listener, a bucket it may not write), naming the
setting to look at. Nothing is changed anywhere, but for one small object written and deleted under the lake's
root (the proof that the jobs may write there). No secret is printed: a line names where a secret is, never it.
"""

from __future__ import annotations

import os
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import click

from pipelines.errors import LakehouseError
from pipelines.runtime import console
from pipelines.runtime.commands import JSON_OPTION, echo_json, pass_lake
from pipelines.runtime.kafka_clients import described, kafka_answer
from pipelines.runtime.lake import Lake
from pipelines.runtime.settings import erasure_key_file

Status = Literal["ok", "warn", "failed", "skipped"]


@dataclass(frozen=True)
class Finding:
    """One endpoint's answer."""

    endpoint: str  # what it is: kafka, lake, erasure key, ...
    where: str  # its address, as the configuration gives it
    status: Status
    detail: str


def kafka_findings(lake: Lake, timeout: float) -> Iterator[Finding]:
    """The brokers with their authentication, then whether the declared tables' topics are there to read."""
    kafka = lake.config.kafka
    where = described(kafka).removeprefix("Kafka at ")
    topics = sorted(lake.declaration.topics())
    why, missing = kafka_answer(kafka, timeout=timeout, topics=topics)
    if why is not None:
        yield Finding("kafka", where, "failed", why)
        return
    yield Finding("kafka", where, "ok", "a client bootstraps and lists the topics")
    if missing:
        yield Finding("kafka topics", where, "warn", f"no topic {', '.join(missing)} (missing, or this principal "
                      "has no DESCRIBE permission on it); Debezium creates a table's topic with its first change")
    else:
        yield Finding("kafka topics", where, "ok", f"all {len(topics)} declared tables' topics are there")


def lake_finding(lake: Lake) -> Finding:
    """The lake's store: a small object written under the root and deleted again; a local root that is not there
    yet is left so (the first job makes it), and only whether it could be made is said."""
    from pipelines.lake import storage

    if not storage.is_remote(lake.root) and not Path(lake.root).exists():
        parent = next(p for p in Path(lake.root).absolute().parents if p.exists())
        if os.access(parent, os.W_OK | os.X_OK):
            return Finding("lake", lake.root, "ok", f"not there yet; the first job makes it in {parent}")
        return Finding("lake", lake.root, "failed", f"not there, and {parent} is not writable ([lake] root)")
    probe = f"{lake.root.rstrip('/')}/.lakehouse-doctor-{uuid.uuid4().hex}"
    try:
        storage.write_text(probe, "lakehouse doctor\n")
        storage.delete(probe)
    except Exception as exc:  # pyarrow's and the stores' errors: name them
        return Finding("lake", lake.root, "failed", f"cannot write under the root ([lake] root): "
                                                    f"{console.first_line(exc)}")
    return Finding("lake", lake.root, "ok", "an object written and deleted under the root")


def erasure_key_finding(lake: Lake) -> Finding:
    """The erasure key, read from where the configuration says (its value never shown)."""
    where = lake.config.lake.erasure_key
    if where is None and not {"LAKEHOUSE_ERASURE_KEY", "LAKEHOUSE_ERASURE_KEY_SECRET"} & set(os.environ):
        path = erasure_key_file()
        if not path.exists():
            return Finding("erasure key", str(path), "warn", "no key file yet: the first job makes one, and every "
                           "job of this lake must read the same key ([lake] erasure_key)")
    named = where.where() if where is not None else "the environment or the key file"
    try:
        lake.erasure_key  # noqa: B018 (read and checked: the finding is whether it can be)
    except LakehouseError as exc:
        return Finding("erasure key", named, "failed", str(exc))
    return Finding("erasure key", named, "ok", "read and well formed")


def source_finding(lake: Lake, timeout: float) -> Finding:
    """The source database, logged in as the configuration says (`lakehouse source check` says what it lacks)."""
    from pipelines.source.postgres import connect, where

    settings = lake.config.source
    try:
        settings = settings.endpoint()
        with connect(settings, timeout=timeout) as conn:
            row = conn.execute("SELECT current_setting('server_version'), current_setting('wal_level')").fetchone()
    except LakehouseError as exc:
        return Finding("source", where(settings), "failed", str(exc).removeprefix(f"PostgreSQL {where(settings)} "))
    version, wal_level = row if row else ("?", "?")
    if wal_level != "logical":
        return Finding("source", where(settings), "warn", f"PostgreSQL {version}, but wal_level is {wal_level}: "
                       "Debezium needs logical (`lakehouse source check`)")
    return Finding("source", where(settings), "ok", f"PostgreSQL {version}, wal_level logical, sslmode "
                                                    f"{settings.sslmode}")


def connect_finding(lake: Lake, timeout: float) -> Finding:
    """Kafka Connect's REST API with its credentials, and the state of the configured connector and its tasks."""
    from pipelines.source.connect_rest import ConnectClient

    settings = lake.config.connect
    try:
        settings = settings.endpoint()
    except LakehouseError as exc:
        return Finding("connect", f"Airflow Connection {settings.airflow_connection}", "failed", str(exc))
    client = ConnectClient.from_settings(settings, timeout=timeout)
    try:
        if not client.exists(settings.connector):
            return Finding("connect", settings.url, "warn", f"no connector {settings.connector!r} yet "
                           "([connect] connector; `lakehouse source sync` needs one to change)")
        status = client.status(settings.connector)
    except LakehouseError as exc:
        return Finding("connect", settings.url, "failed", str(exc))
    states = [status.get("connector", {}).get("state", "?"), *(t.get("state", "?") for t in status.get("tasks", []))]
    if any(state != "RUNNING" for state in states) or len(states) < 2:
        failed = next((t for t in status.get("tasks", []) if t.get("state") == "FAILED"), None)
        trace = (str(failed.get("trace") or "").strip().splitlines() or [""])[0] if failed else ""
        return Finding("connect", settings.url, "failed", f"connector {settings.connector}: "
                       f"{' / '.join(states)}{': ' + trace if trace else ''} (`lakehouse connector ensure`)")
    return Finding("connect", settings.url, "ok", f"connector {settings.connector} and its tasks RUNNING")


def metastore_finding(lake: Lake) -> Finding:
    """The Hive Metastore, when one is configured."""
    uri = lake.config.catalog.metastore_uri
    if uri is None:
        return Finding("metastore", "-", "skipped", "none configured ([catalog] metastore_uri)")
    from pipelines.metastore.catalog_sync import require_metastore

    try:
        require_metastore(uri)
    except LakehouseError as exc:
        return Finding("metastore", uri, "failed", str(exc))
    return Finding("metastore", uri, "ok", "accepts connections")


def pushgateway_finding(lake: Lake, timeout: float) -> Finding:
    """The Pushgateway the batch jobs push to, when one is configured."""
    where = lake.config.metrics.pushgateway
    if where is None:
        return Finding("pushgateway", "-", "skipped", "none configured ([metrics] pushgateway)")
    url = (where if "://" in where else f"http://{where}").rstrip("/") + "/-/healthy"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            response.read()
    except (urllib.error.URLError, OSError) as exc:
        return Finding("pushgateway", where, "failed", f"{url}: {getattr(exc, 'reason', exc)}")
    return Finding("pushgateway", where, "ok", "healthy")


def findings(lake: Lake, timeout: float) -> Iterator[Finding]:
    """Every endpoint's finding, in the order a pipeline needs them."""
    yield from kafka_findings(lake, timeout)
    checks: list[Callable[[], Finding]] = [
        lambda: source_finding(lake, timeout), lambda: connect_finding(lake, timeout), lambda: lake_finding(lake),
        lambda: erasure_key_finding(lake), lambda: metastore_finding(lake),
        lambda: pushgateway_finding(lake, timeout)]
    for check in checks:
        yield check()


@click.command("doctor")
@click.option("--timeout", type=click.FloatRange(min=1), default=10.0, show_default=True,
              help="Seconds each endpoint has to answer.")
@JSON_OPTION
@pass_lake
def doctor(lake: Lake, timeout: float, as_json: bool) -> None:
    """Try every configured endpoint for real (Kafka with its authentication, the source database, Kafka Connect
    and its connector, the lake's store, the erasure key, the metastore, the Pushgateway): one line each, exit 1
    when any failed."""
    found = []
    for finding in findings(lake, timeout):
        found.append(finding)
        if not as_json:
            click.echo(f"{finding.status:<7} {finding.endpoint:<12} {finding.where}: {finding.detail}")
    if as_json:
        echo_json([asdict(f) for f in found])
    if any(f.status == "failed" for f in found):
        raise SystemExit(1)
