"""How every client of the project reaches Kafka: the options of kafka-python's clients and of Spark's Kafka source,
both from the one `[kafka]` section (pipelines.runtime.config), so that the stream, the probes, the erasure's
tombstones and the replay of dead letters authenticate alike.

A password is revealed when the options are made, and only into them: not into a log, an argument or the
environment. Spark masks the JAAS line and a client key wherever it shows a source's options
(`spark.sql.redaction.options.regex`, hudi_configs/spark.toml).
"""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
from collections.abc import Callable, Iterable
from typing import Any

from pipelines.errors import KafkaUnavailable
from pipelines.runtime.config import KafkaSettings

_JAAS = {"PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
         "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
         "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule"}
MSK_IAM_LOGIN = "software.amazon.msk.auth.iam.IAMLoginModule"
MSK_IAM_CALLBACK = "software.amazon.msk.auth.iam.IAMClientCallbackHandler"


def at(kafka: KafkaSettings, bootstrap: str | None) -> KafkaSettings:
    """`kafka` at the brokers `bootstrap` (a command's --bootstrap), with the same authentication; None: as it is."""
    return kafka if bootstrap is None else kafka.model_copy(update={"bootstrap_servers": bootstrap})


def connect_json(document: Any) -> bytes:
    """`document` as Kafka Connect's JsonConverter writes a schemaless key: compact, UTF-8, non-ASCII unescaped.

    A record the project writes to a source topic (an erasure's tombstone, a heal's delete) must carry the very key
    bytes Debezium's records carry: log compaction keeps one record per key *bytes*, and the default partitioner
    picks the partition from them, so `{"id": 5}` neither lands beside nor compacts away Debezium's `{"id":5}`.
    """
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()


def python_options(kafka: KafkaSettings) -> dict[str, Any]:
    """kafka-python's options (KafkaConsumer, KafkaProducer, KafkaAdminClient) for `kafka`."""
    options: dict[str, Any] = {"bootstrap_servers": kafka.bootstrap_servers,
                               "security_protocol": kafka.security_protocol}
    if kafka.sasl_mechanism is not None:
        options["sasl_mechanism"] = kafka.sasl_mechanism
    if kafka.sasl_username is not None and kafka.sasl_password is not None:
        options |= {"sasl_plain_username": kafka.sasl_username, "sasl_plain_password": kafka.sasl_password.reveal()}
    if kafka.security_protocol in ("SSL", "SASL_SSL"):
        options["ssl_check_hostname"] = kafka.ssl_check_hostname
        for key, path in (("ssl_cafile", kafka.ssl_ca_file), ("ssl_certfile", kafka.ssl_cert_file),
                          ("ssl_keyfile", kafka.ssl_key_file)):
            if path is not None:
                options[key] = str(path)
        if kafka.ssl_key_password is not None:
            options["ssl_password"] = kafka.ssl_key_password.reveal()
    return options


def spark_options(kafka: KafkaSettings) -> dict[str, str]:
    """Spark's Kafka source options for `kafka`: the Java client's properties, `kafka.`-prefixed."""
    return {f"kafka.{key}": value for key, value in java_properties(kafka).items()}


def java_properties(kafka: KafkaSettings) -> dict[str, str]:
    """The Java Kafka client's properties for `kafka` (Spark's source, Kafka Connect's worker): the same brokers
    and authentication as `python_options`, in the Java client's words (PEM for TLS, a JAAS line for SASL).

    The CA and a client certificate go in as PEM text rather than a file's location: Spark's executors on a
    cluster get the options, not the driver's files. spark.toml's `spark.sql.redaction.options.regex` masks the
    client's key, and the JAAS line, wherever Spark shows a source's options. PEM text spans lines: a Java
    properties file holding these needs them escaped (dev/lakehouse_dev/connect_config.py, `properties_text`).
    """
    options = {"bootstrap.servers": kafka.bootstrap_servers, "security.protocol": kafka.security_protocol}
    if kafka.sasl_mechanism == "AWS_MSK_IAM":
        options |= {"sasl.mechanism": "AWS_MSK_IAM", "sasl.jaas.config": f"{MSK_IAM_LOGIN} required;",
                    "sasl.client.callback.handler.class": MSK_IAM_CALLBACK}
    elif kafka.sasl_mechanism is not None:
        assert kafka.sasl_username is not None and kafka.sasl_password is not None  # the model requires both
        options |= {"sasl.mechanism": kafka.sasl_mechanism,
                    "sasl.jaas.config": f'{_JAAS[kafka.sasl_mechanism]} required '
                                        f'username="{_quoted(kafka.sasl_username)}" '
                                        f'password="{_quoted(kafka.sasl_password.reveal())}";'}
    if kafka.security_protocol in ("SSL", "SASL_SSL"):
        if not kafka.ssl_check_hostname:
            options["ssl.endpoint.identification.algorithm"] = ""
        if kafka.ssl_ca_file is not None:
            options |= {"ssl.truststore.type": "PEM", "ssl.truststore.certificates": kafka.ssl_ca_file.read_text()}
        if kafka.ssl_cert_file is not None and kafka.ssl_key_file is not None:
            options |= {"ssl.keystore.type": "PEM", "ssl.keystore.certificate.chain": kafka.ssl_cert_file.read_text(),
                        "ssl.keystore.key": kafka.ssl_key_file.read_text()}
            if kafka.ssl_key_password is not None:
                options["ssl.key.password"] = kafka.ssl_key_password.reveal()
    return options


def _quoted(value: str) -> str:
    """A value inside a JAAS line's double quotes."""
    return value.replace("\\", "\\\\").replace('"', '\\"')


def probe_tls(kafka: KafkaSettings) -> ssl.SSLContext | None:
    """The TLS of a probe of the brokers (pipelines.runtime.local_process.kafka_unanswered), None for a plaintext
    listener. A broker answers ApiVersions before SASL authenticates, so the probe needs TLS alone."""
    if kafka.security_protocol not in ("SSL", "SASL_SSL"):
        return None
    context = ssl.create_default_context(cafile=str(kafka.ssl_ca_file) if kafka.ssl_ca_file else None)
    context.check_hostname = kafka.ssl_check_hostname
    if kafka.ssl_cert_file is not None and kafka.ssl_key_file is not None:
        password = kafka.ssl_key_password.reveal() if kafka.ssl_key_password is not None else None
        context.load_cert_chain(str(kafka.ssl_cert_file), str(kafka.ssl_key_file), password)
    return context


def described(kafka: KafkaSettings) -> str:
    """The brokers and how they are reached, as an error names them: never a secret."""
    how = kafka.security_protocol + (f"/{kafka.sasl_mechanism}" if kafka.sasl_mechanism else "")
    user = f" as {kafka.sasl_username}" if kafka.sasl_username else ""
    return f"Kafka at {kafka.bootstrap_servers} ({how}{user})"


def kafka_answer(kafka: KafkaSettings, *, timeout: float = 10.0,
                 topics: Iterable[str] = ()) -> tuple[str | None, list[str]]:
    """What a real client with `kafka`'s authentication meets (pipelines.runtime.kafka_probe, in a child
    process): why it could not bootstrap (None: it did), and which of `topics` it does not see."""
    from pipelines.runtime.kafka_probe import REFUSED
    from pipelines.runtime.local_process import HOST, port_open

    servers = [s.strip().rpartition(":") for s in kafka.bootstrap_servers.split(",")]
    if not any(port.isdigit() and port_open(int(port), host.strip("[]") or HOST, min(timeout, 3.0))
               for host, _, port in servers):
        return REFUSED, []  # at once: a client would retry until its timeout
    request = json.dumps({"options": python_options(kafka), "timeout_ms": int(timeout * 1000),
                          "topics": sorted(topics)})
    try:
        done = subprocess.run([sys.executable, "-m", "pipelines.runtime.kafka_probe"], input=request,
                              capture_output=True, text=True, timeout=timeout + 30, check=False)
    except subprocess.TimeoutExpired:
        return f"the probe did not finish within {timeout + 30:.0f} s", []
    if done.returncode != 0:
        return f"the probe failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}", []
    answer = json.loads(done.stdout)
    if not answer["ok"]:
        return _refined(kafka, answer["why"], timeout), []
    return None, answer["missing"]


def _refined(kafka: KafkaSettings, why: str, timeout: float) -> str:
    """`why` made exact where the client's log could not tell: a broker that closes the connections of a SASL
    login it refused sometimes logs only the disconnects. One request without SASL settles it: answered over
    the same TLS, the login was refused; answered over TLS by a listener this client spoke plaintext to, the
    listener wants TLS."""
    from pipelines.runtime.kafka_probe import (
        AUTHENTICATION_FAILED,
        CERTIFICATE_ALERTS,
        CLOSED,
        PLAINTEXT_TO_TLS,
        TIMED_OUT,
    )
    from pipelines.runtime.local_process import kafka_unanswered

    if why not in (CLOSED, TIMED_OUT):
        return why
    bootstrap, seconds = kafka.bootstrap_servers, min(timeout, 5.0)
    if kafka.security_protocol.startswith("SASL_") and kafka_unanswered(bootstrap, seconds, probe_tls(kafka)) is None:
        return AUTHENTICATION_FAILED
    if kafka.security_protocol in ("PLAINTEXT", "SASL_PLAINTEXT"):
        any_tls = ssl.create_default_context()
        any_tls.check_hostname, any_tls.verify_mode = False, ssl.CERT_NONE  # only: does it speak TLS at all?
        answer = kafka_unanswered(bootstrap, seconds, any_tls)
        # A mutual-TLS listener answers no client without a certificate, but its alert is TLS all the same.
        if answer is None or any(alert in answer for alert in CERTIFICATE_ALERTS):
            return PLAINTEXT_TO_TLS
    return why


def require_kafka(kafka: KafkaSettings, error: Callable[[str], Exception] = KafkaUnavailable,
                  timeout: float = 10.0) -> None:
    """Fail at once with a clear message, raised as `error`, when the brokers do not take this client.

    Spark's Kafka source and Kafka Connect would only log and retry for minutes instead, and say nothing of a
    wrong password or an untrusted certificate.
    """
    why, _ = kafka_answer(kafka, timeout=timeout)
    if why is not None:
        raise error(f"{described(kafka)}: {why}")
