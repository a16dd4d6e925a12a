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
anything is touched, naming every problem; a valid request is filed in the erasure inbox
(`LAKEHOUSE_GDPR_INBOX`, outside the lake). `gdpr_erase` runs `lakehouse gdpr erase
--pending`: every request waiting in the inbox, this one and those of runs triggered
meanwhile, erased in one run (one sweep, one purge, one verification), one certificate
each, under `$LAKEHOUSE_ROOT/_gdpr/`. Runs may overlap (each files its request at once);
their erasures take the one slot of the pool `lakehouse_lake` in turn, and a run whose
request an earlier run already erased has nothing left to do. A request leaves the inbox
once its erasure is verified. Its result (the task's XCom, until `forget_request` deletes it)
is the JSON summary of each request it erased (one object, or a list), with the certificate's
path.

Where Airflow keeps the ids: the run's conf (its trigger) and, for a trigger through the REST
API, the event log's record of it (the request body). XComs, rendered commands and task logs
hold references and pseudonyms, never an id. No task can edit a run's conf (the Task SDK has
no database access; the REST API deletes finished runs, it does not change them), so after a
verified erasure `forget_request` (`pipelines.gdpr.airflow_records`) deletes this run's XComs and,
through the REST API (the Airflow connection `airflow_api`: URL, login, password), every
earlier run of this DAG that ended before this one started (their requests are erased, or
were refused), with their task instances. This run, still running then, goes with the next
run's clean-up. The event log and the newest run need the retention command, for what is
older than the retention your policy sets (archive tables skipped, or they keep a copy):
`airflow db clean --tables log,dag_run --clean-before-timestamp '<date>' --skip-archive --yes`
(it removes the old runs and event records of every DAG, with their task instances and XComs).
Target (local / EMR): `LAKEHOUSE_TARGET`.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from airflow.exceptions import AirflowFailException
from airflow.sdk import DAG, Param, task
from lakehouse_common import DEFAULT_ARGS, START, alerting, dag_lake, etl_outputs, job, spark_task

from pipelines.errors import InvalidRequest
from pipelines.gdpr.inbox import file_request
from pipelines.gdpr.request import MAX_ID, MAX_IDS, REFERENCE_PATTERN, parse_request

log = logging.getLogger(__name__)

# Requests filed while an erasure runs wait for the next one: runs overlap, erasures do not
# (the pool's one slot), so a batch of triggers is erased by one or two runs.
MAX_ACTIVE_RUNS = 16

with DAG(
    dag_id="gdpr_erasure",
    schedule=None,
    start_date=START,
    catchup=False,
    max_active_runs=MAX_ACTIVE_RUNS,
    default_args=DEFAULT_ARGS,
    dagrun_timeout=timedelta(hours=4),
    **alerting(late_after=timedelta(hours=2)),  # erasures queue behind each other in the lake pool
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
        """Check the request (`pipelines.gdpr.request.parse_request`) and file it; an invalid one fails without retries.

        Returns no id (XComs stay in Airflow's database): the erasure reads the inbox.
        """
        params = params or {}
        try:
            request = parse_request(params.get("customer_ids"), params.get("reference"), params.get("requested_by"))
        except InvalidRequest as err:
            raise AirflowFailException(str(err)) from err
        file_request(request)
        return {"reference": request.reference, "customers": len(request.customer_ids),
                "duplicates": request.duplicates}

    @task(task_id="forget_request", multiple_outputs=False)
    def forget_request() -> dict:
        """After a verified erasure: this run's XComs, and the earlier runs (their conf holds ids), deleted.

        Returns how many runs went (no id). Without the `airflow_api` connection only the
        XComs go, and the log names the retention command.
        """
        from airflow.exceptions import AirflowNotFoundException
        from airflow.sdk import Connection, get_current_context
        from airflow.sdk.execution_time.xcom import XCom

        from pipelines.gdpr.airflow_records import API_CONNECTION, AirflowApi, delete_earlier_runs

        context = get_current_context()
        run, dag = context["dag_run"], context["dag"]
        for task_id in dag.task_ids:
            XCom.delete(key="return_value", task_id=task_id, dag_id=dag.dag_id, run_id=run.run_id, map_index=-1)
        try:
            connection = Connection.get(API_CONNECTION)
        except AirflowNotFoundException:
            log.warning("no Airflow connection %r: earlier runs of %s keep their conf until the retention command "
                        "of the DAG's documentation runs", API_CONNECTION, dag.dag_id)
            return {"runs_deleted": None}
        scheme = "https" if connection.conn_type == "https" else "http"
        url = connection.host if "://" in (connection.host or "") else f"{scheme}://{connection.host}"
        if connection.port:
            url = f"{url.rstrip('/')}:{connection.port}"
        api = AirflowApi(url, connection.login or "", connection.password or "")
        gone = delete_earlier_runs(api, dag.dag_id, run.run_id, run.start_date)
        log.info("deleted %d earlier run(s) of %s, with their conf", len(gone), dag.dag_id)
        return {"runs_deleted": len(gone)}

    validate_request() >> spark_task(
        job("gdpr_erase", "gdpr", "erase", "--pending"),
        outlets=etl_outputs(dag_lake()),
        doc_md="Erase every pending request in one run and verify (`lakehouse gdpr erase --pending`); exit 0 only "
               "when the erasure is verified.") >> forget_request()
