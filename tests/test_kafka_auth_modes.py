"""Every way of authenticating to Kafka that `[kafka]` offers and a broker here serves, each told by a
`lakehouse.toml` alone, against the dev broker's SASL (SASL_PLAINTEXT), SECURE (SASL_SSL) and MTLS (SSL, client
certificate required) listeners (dev/lakehouse_dev/kafka_local.py): `doctor`'s Kafka line is ok; kafka-python's
clients (pipelines.runtime.kafka_clients.python_options) produce and consume; Kafka Connect's producer, from the
worker.properties the dev worker writes (dev/lakehouse_dev/connect_worker.py), parsed by Java and run as a Java
producer, sends too; and Spark's Kafka source (`spark_options`) reads both records in a batch. Then what is
refused: a wrong password (PLAIN and SCRAM), mutual TLS without a client certificate, plaintext to the mutual-TLS
listener, each a `doctor` line naming the endpoint and the setting, and a non-zero exit.

One broker with all the listeners for the module, the suite's Spark session for the reads, and each test's
`doctor` runs started at once (a JVM-free process each, mostly waiting on the broker).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, KafkaProducer
from pyspark.sql import SparkSession

from hudi_configs import test_profile as suite_profile
from lakehouse_dev.connect_worker import ConnectWorker
from lakehouse_dev.kafka_local import JVM_HEAP, SCRAM_USER, KafkaBroker, java_options
from pipelines.deploy.package import _msk_iam_jar
from pipelines.runtime.config import KafkaSettings, load_config
from pipelines.runtime.kafka_clients import MSK_IAM_CALLBACK, MSK_IAM_LOGIN, python_options, spark_options
from pipelines.runtime.local_process import java_command
from pipelines.runtime.settings import jvm_dir
from tests.lake import own_environment

pytestmark = pytest.mark.integration

# Each mode: the broker's listener, and the [kafka] keys besides bootstrap_servers (TOML values, as written).
MODES: dict[str, tuple[str, dict[str, str]]] = {
    "sasl_plaintext-plain": ("sasl", {"security_protocol": '"SASL_PLAINTEXT"', "sasl_mechanism": '"PLAIN"'}),
    "sasl_plaintext-scram_sha_256": ("sasl", {"security_protocol": '"SASL_PLAINTEXT"',
                                              "sasl_mechanism": '"SCRAM-SHA-256"'}),
    "sasl_plaintext-scram_sha_512": ("sasl", {"security_protocol": '"SASL_PLAINTEXT"',
                                              "sasl_mechanism": '"SCRAM-SHA-512"'}),
    "sasl_ssl-scram_sha_256": ("secure", {"security_protocol": '"SASL_SSL"', "sasl_mechanism": '"SCRAM-SHA-256"'}),
    "sasl_ssl-scram_sha_512": ("secure", {"security_protocol": '"SASL_SSL"', "sasl_mechanism": '"SCRAM-SHA-512"'}),
    "ssl-client_certificate": ("mtls", {"security_protocol": '"SSL"'}),
}
# Each refusal: the mode it starts from, the keys it changes ("" drops one), and the words doctor must say.
REFUSALS: dict[str, tuple[str, dict[str, str], str]] = {
    "wrong_password-plain": ("sasl_plaintext-plain", {"sasl_password": "WRONG"},
                             "authentication failed: the brokers refused the SASL username or password ([kafka] "
                             "sasl_username, sasl_password)"),
    "wrong_password-scram_sha_256": ("sasl_ssl-scram_sha_256", {"sasl_password": "WRONG"},
                                     "authentication failed: the brokers refused the SASL username or password"),
    "mtls_without_client_certificate": ("ssl-client_certificate", {"ssl_cert_file": "", "ssl_key_file": ""},
                                        "the brokers require a client certificate (mutual TLS) and this client "
                                        "presents none ([kafka] ssl_cert_file, ssl_key_file"),
    "plaintext_to_the_tls_listener": ("ssl-client_certificate",
                                      {"security_protocol": '"PLAINTEXT"', "ssl_ca_file": "", "ssl_cert_file": "",
                                       "ssl_key_file": ""},
                                      "plaintext to a TLS listener ([kafka] security_protocol: SSL or SASL_SSL)"),
}


# The Java producer's warnings and errors on its standard error (the worker's keys it does not know are one
# WARN line, which names no value).
PRODUCER_LOG4J = """\
log4j.rootLogger=WARN, stderr
log4j.appender.stderr=org.apache.log4j.ConsoleAppender
log4j.appender.stderr.Target=System.err
log4j.appender.stderr.layout=org.apache.log4j.PatternLayout
log4j.appender.stderr.layout.ConversionPattern=%p %m (%c)%n
"""


@pytest.fixture(scope="module")
def auth_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka-auth"), secure_port=0, sasl_port=0, mtls_port=0).start()
    try:
        yield broker
    finally:
        broker.stop()


def kafka_keys(broker: KafkaBroker, mode: str, **changed: str) -> dict[str, str]:
    """The [kafka] section of `mode` on `broker` (TOML values), with `changed` replacing keys ("": dropped)."""
    listener, keys = MODES[mode]
    bootstrap = {"sasl": broker.sasl_bootstrap, "secure": broker.secure_bootstrap, "mtls": broker.mtls_bootstrap}
    section = {"bootstrap_servers": f'"{bootstrap[listener]}"', **keys}
    if "sasl_mechanism" in keys:
        section |= {"sasl_username": f'"{SCRAM_USER}"', "sasl_password": f'{{ file = "{broker.scram_password_file}" }}'}
    if listener != "sasl":
        section["ssl_ca_file"] = f'"{broker.tls.ca_file}"'
    if listener == "mtls":
        section |= {"ssl_cert_file": f'"{broker.tls.client_cert}"', "ssl_key_file": f'"{broker.tls.client_key}"'}
    return {key: value for key, value in (section | changed).items() if value}


def write_config(where: Path, name: str, kafka: dict[str, str]) -> Path:
    """A lakehouse.toml for a lake in `where` with this [kafka] section."""
    where.mkdir(parents=True, exist_ok=True)
    (where / "erasure.key").write_text("ab" * 32)
    path = where / f"lakehouse-{name}.toml"
    path.write_text("\n".join([
        "[lake]", 'root = "lake"', 'erasure_key = { file = "erasure.key" }', f'hudi_overrides = ["{suite_profile()}"]',
        "", "[kafka]", *(f"{key} = {value}" for key, value in kafka.items())]) + "\n")
    return path


@pytest.fixture(scope="module")
def configs(auth_broker: KafkaBroker, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each mode's and each refusal's lakehouse.toml."""
    where = tmp_path_factory.mktemp("configs")
    wrong = where / "wrong-password"
    wrong.write_text("not-the-password")
    paths = {mode: write_config(where, mode, kafka_keys(auth_broker, mode)) for mode in MODES}
    for refusal, (mode, changed, _) in REFUSALS.items():
        changed = {k: f'{{ file = "{wrong}" }}' if v == "WRONG" else v for k, v in changed.items()}
        paths[refusal] = write_config(where, refusal, kafka_keys(auth_broker, mode, **changed))
    return paths


def doctor(configs: dict[str, Path], names: Iterable[str]) -> dict[str, tuple[int, dict[str, Any]]]:
    """`lakehouse doctor --json` of the configs `names`, all started at once: each exit code and Kafka finding."""
    runs = {name: subprocess.Popen([sys.executable, "-m", "pipelines.cli", "--config", str(configs[name]), "doctor",
                                    "--timeout", "5", "--json"], env=own_environment(), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
            for name in names}
    found = {}
    for name, run in runs.items():
        out, err = run.communicate(timeout=180)
        assert out, f"{name}: doctor printed nothing: {err}"
        found[name] = (run.returncode, next(f for f in json.loads(out) if f["endpoint"] == "kafka"))
    return found


def kafka_settings(config: Path) -> KafkaSettings:
    """The [kafka] section the pipeline's jobs would read from `config`, told nothing else."""
    return load_config(config, environ=own_environment()).config.kafka


def consumed(kafka: KafkaSettings, topic: str, count: int, timeout: float = 30.0) -> list[bytes]:
    """The first `count` values of `topic`, read by kafka-python with `kafka`'s authentication."""
    consumer = KafkaConsumer(topic, **python_options(kafka), auto_offset_reset="earliest", group_id=None)
    values: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while len(values) < count and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=1000).values():
                values.extend(record.value for record in records)
    finally:
        consumer.close()
    return values


def connect_producer_sends(kafka: KafkaSettings, work_dir: Path, topic: str, value: str) -> None:
    """`value` to `topic` from a Java producer given the worker.properties the dev Connect worker writes for
    `kafka` (its secrets in secrets.properties, resolved by the FileConfigProvider, as in Connect): the file as
    Java parses it, PEM chains and all. The worker's clients all get the same security settings, whatever their
    prefix; the producer reads the unprefixed ones and ignores the rest."""
    worker = ConnectWorker(work_dir, kafka.bootstrap_servers, pg_port=5432, kafka=kafka)
    work_dir.mkdir(parents=True, exist_ok=True)
    worker.prepare(0)
    log4j = work_dir / "producer-log4j.properties"
    log4j.write_text(PRODUCER_LOG4J)
    command = java_command("kafka.tools.ConsoleProducer", "--bootstrap-server", kafka.bootstrap_servers,
                           "--topic", topic, "--producer.config", str(work_dir / "worker.properties"),
                           "--max-block-ms", "30000", "--sync", classpath=f"{jvm_dir() / 'kafka'}/*",
                           options=[*JVM_HEAP, *java_options(), f"-Dlog4j.configuration=file:{log4j}"])
    sent = subprocess.run(command, input=f"{value}\n", capture_output=True, text=True, timeout=120, check=False)
    assert sent.returncode == 0, sent.stdout + sent.stderr
    assert "ERROR" not in sent.stderr, sent.stderr


def a_mode_works(mode: str, config: Path, finding: dict[str, Any], spark: SparkSession, work_dir: Path) -> None:
    """`mode`, told by `config`: doctor's Kafka line ok, a record from kafka-python and one from Connect's producer
    read back by kafka-python and by Spark's Kafka source."""
    assert finding["status"] == "ok", finding
    kafka = kafka_settings(config)
    assert kafka.bootstrap_servers in finding["where"], finding

    topic = f"auth-{mode}"
    producer = KafkaProducer(**python_options(kafka))
    try:
        producer.send(topic, f"{mode} from kafka-python".encode()).get(timeout=30)
    finally:
        producer.close()
    connect_producer_sends(kafka, work_dir, topic, f"{mode} from Connect's producer")
    expected = {f"{mode} from kafka-python".encode(), f"{mode} from Connect's producer".encode()}
    assert set(consumed(kafka, topic, 2)) == expected

    read = (spark.read.format("kafka").options(**spark_options(kafka)).option("subscribe", topic)
            .option("startingOffsets", "earliest").option("endingOffsets", "latest").load())
    assert {bytes(row.value) for row in read.select("value").collect()} == expected


def test_every_mode_is_ok_for_doctor_kafka_python_connect_and_spark(
        configs: dict[str, Path], spark: SparkSession, tmp_path: Path) -> None:
    # One test, not one per mode: the suite's processes would each start the module's broker and doctors.
    found = doctor(configs, MODES)
    failed = {}
    for mode in MODES:
        try:
            a_mode_works(mode, configs[mode], found[mode][1], spark, tmp_path / mode)
        except AssertionError as error:  # every mode tried: the report names each that failed
            failed[mode] = str(error)
    assert not failed, "\n\n".join(f"{mode}: {why}" for mode, why in failed.items())


def test_each_refusal_is_named_by_doctor(configs: dict[str, Path]) -> None:
    found = doctor(configs, REFUSALS)
    for refusal, (_, _, words) in REFUSALS.items():
        code, finding = found[refusal]
        assert code != 0 and finding["status"] == "failed", (refusal, code, finding)
        assert words in finding["detail"], (refusal, finding)
        assert kafka_settings(configs[refusal]).bootstrap_servers in finding["where"], (refusal, finding)


def test_the_msk_iam_classes_rendered_are_in_the_bundled_jar() -> None:
    """AWS_MSK_IAM is rendered only (no MSK here: tests/test_kafka_options.py): the login module and callback handler
    its JAAS line names are in the aws-msk-iam-auth jar the EMR bundle ships (pipelines/deploy/package.py)."""
    jar = zipfile.ZipFile(_msk_iam_jar())
    for name in (MSK_IAM_LOGIN, MSK_IAM_CALLBACK):
        assert f"{name.replace('.', '/')}.class" in jar.namelist(), name
