"""
### GDPR erasure

Erases customers from the whole lake on request (contract section 4): their rows, their
orders, every retained version of the tables, quarantine and dead letters, then verifies
that nothing under the lake root still holds them and writes a certificate and an audit
record that do not repeat the personal data (ids are pseudonymised with a keyed hash).

Not scheduled: trigger it from the UI form (**Trigger** with config) or the REST API with

- `customer_ids`: the customer ids, a list of positive integers (at most 1000 a request);
- `reference`: the ticket the request answers; it names the certificate;
- `requested_by`: who asked for the erasure (a person, the DPO's address).

`validate_request` checks the request first and fails at once, without retries and before
anything is touched, naming every problem. `gdpr_erase` runs `lakehouse gdpr erase`, which
succeeds only when the erasure is verified; running it again for the same customers is
safe ("nothing left to erase"). Its result (the last log line, and the task's XCom) is a
JSON summary with the certificate's path, under `$LAKEHOUSE_ROOT/_gdpr/`.

The run's conf and XComs keep the ids in Airflow's metadata database: clean old runs of
this DAG (`airflow db clean`) as your retention policy says. Target (local / EMR):
`LAKEHOUSE_TARGET`.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.exceptions import AirflowFailException
from airflow.sdk import DAG, Param, task
from lakehouse_common import DEFAULT_ARGS, START, job, spark_task, table_asset

from pipelines.gdpr_request import MAX_ID, MAX_IDS, REFERENCE_PATTERN, InvalidRequest, parse_request

# The validated request, as validate_request returns it. Double quotes only: these templates
# sit inside the single quotes of a shlex-quoted command line (parse_request lets no quote
# into the values, and ids are digits and commas).
REQUEST = '{{{{ ti.xcom_pull(task_ids="validate_request")["{}"] }}}}'

with DAG(
    dag_id="gdpr_erasure",
    schedule=None,
    start_date=START,
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    dagrun_timeout=timedelta(hours=4),
    doc_md=__doc__,
    tags=["lakehouse", "gdpr"],
    params={
        "customer_ids": Param(
            type="array", items={"type": "integer", "minimum": 1, "maximum": MAX_ID},
            minItems=1, maxItems=MAX_IDS, title="Customer ids",
            description=f"The source ids of the customers to erase, e.g. [1042, 77] (1 to {MAX_IDS})."),
        "reference": Param(
            type="string", pattern=REFERENCE_PATTERN, title="Reference",
            description="The ticket this erasure answers, e.g. REQ-2026-0042: letters, digits and . _ : / -"),
        "requested_by": Param(
            type="string", minLength=1, maxLength=200, title="Requested by",
            description="Who asked for the erasure: letters, digits, spaces and @ . + _ - (no quotes)."),
    },
):

    @task(task_id="validate_request", multiple_outputs=False)
    def validate_request(params: dict | None = None) -> dict:
        """Check the request (`pipelines.gdpr_request.parse_request`); an invalid one fails without retries."""
        params = params or {}
        try:
            request = parse_request(params.get("customer_ids"), params.get("reference"), params.get("requested_by"))
        except InvalidRequest as err:
            raise AirflowFailException(str(err)) from err
        return {"customer_ids": ",".join(map(str, request.customer_ids)), "reference": request.reference,
                "requested_by": request.requested_by}

    validate_request() >> spark_task(
        job("gdpr_erase", "gdpr", "erase", "--customer-ids", REQUEST.format("customer_ids"),
            "--reference", REQUEST.format("reference"), "--requested-by", REQUEST.format("requested_by")),
        outlets=[table_asset("silver", "customers"), table_asset("silver", "orders"),
                 table_asset("gold", "customer_ltv"), table_asset("gold", "daily_revenue")],
        doc_md="Erase and verify (`lakehouse gdpr erase`); exit 0 only when the erasure is verified.")
