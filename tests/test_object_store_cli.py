"""`lakehouse dev s3 start/env/stop` as `make s3-up`, an operator's shell and `make s3-down` use them (no Spark)."""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from lakehouse_dev.object_store import BUCKET, ObjectStore
from tests.lake import run_cli

pytestmark = pytest.mark.unit


def test_the_store_starts_serves_the_bucket_and_stops(tmp_path) -> None:
    data_dir = str(tmp_path / "s3")
    up = run_cli("dev", "s3", "start", "--port", "0", "--data-dir", data_dir)  # any free port: the one bound is printed
    try:
        assert up.exit_code == 0, up.output
        env = run_cli("dev", "s3", "env", "--data-dir", data_dir)
        assert env.exit_code == 0, env.output
        exports = dict(line.removeprefix("export ").split("=", 1) for line in env.stdout.splitlines())
        assert set(exports) == {"AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"}
        assert exports["AWS_ENDPOINT_URL"] in up.stdout
        assert json.loads(run_cli("dev", "s3", "env", "--json", "--data-dir", data_dir).stdout) == exports
        port = int(exports["AWS_ENDPOINT_URL"].rsplit(":", 1)[1])
        assert port > 0
        s3 = boto3.client("s3", endpoint_url=exports["AWS_ENDPOINT_URL"], region_name=exports["AWS_REGION"],
                          aws_access_key_id=exports["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=exports["AWS_SECRET_ACCESS_KEY"])
        s3.put_object(Bucket=BUCKET, Key="p/x", Body=b"1")
        # A second `start` finds the running store: same port, the bucket and its objects kept.
        again = run_cli("dev", "s3", "start", "--port", "9", "--data-dir", data_dir)
        assert again.exit_code == 0 and f":{port}," in again.stdout, again.output
        assert s3.get_object(Bucket=BUCKET, Key="p/x")["Body"].read() == b"1"

        # The store answers S3's 503 SlowDown to the fraction of requests it is told (here all), and counts.
        store = ObjectStore(data_dir, port=port)
        once = boto3.client("s3", endpoint_url=exports["AWS_ENDPOINT_URL"], region_name=exports["AWS_REGION"],
                            aws_access_key_id=exports["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=exports["AWS_SECRET_ACCESS_KEY"],
                            config=Config(retries={"total_max_attempts": 1}))
        before = store.slow_down(1.0)
        with pytest.raises(ClientError) as refused:
            once.put_object(Bucket=BUCKET, Key="p/y", Body=b"2")
        error = refused.value.response
        assert error["Error"]["Code"] == "SlowDown" and error["ResponseMetadata"]["HTTPStatusCode"] == 503, error
        after = store.slow_down(0)
        assert (after["requests"] - before["requests"], after["slow_down"] - before["slow_down"]) == (1, 1)
        once.put_object(Bucket=BUCKET, Key="p/y", Body=b"2")  # served again
        assert store.slow_down(0)["slow_down"] == after["slow_down"]
    finally:
        down = run_cli("dev", "s3", "stop", "--data-dir", data_dir)
    assert down.exit_code == 0, down.output
    gone = run_cli("dev", "s3", "env", "--data-dir", data_dir)
    assert gone.exit_code != 0 and "make s3-up" in gone.output
