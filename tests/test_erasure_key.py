"""Where jobs get the erasure key: the environment, AWS Secrets Manager (EMR), or a key file.

AWS Secrets Manager is moto's (no AWS here); everything else is real.
"""

from __future__ import annotations

import os

import boto3
import pytest
from moto import mock_aws

from pipelines.deploy.jobs import JOB_ENV, SparkJob
from pipelines.errors import SecretError
from pipelines.runtime.secrets import erasure_key

pytestmark = pytest.mark.unit

KEY = "9f" * 32


@pytest.fixture
def aws(monkeypatch):
    for name in ("LAKEHOUSE_ERASURE_KEY", "LAKEHOUSE_ERASURE_KEY_SECRET"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    with mock_aws():
        yield


def test_a_secret_by_name_or_by_arn_in_another_region(aws, monkeypatch, tmp_path) -> None:
    boto3.client("secretsmanager", region_name="eu-west-1").create_secret(Name="lakehouse/erasure-key",
                                                                         SecretString=KEY + "\n")
    arn = boto3.client("secretsmanager", region_name="us-east-2").create_secret(
        Name="lakehouse/other", SecretString="a" * 64)["ARN"]
    monkeypatch.setenv("LAKEHOUSE_ERASURE_KEY_FILE", str(tmp_path / "never.key"))

    monkeypatch.setenv("LAKEHOUSE_ERASURE_KEY_SECRET", "lakehouse/erasure-key")
    assert erasure_key() == KEY
    monkeypatch.setenv("LAKEHOUSE_ERASURE_KEY_SECRET", arn)  # found in its own region, not the default one
    assert erasure_key() == "a" * 64
    assert not (tmp_path / "never.key").exists(), "a secret is configured: no key file may be made"
    monkeypatch.setenv("LAKEHOUSE_ERASURE_KEY", "b" * 64)  # the key itself wins
    assert erasure_key() == "b" * 64


def test_a_missing_or_short_secret_is_an_error_naming_it(aws, monkeypatch) -> None:
    monkeypatch.setenv("LAKEHOUSE_ERASURE_KEY_SECRET", "lakehouse/missing")
    with pytest.raises(SecretError, match=r"LAKEHOUSE_ERASURE_KEY_SECRET=lakehouse/missing: cannot read .*"
                                           r"ResourceNotFoundException"):
        erasure_key()
    boto3.client("secretsmanager").create_secret(Name="lakehouse/short", SecretString="abc")
    monkeypatch.setenv("LAKEHOUSE_ERASURE_KEY_SECRET", "lakehouse/short")
    with pytest.raises(SecretError, match="3 characters; the erasure key must be at least 32"):
        erasure_key()


def test_emr_steps_carry_the_secrets_name_never_the_key(monkeypatch) -> None:
    monkeypatch.setenv("LAKEHOUSE_ERASURE_KEY", KEY)
    monkeypatch.setenv("LAKEHOUSE_ERASURE_KEY_SECRET", "lakehouse/erasure-key")
    env = {k: os.environ[k] for k in JOB_ENV if os.environ.get(k)}
    step = SparkJob("gdpr_erase", ("gdpr", "erase"), env).emr_step("s3://code/lakehouse")
    args = " ".join(step["HadoopJarStep"]["Args"])
    assert "spark.yarn.appMasterEnv.LAKEHOUSE_ERASURE_KEY_SECRET=lakehouse/erasure-key" in args
    assert "spark.executorEnv.LAKEHOUSE_ERASURE_KEY_SECRET=lakehouse/erasure-key" in args
    assert KEY not in args
