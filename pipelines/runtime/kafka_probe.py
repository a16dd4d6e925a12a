"""Whether the brokers take this configuration's client, asked of a real client: `python -m
pipelines.runtime.kafka_probe` reads kafka-python's options as JSON on its standard input, bootstraps a client
with them, lists the topics, and prints what it met as JSON.

A child process, for two reasons: kafka-python 3.0 leaks its I/O thread when a client's bootstrap fails in its
constructor (a long-lived process probing a failing broker would collect them), and a client that hangs is
killed with its process. The options (a password among them) go through the pipe, never the command line or
the environment.

kafka-python's constructor says only "Unable to bootstrap" whatever the cause; the cause is in what its
connections log as they fail (an authentication the broker refused, a certificate the CA did not sign, a TLS
handshake the listener did not answer), so the probe keeps those lines and names the last one's cause.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

AUTHENTICATION_FAILED = ("authentication failed: the brokers refused the SASL username or password ([kafka] "
                         "sasl_username, sasl_password)")
PLAINTEXT_TO_TLS = "plaintext to a TLS listener ([kafka] security_protocol: SSL or SASL_SSL)"
CLOSED = ("the brokers closed every connection before answering: plaintext to a TLS listener, or SASL expected "
          "([kafka] security_protocol)")
REFUSED = "connection refused: nothing listens at that address ([kafka] bootstrap_servers)"
NO_CLIENT_CERTIFICATE = ("the brokers require a client certificate (mutual TLS) and this client presents none "
                         "([kafka] ssl_cert_file, ssl_key_file: a certificate and key signed by a CA the brokers "
                         "trust)")
CLIENT_CERTIFICATE_REFUSED = ("the brokers refused this client's certificate: not signed by a CA they trust, or "
                              "expired ([kafka] ssl_cert_file, ssl_key_file)")
# The TLS alerts of a listener that refused the client's certificate, or wanted one (TLS 1.2's and 1.3's).
CERTIFICATE_ALERTS = ("SSLV3_ALERT_BAD_CERTIFICATE", "TLSV13_ALERT_CERTIFICATE_REQUIRED",
                      "TLSV1_ALERT_UNKNOWN_CA", "SSLV3_ALERT_CERTIFICATE_UNKNOWN")
TIMED_OUT = "no answer within the timeout: a firewall or security group dropping the packets?"
# What a connection's failure says, and what a person does about it, the most telling first: a refused password
# is followed in the log by the disconnects it causes.
CAUSES = (
    ("SaslAuthenticationFailed", AUTHENTICATION_FAILED),
    ("CERTIFICATE_VERIFY_FAILED", "the brokers' certificate is not signed by a CA this client trusts "
                                  "([kafka] ssl_ca_file)"),
    ("Hostname mismatch", "the brokers' certificate does not name the host connected to ([kafka] "
                          "bootstrap_servers, ssl_check_hostname)"),
    ("WRONG_VERSION_NUMBER", "TLS to a listener that does not speak TLS ([kafka] security_protocol)"),
    ("UNEXPECTED_EOF_WHILE_READING", "TLS to a listener that does not speak TLS, or one that refused this "
                                     "client's certificate ([kafka] security_protocol, ssl_cert_file)"),
    ("UnsupportedSaslMechanism", "the brokers do not offer this SASL mechanism ([kafka] sasl_mechanism)"),
    ("IllegalSaslState", "the listener does not speak SASL ([kafka] security_protocol)"),
    ("Invalid frame length", PLAINTEXT_TO_TLS),
    ("socket disconnected", CLOSED),
    ("ECONNREFUSED", REFUSED),
    ("timed out", TIMED_OUT),
)


class _Failures(logging.Handler):
    """The failures kafka-python's connections log, in order."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def cause(lines: list[str], error: str, client_certificate: bool = False) -> str:
    """The cause of a failed bootstrap, in a person's words, from the connections' failures; `client_certificate`:
    whether this client presented one (what a listener's certificate alert then means)."""
    if any(alert in line for line in [*lines, error] for alert in CERTIFICATE_ALERTS):
        return CLIENT_CERTIFICATE_REFUSED if client_certificate else NO_CLIENT_CERTIFICATE
    for marker, words in CAUSES:
        if any(marker in line for line in [*lines, error]):
            return words
    return error


def probe(options: dict[str, Any], timeout_ms: int, topics: list[str]) -> dict[str, Any]:
    """What a client with `options` meets: {"ok": True, "missing": [topics not visible]} or {"ok": False, "why"}."""
    from kafka import KafkaAdminClient

    failures = _Failures()
    logging.getLogger("kafka").addHandler(failures)
    logging.getLogger("kafka").setLevel(logging.ERROR)
    logging.getLogger("kafka").propagate = False
    try:
        admin = KafkaAdminClient(**options, client_id="lakehouse-probe", bootstrap_timeout_ms=timeout_ms,
                                 request_timeout_ms=timeout_ms)
        try:
            visible = set(admin.list_topics())
        finally:
            admin.close()
    except Exception as exc:  # kafka-python's errors share no useful base: name the cause from its log
        why = cause(failures.lines, f"{type(exc).__name__}: {exc}", "ssl_certfile" in options)
        return {"ok": False, "why": why}
    # A topic the principal may not describe is not listed, as one that does not exist.
    return {"ok": True, "missing": sorted(set(topics) - visible)}


def main() -> None:
    request = json.load(sys.stdin)
    json.dump(probe(request["options"], int(request["timeout_ms"]), list(request.get("topics", ()))), sys.stdout)


if __name__ == "__main__":
    main()
