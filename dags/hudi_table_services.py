"""
### Hudi table services

Every hour, beside the running ingest stream and ETL (all of them run with
`LAKEHOUSE_TABLE_SERVICES=external`: optimistic concurrency control and one lock per table,
see `hudi_configs/table_services.toml`):

- **compact** each bronze merge-on-read table: a plan is made only when there are log
  files to compact, then every pending plan is executed;
- **expire and cluster** bronze's change logs (insert-only, one or two small files per
  ingest batch): past days that silver has consumed and that are older than the retention
  are dropped, the other past days' small files are rewritten into large ones; and
  **cluster** the dead-letter store (a small file per batch that has malformed records);
- **clean and archive** every table of each layer: file slices older than the retention
  are deleted, failed writes rolled back, old instants archived.

Retention is by hours (`hoodie.clean.*`, `hoodie.keep.*` in `hudi_configs/*.toml`; the
arithmetic is in `table_services.toml`): 12 h for the change logs, 36 h for silver and
gold, against a worst reader lag of about 3 h in normal operation. A reader whose
checkpoint is gone anyway notices and rebuilds from a full read.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG
from lakehouse_common import DEFAULT_ARGS, START, job, spark_task

from pipelines.catalog import names

LAYERS = {layer: names(layer) for layer in ("bronze", "silver", "gold")}
MERGE_ON_READ = names("bronze", writer="table")
# Bronze's insert-only tables, where small files pile up: the change logs and the dead-letter store.
APPEND_ONLY = [*names("bronze", writer="changelog"), *names("bronze", writer="dead_letters")]


def _tables(names: list[str]) -> list[str]:
    return [arg for name in names for arg in ("--table", name)]


with DAG(
    dag_id="hudi_table_services",
    schedule=timedelta(hours=1),
    start_date=START,
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    dagrun_timeout=timedelta(hours=3),
    doc_md=__doc__,
    tags=["lakehouse", "hudi", "maintenance"],
):
    compactions = [spark_task(job(f"compact_{name.replace('/', '_')}", "services", "--only", "compact",
                                  "--table", name),
                              doc_md=f"Compaction of {name}, when it has log files.") for name in MERGE_ON_READ]
    changelogs = spark_task(job("expire_cluster_changelogs", "services", "--only", "expire", "--only", "cluster",
                                *_tables(APPEND_ONLY)),
                            doc_md="Drop consumed days past the retention from bronze's change logs; "
                                   "cluster the small files of their other past days and of the dead-letter store.")
    cleanups = [spark_task(job(f"clean_archive_{layer}", "services", "--only", "clean", "--only", "archive",
                               *_tables(tables)), doc_md=f"Cleaning and archival of every {layer} table.")
                for layer, tables in LAYERS.items()]
    # Clean bronze after its compactions and the change-log upkeep: what they replaced goes
    # in the same run once it is past the retention.
    [*compactions, changelogs] >> cleanups[0]
