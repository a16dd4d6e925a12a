"""
### Hudi table services

Every hour, beside the running ingest stream and ETL (all of them run with
`LAKEHOUSE_TABLE_SERVICES=external`: optimistic concurrency control and one lock per table,
see `hudi_configs/table_services.toml`), on the tables that have work, and only there:

1. **due_tables** decides, from each table's timeline and file names (no Spark: a listing and a
   few small metadata reads per table, `pipelines/services/due.py`), which services are due
   on which table, and logs why for each (and which tables have nothing due); then groups the
   due tables into jobs of at most `tables_per_job` (`hudi_configs/table_services.toml` [jobs]:
   a JVM start per job, not per table), the most urgent first (a pending plan, a failed write
   to roll back; then compaction; expiry and clustering; cleaning alone), and logs each job's
   tables;
2. **services** runs one `lakehouse services --table <t>:<services> --table ...` job per group
   (dynamic task mapping: as many task instances as groups, none when nothing is due; each is
   labelled with the tables it covers). A job runs on each of its tables that table's due
   services in order, and the next table's when one fails (then fails, naming it):

- **compact** a bronze merge-on-read table that has log files since its last compaction (or a
  pending plan): a plan of every file slice with log files, then every pending plan;
- **expire and cluster** bronze's change logs (insert-only, one or two small files per
  ingest batch): past days that silver has consumed and that are older than the retention
  are dropped, the other past days' small files are rewritten into large ones; and
  **cluster** the dead-letter store (a small file per batch that has malformed records);
- **clean and archive**: file slices older than the retention are deleted, failed writes rolled
  back, old instants archived. Due when the retention frees something, and on a table whose
  other services run (what they replace goes in the same job once past the retention).

Retention is by hours (`hoodie.clean.*`, `hoodie.keep.*` in `hudi_configs/*.toml`; the
arithmetic is in `table_services.toml`): 12 h for the change logs, 36 h for silver and
gold, against a worst reader lag of about 3 h in normal operation. A reader whose
checkpoint is gone anyway notices and rebuilds from a full read. By hand, any table:
`lakehouse services --table <t>` (every service, whether due or not).
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, task
from lakehouse_common import DEFAULT_ARGS, START, alerting, dag_lake, mapped_spark_tasks


@task(execution_timeout=timedelta(minutes=15))
def due_tables() -> list[dict]:
    """The due tables, in groups of at most `tables_per_job`: one work item per Spark job (reads file names and small
    metadata files, writes nothing: outside the pool)."""
    from pipelines.services.due import services_work

    lake = dag_lake()
    return services_work(lake.root, lake.declaration)


with DAG(
    dag_id="hudi_table_services",
    schedule=timedelta(hours=1),
    start_date=START,
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    dagrun_timeout=timedelta(hours=3),
    **alerting(late_after=timedelta(hours=1)),  # the next hour's run is due
    doc_md=__doc__,
    tags=["lakehouse", "hudi", "maintenance"],
):
    mapped_spark_tasks("services", due_tables(),
                       doc_md="The due services of a group of tables "
                              "(`lakehouse services --table <t>:<services> --table ...`).")
