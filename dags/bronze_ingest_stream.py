"""
### Bronze ingest stream

Keeps exactly one bronze ingest stream (`lakehouse ingest`: Debezium topics -> `bronze/*`)
running on the target. Scheduled every 5 minutes with `action=ensure`; trigger it with
another action from the form.

- `ensure` (the schedule's): nothing if the stream is healthy; starts one if none runs;
  restarts one that died or stalled. Never starts a second copy, and leaves a stream that
  `stop` stopped as it is.
- `restart`: stops the stream gracefully, starts it again from the same checkpoint.
- `stop`: a stop request (the batch in progress commits), then SIGTERM, then a kill, each
  after its timeout; the stream then stays stopped until `restart`, `upgrade` or a start.
- `upgrade`: like `restart`; the new stream runs the code deployed now (emr: the Variable
  `lakehouse_code_uri`; local: the code installed in `.venv`).
- `status`: reports the stream's health, changes nothing.

**Health** is the stream's heartbeat, written beside its checkpoint
(`$LAKEHOUSE_ROOT/_checkpoints/ingest.heartbeat.json`): dead when it is older than
`dead_after_seconds` (or its process is gone), stalled when a batch has run, or no trigger
has completed, for `stalled_after_seconds` (`hudi_configs/stream.toml`). The same heartbeat
keeps a second writer off the checkpoint, whoever starts it.

**Targets** (`LAKEHOUSE_TARGET`):
- `local`: `lakehouse stream <action>` supervises a `lakehouse ingest` process; pid file
  and log in `$LAKEHOUSE_RUN_DIR/bronze-stream/` (default `.run/`).
- `emr`: an EMR step `lakehouse bronze-stream` (`ActionOnFailure=CONTINUE`) on the cluster of
  Variable `lakehouse_emr_cluster_id`, code from Variable `lakehouse_code_uri`, found by name
  with `list_steps`, stopped with `cancel_steps` (`SEND_INTERRUPT`, then `TERMINATE_PROCESS`)
  after the stop request. The cluster needs `StepConcurrencyLevel` > 1, or the batch DAGs'
  steps wait behind the stream forever. docs/deploying.md: "The ingest stream".

**Watch** it here (each run's log names the stream's state and why) and with
`lakehouse stream status`; **stop** it with `action=stop`.
"""

from __future__ import annotations

from datetime import timedelta

from airflow.sdk import DAG, Param
from lakehouse_common import DEFAULT_ARGS, START, alerting, stream_task

with DAG(
    dag_id="bronze_ingest_stream",
    schedule=timedelta(minutes=5),
    start_date=START,
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    dagrun_timeout=timedelta(minutes=40),
    **alerting(late_after=timedelta(minutes=20)),  # a stop waiting for its batch takes minutes
    doc_md=__doc__,
    tags=["lakehouse", "bronze", "stream"],
    params={
        "action": Param("ensure", type="string", enum=["ensure", "restart", "stop", "upgrade", "status"],
                        title="Action", description="What to do with the bronze stream (see the DAG's docs)."),
    },
):
    stream_task(doc_md="Runs `params.action` on the bronze stream of the target (`lakehouse stream`, or "
                       "the EMR step).")
