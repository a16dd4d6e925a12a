"""The bronze stream on Amazon EMR: one long-running step, found by name, judged by its heartbeat.

What the `bronze_ingest_stream` DAG runs on the emr target (the local target's twin is
pipelines.deploy.stream_local). The stream is an EMR step running `lakehouse ingest` with
`ActionOnFailure=CONTINUE`; since a step that never ends blocks the steps behind it, the
cluster needs `StepConcurrencyLevel` above 1 for the batch DAGs' steps to run beside it.

The Amazon provider has no operator that cancels a step, so this drives the EMR API itself
(the boto3 client of the DAG's `EmrHook`): `list_steps` finds the stream's live steps by
name, `add_job_flow_steps` starts one, `cancel_steps` stops one (`SEND_INTERRUPT` is SIGTERM
to the step's process, `TERMINATE_PROCESS` is SIGKILL). A step in cluster deploy mode may
end while its driver lives on in YARN, which is why a stop first writes the stream's stop
request to S3 (pipelines.ingest.stream), which the driver itself polls between batches.

Pure Python (the EMR client passed in): Airflow's environment imports it. The heartbeat and
the stop request are read and written with the worker's own AWS credentials (pipelines.lake.storage).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from pipelines.deploy.jobs import JOB_ENV, SparkJob
from pipelines.deploy.stream_target import StreamTarget
from pipelines.errors import StreamError
from pipelines.ingest.stream import ControlFiles, Limits, StreamState, judge, limits
from pipelines.runtime.settings import INGEST_TRIGGER_SECONDS

log = logging.getLogger(__name__)

JOB = "bronze-stream"
LIVE = ["PENDING", "RUNNING", "CANCEL_PENDING"]


def stream_job(env: dict[str, str], trigger_seconds: float = INGEST_TRIGGER_SECONDS) -> SparkJob:
    """The stream as a Spark job: the same `lakehouse ingest` the local target supervises."""
    return SparkJob(JOB, ("ingest", "--trigger-seconds", f"{trigger_seconds:g}"),
                    {k: v for k, v in env.items() if k in JOB_ENV})


class EmrStream(StreamTarget):
    def __init__(self, emr: Any, cluster_id: str, code_uri: str, root: str, env: dict[str, str],
                 lim: Limits | None = None) -> None:
        self.emr, self.cluster_id, self.code_uri = emr, cluster_id, code_uri
        self.files = ControlFiles(root)
        self.job = stream_job({**env, "LAKEHOUSE_ROOT": root})
        self.step_name = self.job.emr_step(code_uri)["Name"]
        self.lim = lim or limits()

    def live_steps(self) -> list[dict]:
        """The stream's steps that are pending, running or being cancelled, oldest first."""
        steps: list[dict] = []
        for page in self.emr.get_paginator("list_steps").paginate(ClusterId=self.cluster_id, StepStates=LIVE):
            steps += [s for s in page["Steps"] if s["Name"] == self.step_name]
        return sorted(steps, key=lambda s: s["Status"]["Timeline"].get("CreationDateTime", 0))

    def status(self) -> str:
        steps = ", ".join(f"{s['Id']} {s['Status']['State']}" for s in self.live_steps()) or "none"
        health = judge(self.files.heartbeat(), self.lim)
        return f"{health.state}: {health.why}; live steps: {steps}"

    def ensure(self) -> str:
        steps = self.live_steps()
        if not steps and (held := self.files.stop_request()):
            return f"held: stopped by {held['by']}; `start`, `restart` or `upgrade` runs it again"
        if not steps:
            return f"started: {self.start()}"
        health = judge(self.files.heartbeat(), self.lim)
        if health.running:  # healthy, or waiting for Kafka: a restart would wait too
            return f"running: step {steps[0]['Id']}, {health.why}"
        if self.files.stop_request():
            return f"stopping: step {steps[0]['Id']} was asked to stop"
        started = steps[0]["Status"]["Timeline"].get("StartDateTime")
        if health.state in (StreamState.ABSENT, StreamState.STOPPED) and (
                started is None or time.time() - started.timestamp() < self.lim.start_timeout_seconds):
            return f"starting: step {steps[0]['Id']} {steps[0]['Status']['State']}, no heartbeat yet"
        return f"restarted ({health.state}: {health.why}): {self.stop()}; {self.start()}"

    def start(self) -> str:
        steps = self.live_steps()
        if steps:
            raise StreamError(f"the stream's step {steps[0]['Id']} is {steps[0]['Status']['State']}: "
                               "one writer per checkpoint, stop it first")
        self.files.clear_stop()
        step = self.job.emr_step(self.code_uri)
        ids = self.emr.add_job_flow_steps(JobFlowId=self.cluster_id, Steps=[step])["StepIds"]
        return f"step {ids[0]} added ({self.code_uri})"

    def stop(self) -> str:
        """Stop request, then SEND_INTERRUPT (SIGTERM), then TERMINATE_PROCESS, each after its timeout."""
        steps = self.live_steps()
        self.files.request_stop("bronze_ingest_stream DAG")
        if not steps and not judge(self.files.heartbeat(), self.lim).live:
            return "no stream running"
        if self._wait_gone(self.lim.stop_timeout_seconds):
            return "stream stopped after its batch"
        for option in ("SEND_INTERRUPT", "TERMINATE_PROCESS"):
            ids = [s["Id"] for s in self.live_steps()]
            if ids:
                log.warning("stream steps %s still live: cancel_steps %s", ids, option)
                self.emr.cancel_steps(ClusterId=self.cluster_id, StepIds=ids, StepCancellationOption=option)
            if self._wait_gone(self.lim.kill_timeout_seconds):
                return f"stream stopped by cancel_steps {option}"
        raise StreamError(f"the stream's steps did not stop: {self.status()}")

    def _wait_gone(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            if not self.live_steps() and not judge(self.files.heartbeat(), self.lim).live:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(min(10.0, max(timeout / 10, 0.5)))
