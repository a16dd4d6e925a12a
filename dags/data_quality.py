"""
### Data quality

Great Expectations 1.x suites on every layer, after each hour's ETL, for every table the
declaration names (`LAKEHOUSE_TABLES`, contract section 7), run only where something changed:

1. **changed_suites** compares, for each suite, the newest data-changing commit of each table it
   reads with what its last passing check recorded (`$LAKEHOUSE_ROOT/_quality/checked/`), from the
   timelines alone (no Spark, `pipelines/services/quality_due.py`). It logs every suite: checked, and why
   (changed, never passed, its declaration changed, bronze older than the freshness limit), or
   not checked again, unchanged since which check. Then it groups the declared tables with due
   suites, and gold when its are due, into jobs of at most `tables_per_job`
   (`hudi_configs/table_services.toml` [jobs]: a JVM start per job, not per table), in the
   declaration's order, gold last, and logs each job's tables;
2. **quality** runs one `lakehouse quality --suite ... --suite ...` job per group (dynamic task
   mapping: none when nothing changed; each labelled with the tables it covers).

The suites:

- **bronze**: keys unique and not null, LSN present, operation codes, freshness (the
  newest row is less than 24 hours old), not empty;
- **silver**: keys (unique as a whole for a composite key), the declared validation rules
  (for the shop: e-mail, country, status, currency, amount), the declared casts' types,
  derived columns present, and row counts against bronze at the batch silver consumed
  (silver + quarantine = bronze);
- **gold** (when the declaration has gold's inputs, the shop's customers and orders): keys,
  value ranges and sets, one `customer_ltv` row per silver customer, no `customer_ltv` row
  without a silver customer, `daily_revenue` order counts equal to silver's per day.

A failed expectation fails its job's task (the other suites of the job still run, and those that
pass are recorded) and records nothing, so the suite runs again next hour; the log lists each
failed expectation with a few offending values. Data Docs (HTML) are written under the lake
root: `$LAKEHOUSE_ROOT/_quality/data_docs/index.html`. To check everything again, delete
`_quality/checked/` or run `lakehouse quality`.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, task
from lakehouse_common import DEFAULT_ARGS, START, alerting, dag_lake, mapped_spark_tasks


@task(execution_timeout=timedelta(minutes=15))
def changed_suites() -> list[dict]:
    """The due suites, their tables in groups of at most `tables_per_job`: one work item per Spark job (reads file
    names and the check records, writes nothing: outside the pool)."""
    from pipelines.services.quality_due import quality_work

    lake = dag_lake()
    return quality_work(lake.root, lake.declaration)


with DAG(
    dag_id="data_quality",
    schedule=timedelta(hours=1),
    start_date=START,
    catchup=False,
    max_active_runs=1,
    # One retry: for a lost executor, say; a failed expectation fails the same way twice.
    default_args={**DEFAULT_ARGS, "retries": 1},
    dagrun_timeout=timedelta(hours=1),
    **alerting(late_after=timedelta(minutes=45)),
    doc_md=__doc__,
    tags=["lakehouse", "quality"],
):
    mapped_spark_tasks("quality", changed_suites(),
                       doc_md="The due suites of a group of declared tables, gold's among them when due "
                              "(`lakehouse quality --suite ... --suite ...`).")
