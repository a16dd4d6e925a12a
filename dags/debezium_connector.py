"""
### Debezium connector watchdog

Every 5 minutes, restarts the Debezium connector's task if Kafka Connect reports it FAILED,
and waits until it runs again. Kafka Connect never restarts a failed task by itself, and
Debezium 2.7's PostgreSQL task fails for good when the database is away for more than about
10 s (a restart, a failover): nothing flows into the lake until someone restarts it, while the
replication slot holds the database's WAL. The restart keeps the connector's offsets: the task
resumes where it stopped, and what it sends again is a replay, harmless to the lake.

- A run that finds everything RUNNING changes nothing and says so in its log.
- A run that restarted the task logs what had failed (the first line of its trace) and the
  state after the restart.
- A run fails (and notifies, as every DAG of the project does) when Connect does not answer, or
  when the restarted task has not run again within 2 minutes (the database still away, say),
  after the task's retries (a minute apart). The next run tries again.

**Configure** with the Airflow Variables `lakehouse_connect_url` (Kafka Connect's REST API,
e.g. `http://connect.internal:8083`) and `lakehouse_connector` (the connector's name); without
them, the worker's configuration's `[connect]` (lakehouse.toml, `LAKEHOUSE_CONNECT_URL`,
`LAKEHOUSE_CONNECTOR`), else the local source's (`lakehouse dev source start`:
http://127.0.0.1:8083, `shop-source`); or the whole REST API from an Airflow Connection,
`[connect] airflow_connection = "lakehouse_connect"` (an http or https Connection: host, port, login,
password, extra `ssl_ca_file`), read by this task when it runs. `[connect]`'s username, password (e.g.
`{ airflow_connection = "kafka_connect" }`) and CA go with every call. The same from a shell:
`lakehouse connector status` and `lakehouse connector ensure`.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from airflow.sdk import DAG, Variable, task
from lakehouse_common import DEFAULT_ARGS, START, alerting

log = logging.getLogger(__name__)


@task(execution_timeout=timedelta(minutes=5))
def ensure_connector() -> str:
    """Restart what failed, and wait until it runs (pipelines.deploy.connector: standard library only, no Spark),
    with `[connect]`'s credentials."""
    from pipelines.deploy import connector as watch
    from pipelines.runtime.config import load_config
    from pipelines.source.connect_rest import ConnectClient

    settings = load_config().config.connect
    # [connect] airflow_connection: the REST API read here, through the Task SDK (pipelines.runtime.airflow_connections)
    client = ConnectClient.from_settings(settings, Variable.get("lakehouse_connect_url", default=None))
    url, name = client.url, Variable.get("lakehouse_connector", default=None) or settings.connector
    found, after = watch.ensure_running(client, name, wait_seconds=120.0)
    if after is None:
        log.info("%s at %s: nothing to do", found.line(), url)
        return found.line()
    log.warning("%s at %s: restarted; now %s", found.line(), url, after.line())
    return f"restarted after {found.line()}; now {after.line()}"


with DAG(
    dag_id="debezium_connector",
    schedule=timedelta(minutes=5),
    start_date=START,
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    dagrun_timeout=timedelta(minutes=10),
    **alerting(late_after=timedelta(minutes=10)),
    doc_md=__doc__,
    tags=["lakehouse", "source"],
):
    ensure_connector()
