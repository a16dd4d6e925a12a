"""The Kafka options `[kafka]` renders for a mode no broker here serves: Amazon MSK's IAM login (AWS_MSK_IAM), for
kafka-python (botocore signs) and for the Java clients (Spark's source, Connect's worker: the aws-msk-iam-auth jar's
login module and callback handler). Rendered only: tests/test_kafka_auth_modes.py checks that the classes named
are in the jar the EMR bundle ships; the modes a broker here serves are tried for real there.
"""

from __future__ import annotations

import pytest

from pipelines.runtime.config import KafkaSettings
from pipelines.runtime.kafka_clients import (
    MSK_IAM_CALLBACK,
    MSK_IAM_LOGIN,
    java_properties,
    python_options,
    spark_options,
)

pytestmark = pytest.mark.unit

MSK = KafkaSettings(bootstrap_servers="b-1.msk.example:9098", security_protocol="SASL_SSL",
                    sasl_mechanism="AWS_MSK_IAM")


def test_msk_iam_renders_the_iam_login_and_no_password() -> None:
    assert java_properties(MSK) == {
        "bootstrap.servers": "b-1.msk.example:9098", "security.protocol": "SASL_SSL", "sasl.mechanism": "AWS_MSK_IAM",
        "sasl.jaas.config": "software.amazon.msk.auth.iam.IAMLoginModule required;",
        "sasl.client.callback.handler.class": "software.amazon.msk.auth.iam.IAMClientCallbackHandler"}
    assert MSK_IAM_LOGIN in spark_options(MSK)["kafka.sasl.jaas.config"]
    assert spark_options(MSK)["kafka.sasl.client.callback.handler.class"] == MSK_IAM_CALLBACK
    assert python_options(MSK) == {"bootstrap_servers": "b-1.msk.example:9098", "security_protocol": "SASL_SSL",
                                   "sasl_mechanism": "AWS_MSK_IAM", "ssl_check_hostname": True}
