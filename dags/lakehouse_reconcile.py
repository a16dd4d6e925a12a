"""
### Reconciliation: is the lake still the source?

Once a day, `lakehouse reconcile` compares each declared table's bronze rows with the PostgreSQL table it
mirrors (the `[source]` of the deployment's lakehouse.toml), without moving every row: both sides hash the
same canonical text of each row into buckets of their keys, only the buckets that differ are read row by row,
and a row that differs is looked at again after the stream has had time to apply what changed meanwhile
(docs/reconcile.md).

The task log gives, per table, the rows on each side, the keys missing from the lake, the keys only the lake
holds and the keys whose values differ, with the columns. The task fails when a table drifted (exit 1), and
the run's figures go to the Pushgateway (`lakehouse_reconcile_rows`, `lakehouse_reconcile_drift_rows`,
the run's duration): the alert `LakehouseReconcileDrift` fires until a run finds the table exact. Run it by
hand after `lakehouse source sync` or any change of the source's replication.

`reconcile_silver` compares each declared table's silver and quarantine with what the declared rules make of
bronze as of the version silver last consumed (`lakehouse reconcile --layer silver`), in the lake alone.

Beside them, `lakehouse source check` looks for every reason a declared table's changes would not reach Kafka (the
replication slot gone or invalidated, a table no longer in the publication, the connector not capturing it): the
task fails on one, and `LakehouseSourceCannotCapture` fires until a check finds none.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG
from lakehouse_common import DEFAULT_ARGS, START, alerting, job, spark_task

with DAG(
    dag_id="lakehouse_reconcile",
    schedule=timedelta(days=1),
    start_date=START,
    catchup=False,
    max_active_runs=1,
    # A drift fails the same way twice; one retry is for a lost executor or a database restart.
    default_args={**DEFAULT_ARGS, "retries": 1, "execution_timeout": timedelta(hours=2)},
    dagrun_timeout=timedelta(hours=3),
    **alerting(late_after=timedelta(hours=2)),
    doc_md=__doc__,
    tags=["lakehouse", "reconcile"],
):
    # Apart, not in line: a finding of the check (a table out of the publication) is also a reason to reconcile.
    spark_task(job("source_check", "source", "check"),
               doc_md="Every reason a declared table's changes would not reach its topic (`lakehouse source check`): "
                      "the slot, the publication, the connector; pushed as `lakehouse_source_findings`.")
    spark_task(job("reconcile", "reconcile"),
               doc_md="Bronze against the source database, every declared table (`lakehouse reconcile`).")
    spark_task(job("reconcile_silver", "reconcile", "--layer", "silver"),
               doc_md="Silver and its quarantine against the declared rules applied to bronze as of silver's own "
                      "checkpoint, every declared table (`lakehouse reconcile --layer silver`); no database.")
