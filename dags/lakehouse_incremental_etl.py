"""
### Lakehouse incremental ETL

Every 10 minutes, one `lakehouse etl` cycle: the bronze changes since silver's checkpoint
become `silver/customers`, `silver/orders` (invalid rows in `silver/_quarantine/*`), then
`gold/customer_ltv` and `gold/daily_revenue` are updated for the customers and days the
changes touch. Checkpoints live in the tables' own commits, so a failed or killed run is
simply run again. One run at a time: a cycle is the only writer of silver and gold.

On success the silver and gold tables are marked as updated Assets: DAGs scheduled on
them (your own incremental ETL) run next. Target (local / EMR): `LAKEHOUSE_TARGET`.

Lineage (with the OpenLineage provider configured): the task reports bronze's change logs as
its inputs and the silver and gold tables as its outputs, and its Spark job's events name the
task's run as their parent (`lakehouse lineage` shows both).
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG
from lakehouse_common import DEFAULT_ARGS, START, alerting, dag_lake, etl_inputs, etl_outputs, job, spark_task

with DAG(
    dag_id="lakehouse_incremental_etl",
    schedule=timedelta(minutes=10),
    start_date=START,
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    dagrun_timeout=timedelta(hours=1),
    # Late after three cycles' time: the next two cycles are waiting for this one.
    **alerting(late_after=timedelta(minutes=30)),
    doc_md=__doc__,
    tags=["lakehouse", "etl"],
):
    lake = dag_lake()
    spark_task(job("etl", "etl"),
               inlets=etl_inputs(lake),
               outlets=etl_outputs(lake),
               doc_md="One incremental cycle bronze -> silver -> gold (`lakehouse etl`).")
