"""The `bronze_ingest_stream` DAG: one stream on the target, whatever runs it and however often.

Local target: `dag.test()` runs the DAG's task in-process; it starts a real `lakehouse ingest`
on a copy of a lake built by the pipeline, with a real broker. The stream's behaviour under
kills, upgrades and SIGTERM, with bronze checked against the model, is the Spark suite's
test_supervised_stream_restarts_upgrades_and_stops_exactly_once (the same command this task runs).

EMR target: AWS cannot exist here, so the EMR and S3 APIs are a moto server on 127.0.0.1
(the only mocked part). moto keeps every step RUNNING and does not implement `cancel_steps`
(it answers 500): the test checks that a stop writes the stream's stop request to S3 first and
then calls `cancel_steps`, and that the error names that call; a step's end is not testable.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

import boto3
import pytest
from conftest import DAGS

from pipelines.ingest.stream import HEARTBEAT, STOP_REQUEST, StreamLease, limits

pytestmark = pytest.mark.integration

LIMITS = """
[stream.health]
heartbeat_seconds = 1
dead_after_seconds = 20
[stream.supervisor]
start_timeout_seconds = 240
stop_timeout_seconds = 120
kill_timeout_seconds = 1
"""


def _dag():
    from airflow.models.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS), include_examples=False)
    assert bag.import_errors == {}, bag.import_errors
    return bag.dags["bronze_ingest_stream"]


def _limits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, limits: str = LIMITS) -> None:
    (tmp_path / "stream.toml").write_text(limits)
    monkeypatch.setenv("LAKEHOUSE_HUDI_OVERRIDES",
                       os.pathsep.join([os.environ["LAKEHOUSE_HUDI_OVERRIDES"], str(tmp_path / "stream.toml")]))


def test_the_form_offers_the_actions_and_ensure_is_the_schedule() -> None:
    dag = _dag()
    assert dag.params["action"] == "ensure"
    assert dag.params.get_param("action").schema["enum"] == ["ensure", "restart", "stop", "upgrade", "status"]
    assert dag.max_active_runs == 1 and dag.timetable.summary


@pytest.mark.slow
def test_local_dag_starts_one_stream_restarts_a_killed_one_and_stops_it(lake: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    _limits(tmp_path, monkeypatch)
    run_dir = tmp_path / "run"
    monkeypatch.setenv("LAKEHOUSE_RUN_DIR", str(run_dir))
    dag = _dag()

    def run(action: str) -> None:
        state = dag.test(run_conf={"action": action}).state
        log = (run_dir / "bronze-stream" / "stream.log")
        assert state == "success", f"{action}: {state}; " + (log.read_text()[-2000:] if log.exists() else "")

    def pid() -> int:
        return json.loads((run_dir / "bronze-stream" / "stream.pid").read_text())["pid"]

    def heartbeat() -> dict:
        return json.loads((lake / HEARTBEAT).read_text())

    try:
        run("ensure")
        first = pid()
        assert heartbeat()["state"] == "running" and heartbeat()["pid"] == first
        run("ensure")
        assert pid() == first, "a second ensure started another stream"
        os.killpg(first, signal.SIGKILL)
        run("ensure")
        second = pid()
        assert second != first and heartbeat()["pid"] == second
        run("stop")
        assert heartbeat()["state"] == "stopped"
        run("ensure")  # held: a stopped stream stays stopped
        assert heartbeat()["state"] == "stopped" and pid() == second
    finally:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            os.killpg(pid(), signal.SIGKILL)


def test_emr_ensure_adds_one_step_and_stop_requests_then_cancels(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint,
                           "LAKEHOUSE_TARGET": "emr", "LAKEHOUSE_ROOT": "s3://lake/prod",
                           "KAFKA_BOOTSTRAP_SERVERS": "b-1.msk.internal:9092"}.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", json.dumps(
            {"conn_type": "aws", "extra": {"region_name": "us-east-1", "endpoint_url": endpoint}}))
        # moto's steps never end: the stop request's wait is cut short.
        _limits(tmp_path, monkeypatch, LIMITS.replace("stop_timeout_seconds = 120", "stop_timeout_seconds = 1"))
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket="lake")
        emr = boto3.client("emr")
        cluster = emr.run_job_flow(
            Name="lakehouse", ReleaseLabel="emr-7.11.0", Applications=[{"Name": "Spark"}],
            Instances={"MasterInstanceType": "m5.xlarge", "InstanceCount": 1, "KeepJobFlowAliveWhenNoSteps": True},
            StepConcurrencyLevel=4, JobFlowRole="EMR_EC2_DefaultRole", ServiceRole="EMR_DefaultRole")["JobFlowId"]

        (task,) = _dag().tasks
        assert task.op_kwargs["action"] == "{{ params.action }}"
        from lakehouse_common import supervise_emr_stream

        code = "s3://lakehouse-code/release-2"
        assert supervise_emr_stream("ensure", cluster, code).startswith("started: step ")
        (step,) = emr.list_steps(ClusterId=cluster)["Steps"]
        assert step["Name"] == "lakehouse bronze-stream" and step["ActionOnFailure"] == "CONTINUE"
        args = step["Config"]["Args"]
        assert f"{code}/lakehouse.zip" in args and args[-3:] == ["ingest", "--trigger-seconds", "5"]
        assert {"spark.yarn.appMasterEnv.LAKEHOUSE_ROOT=s3://lake/prod",
                "spark.yarn.appMasterEnv.LAKEHOUSE_TABLE_SERVICES=external"} <= set(args)
        assert supervise_emr_stream("ensure", cluster, code).startswith("starting: ")

        # The driver's heartbeat, on S3 as the running step writes it: healthy, so nothing to do.
        lease = StreamLease("s3://lake/prod", limits())
        lease.claim()
        assert supervise_emr_stream("ensure", cluster, code).startswith("running: ")
        assert len(emr.list_steps(ClusterId=cluster)["Steps"]) == 1, "ensure added a second step"

        # The driver goes silent (another host, old heartbeat): ensure restarts, which first
        # asks the stream to stop on S3, then cancels the step, which moto cannot do.
        lease.hb.host, lease.hb.written_at = "ip-10-0-0-1", time.time() - 3600
        s3.put_object(Bucket="lake", Key=f"prod/{HEARTBEAT}", Body=json.dumps(lease.hb.__dict__).encode())
        with pytest.raises(Exception, match="CancelSteps"):
            supervise_emr_stream("ensure", cluster, code)
        request = json.loads(s3.get_object(Bucket="lake", Key=f"prod/{STOP_REQUEST}")["Body"].read())
        assert request["by"] == "bronze_ingest_stream DAG"
    finally:
        server.stop()
