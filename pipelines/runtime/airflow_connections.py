"""Airflow Connections as the configuration names them (`[source] airflow_connection`, `[connect] airflow_connection`,
a secret's `{ airflow_connection = "id" }`), read when the endpoint or the secret is used, never when the file is
loaded or a DAG is parsed.

Where a Connection is read, first that answers:

- Airflow's own `airflow.sdk.Connection.get` where Airflow is installed (inside a task: the Task SDK, then the
  secrets backends the deployment configured; the connector watchdog's task reads `[connect]` so);
- the variable `AIRFLOW_CONN_<ID>` (the id upper-cased), in either of Airflow's own forms, JSON
  (`{"conn_type": "postgres", "host": ..., "port": ..., "login": ..., "password": ..., "schema": ...,
  "extra": {...}}`) or URI (`postgres://login:password@host:port/schema?sslmode=verify-full`). This is how the
  project's CLI finds it in the tasks' subprocesses, in .venv where Airflow is not installed: the task reads
  the Connections the configuration names and hands them to its command's environment (`task_environment`,
  dags/lakehouse_common.py), never on its command line.

Here too: a section's endpoint keys from its Connection (`source_values`, `connect_values`), plain values that the
configuration's sections check as they check the file's (pipelines.runtime.config, `_Endpoint.endpoint`). Standard
library only: the DAGs' environment imports it.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pipelines.errors import SecretError, SettingError

PREFIX = "AIRFLOW_CONN_"


@dataclass(frozen=True)
class AirflowConnection:
    """The fields of one Airflow Connection the configuration uses; `password` never in its repr."""

    conn_id: str
    conn_type: str | None = None
    host: str | None = None
    port: int | None = None
    login: str | None = None
    password: str | None = field(default=None, repr=False)
    schema: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def named(self) -> str:
        return f"Airflow Connection {self.conn_id!r}"


def variable(conn_id: str) -> str:
    """The environment variable of a Connection, as Airflow's environment backend names it."""
    return PREFIX + conn_id.upper()


def parse(conn_id: str, text: str) -> AirflowConnection:
    """A Connection from the text of its `AIRFLOW_CONN_<ID>`: JSON (starting with `{`) or URI; SecretError naming
    the variable when it is neither (never quoting the text: it holds the password)."""
    text = text.strip()
    try:
        return _from_json(conn_id, json.loads(text)) if text.startswith("{") else _from_uri(conn_id, text)
    except (ValueError, TypeError) as exc:
        raise SecretError(f"{variable(conn_id)}: not an Airflow Connection in JSON or URI form "
                          f"({type(exc).__name__})") from None


def _normal_type(conn_type: str | None) -> str | None:
    """Airflow's own normalisation: `postgresql` is `postgres`, `-` is `_`."""
    if not conn_type:
        return None
    conn_type = conn_type.replace("-", "_")
    return "postgres" if conn_type == "postgresql" else conn_type


def _extra(value: Any) -> dict[str, Any]:
    extra = json.loads(value) if isinstance(value, str) and value else value or {}
    if not isinstance(extra, dict):
        raise TypeError("extra is not an object")
    return extra


def _from_json(conn_id: str, doc: Any) -> AirflowConnection:
    if not isinstance(doc, dict):
        raise TypeError("not an object")
    port = doc.get("port")
    return AirflowConnection(conn_id, _normal_type(doc.get("conn_type")), doc.get("host") or None,
                             int(port) if port not in (None, "") else None, doc.get("login") or None,
                             doc.get("password") or None, doc.get("schema") or None, _extra(doc.get("extra")))


def _from_uri(conn_id: str, uri: str) -> AirflowConnection:
    """Airflow's URI form: `type://login:password@host:port/schema?extra`, every part percent-encoded; the extra the
    query's fields, or its one `__extra__` field's JSON."""
    parts = urllib.parse.urlsplit(uri)
    if not parts.scheme:
        raise ValueError("no scheme")
    query = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    extra = _extra(query["__extra__"]) if "__extra__" in query else query
    unquote = urllib.parse.unquote
    # A host with its own scheme is percent-encoded there (`http://https%3A%2F%2Fconnect.internal:8443`).
    host = unquote(parts.hostname or "") or None
    return AirflowConnection(conn_id, _normal_type(parts.scheme), host, parts.port,
                             unquote(parts.username) if parts.username else None,
                             unquote(parts.password) if parts.password else None,
                             unquote(parts.path.lstrip("/")) or None, extra)


def read(conn_id: str, environ: Mapping[str, str] = os.environ) -> AirflowConnection:
    """The Connection `conn_id`, read now (the module's doc says where from); SecretError saying where it was looked
    for when it is in none of them."""
    found = environ.get(variable(conn_id))
    try:
        from airflow.sdk import Connection
    except ImportError:
        if found:
            return parse(conn_id, found)
        raise SecretError(f"Airflow Connection {conn_id!r}: {variable(conn_id)} is not set, and Airflow is not "
                          "installed here to ask (the project's DAG tasks set it for the commands they run: "
                          "docs/configuration.md, \"Airflow Connections\")") from None
    try:
        conn = Connection.get(conn_id)
    except Exception as exc:  # the SDK raises its own kinds for a missing connection, or outside a task
        if found:
            return parse(conn_id, found)
        raise SecretError(f"Airflow Connection {conn_id!r} cannot be read ({type(exc).__name__}: {exc})") from exc
    return AirflowConnection(conn_id, _normal_type(conn.conn_type), conn.host or None, conn.port,
                             conn.login or None, conn.password or None, conn.schema or None,
                             _extra(conn.extra))


def task_environment(conn_ids: Iterable[str]) -> tuple[dict[str, str], list[str]]:
    """Inside an Airflow task: `AIRFLOW_CONN_<ID>` (Airflow's JSON form) of each Connection of `conn_ids`, for the
    environment of the command the task runs, and the ids Airflow does not know (left out: the command then says
    which it lacks, if it needs one). Read through `Connection.get`, which also masks their passwords in the
    task's log."""
    from airflow.sdk import Connection

    env: dict[str, str] = {}
    missing: list[str] = []
    for conn_id in dict.fromkeys(conn_ids):
        try:
            env[variable(conn_id)] = Connection.get(conn_id).as_json()
        except Exception:  # not defined: AirflowNotFoundException, or the SDK's own kinds
            missing.append(conn_id)
    return env, missing


def source_values(conn: AirflowConnection) -> dict[str, Any]:
    """`[source]`'s endpoint keys from a postgres Connection, `conn` (just read): host, port (5432 when it has
    none), login, password (where it is, `{airflow_connection = id}`, read again when revealed, so the settings
    never hold it), schema the database, extra `sslmode` and `sslrootcert`; SettingError naming the Connection
    when it is of another type or lacks a field."""
    if conn.conn_type not in ("postgres", None):
        raise SettingError(f"{conn.named()} ([source] airflow_connection): conn_type {conn.conn_type!r}, "
                           "expected postgres")
    missing = [name for name in ("host", "login", "schema") if not getattr(conn, name)]
    if missing:
        raise SettingError(f"{conn.named()} ([source] airflow_connection) has no {', '.join(missing)} "
                           "(schema: the database)")
    return {"host": conn.host, "port": conn.port or 5432, "database": conn.schema, "user": conn.login,
            "password": _password(conn), **{k: conn.extra[k] for k in ("sslmode", "sslrootcert") if conn.extra.get(k)}}


def connect_values(conn: AirflowConnection) -> dict[str, Any]:
    """`[connect]`'s endpoint keys from an http or https Connection, `conn` (just read): host (with its scheme, or
    the scheme as schema or conn_type; http when none says), port, login and password (basic authentication; the
    password as `source_values`' is), extra `ssl_ca_file`; SettingError naming the Connection when it has no host."""
    if not conn.host:
        raise SettingError(f"{conn.named()} ([connect] airflow_connection) has no host")
    url = conn.host
    if "://" not in url:
        scheme = next((s for s in (conn.schema, conn.conn_type) if s in ("http", "https")), "http")
        url = f"{scheme}://{url}"
    if conn.port and urllib.parse.urlsplit(url).port is None:
        url = f"{url.rstrip('/')}:{conn.port}"
    return {"url": url, "username": conn.login, "password": _password(conn),
            "ssl_ca_file": conn.extra.get("ssl_ca_file") or None}


def _password(conn: AirflowConnection) -> dict[str, str] | None:
    """Where the Connection's password is, as a configuration file's secret says it (never the password)."""
    return {"airflow_connection": conn.conn_id} if conn.password else None
