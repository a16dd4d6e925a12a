"""A PostgreSQL source that `lakehouse source check` finds capturable, without Kafka Connect: `python -m
tests.capturable_source start HOME` / `stop HOME`, run in .venv (Airflow's environment has no psycopg).

A secure cluster (lakehouse_dev.pg_source: TLS, scram-sha-256 only) whose `postgres` password is the one already in
HOME/postgres/password (the test's own, distinctive one), the shop's tables with the signal table and their replica
identities (as `lakehouse dev source start` prepares them), the publication of the declared tables and the
replication slot Debezium would create. What streams from the slot is the caller's (pg_recvlogical plays
Debezium's task); Connect's side is the connector config printed here, for a REST stand-in to serve.

`start` prints one JSON line: the port, the CA, the libpq URI (with a passfile, never the password) and the
connector's config.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from lakehouse_dev.connect_config import PUBLICATION, SLOT, connector_config
from lakehouse_dev.kafka_local import free_port
from lakehouse_dev.pg_source import PostgresCluster
from lakehouse_dev.source_target import check_and_prepare, dev_target
from pipelines.runtime.declared import read_declaration
from pipelines.source.check import Target


def _cluster(home: Path, port: int = 0) -> PostgresCluster:
    return PostgresCluster(home / "postgres" / "data", port, secure=True)


def start(home: Path) -> dict:
    """The cluster started and made capturable; what the caller needs to reach it (module docstring)."""
    os.chmod(home, 0o755)  # as root, the `postgres` user runs the cluster below it
    cluster = _cluster(home, free_port()).start()
    (home / "port").write_text(str(cluster.port))  # before anything else can fail: `stop` finds it
    declaration = read_declaration()
    names = dev_target(cluster.port, "http://127.0.0.1:9")
    reach = cluster.source_settings()
    source = names.source.model_copy(update={k: getattr(reach, k) for k in ("password", "sslmode", "sslrootcert")})
    published = ", ".join([*(t.source for t in declaration.tables.values()), names.source.signal_table])
    with cluster.connect() as conn:
        check_and_prepare(conn, Target(source, names.connect), declaration)
        conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {published}")
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (SLOT,))
    return {"port": cluster.port, "ca": str(cluster.tls.ca_file), "dsn": cluster.dsn,
            "connector": connector_config(cluster.port, declaration=declaration, sslrootcert=cluster.tls.ca_file)}


def stop(home: Path) -> None:
    """The cluster `start` started, if it got that far."""
    if (home / "port").exists():
        _cluster(home, int((home / "port").read_text())).stop()


if __name__ == "__main__":
    action, where = sys.argv[1], Path(sys.argv[2])
    if action == "start":
        print(json.dumps(start(where)))
    else:
        stop(where)
