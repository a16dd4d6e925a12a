"""
### Data quality

Great Expectations 1.x suites on every layer, after each hour's ETL, for every table the
declaration names (`LAKEHOUSE_TABLES`, contract section 7):

- **bronze**: keys unique and not null, LSN present, operation codes, freshness (the
  newest row is less than 24 hours old), not empty;
- **silver**: keys (unique as a whole for a composite key), the declared validation rules
  (for the shop: e-mail, country, status, currency, amount), the declared casts' types,
  derived columns present, and row counts against bronze at the batch silver consumed
  (silver + quarantine = bronze);
- **gold** (when the declaration has gold's inputs, the shop's customers and orders): keys,
  value ranges and sets, one `customer_ltv` row per silver customer, no `customer_ltv` row
  without a silver customer, `daily_revenue` order counts equal to silver's per day.

A failed expectation fails its task; the log lists each failed expectation with a few
offending values. Data Docs (HTML) are written under the lake root:
`$LAKEHOUSE_ROOT/_quality/data_docs/index.html`.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG
from lakehouse_common import DEFAULT_ARGS, START, job, spark_task

with DAG(
    dag_id="data_quality",
    schedule=timedelta(hours=1),
    start_date=START,
    catchup=False,
    max_active_runs=1,
    # One retry: for a lost executor, say; a failed expectation fails the same way twice.
    default_args={**DEFAULT_ARGS, "retries": 1},
    dagrun_timeout=timedelta(hours=1),
    doc_md=__doc__,
    tags=["lakehouse", "quality"],
):
    for layer in ("bronze", "silver", "gold"):
        spark_task(job(f"validate_{layer}", "quality", "--layer", layer),
                   doc_md=f"Great Expectations suites of the {layer} tables (`lakehouse quality --layer {layer}`).")
