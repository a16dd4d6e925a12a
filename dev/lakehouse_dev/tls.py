"""A certificate authority of the local stack's own, and the certificates it signs: what the secured broker
(lakehouse_dev.kafka_local, `secure_port`, `mtls_port`) and the secure real source's PostgreSQL
(lakehouse_dev.pg_source) serve, what their clients trust (`ca.pem`), and the client certificate the broker's
mutual-TLS listener takes (`client.crt`, `client.key`).

Made once per state folder with trustme (python-trio/trustme), kept there, never committed: a test that
needs a CA nobody trusts makes a second one.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.runtime.local_process import HOST

# The client certificate's subject (CN): the principal the broker's mutual-TLS listener sees.
CLIENT_NAME = "lakehouse-client"


@dataclass(frozen=True)
class LocalTls:
    """The files of one folder's CA: its certificate, a server's key and certificate chain, both in one PEM
    file (the form Kafka's PEM key store takes) and in two (the form PostgreSQL's `ssl_key_file` and
    `ssl_cert_file` take), and a client's key and certificate chain (CLIENT_NAME, for mutual TLS: `[kafka]
    ssl_cert_file`, `ssl_key_file`). The CA's own key is never kept: one folder's certificates are all made at
    once, and made again, the CA with them, when one of them is missing."""

    folder: Path

    @property
    def ca_file(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def server_pem(self) -> Path:
        return self.folder / "server.pem"

    @property
    def server_cert(self) -> Path:
        return self.folder / "server.crt"

    @property
    def server_key(self) -> Path:
        return self.folder / "server.key"

    @property
    def client_cert(self) -> Path:
        return self.folder / "client.crt"

    @property
    def client_key(self) -> Path:
        return self.folder / "client.key"

    def ensure(self) -> LocalTls:
        """Make the CA, a server certificate for 127.0.0.1 and localhost and a client certificate, unless the folder
        has them all."""
        files = (self.ca_file, self.server_pem, self.server_cert, self.server_key, self.client_cert, self.client_key)
        if all(p.exists() for p in files):
            return self
        # Here, not at the top: Airflow's environment imports the dev tools without their dependencies.
        import trustme

        self.folder.mkdir(parents=True, exist_ok=True)
        ca = trustme.CA(organization_name="lakehouse local stack")
        server = ca.issue_cert(HOST, "localhost")
        # trustme's certificates are for client authentication too (their extended key usage says so).
        client = ca.issue_cert(CLIENT_NAME, common_name=CLIENT_NAME)
        ca.cert_pem.write_to_path(str(self.ca_file))
        key_pem, chain = _pkcs8(server)
        for path, blob in ((self.server_pem, key_pem + chain), (self.server_key, key_pem)):
            private_file(path, blob.decode("ascii"))
        self.server_cert.write_bytes(chain)
        client_key, client_chain = _pkcs8(client)
        private_file(self.client_key, client_key.decode("ascii"))
        self.client_cert.write_bytes(client_chain)
        return self


def _pkcs8(issued: Any) -> tuple[bytes, bytes]:
    """A trustme certificate's key in PKCS#8 (Kafka's PEM key store reads no other form; trustme writes the EC key
    in SEC1's) and its chain, both PEM."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(issued.private_key_pem.bytes(), password=None)
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return key_pem, b"".join(blob.bytes() for blob in issued.cert_chain_pems)


def secret_file(path: Path) -> str:
    """The secret in `path`, made on first use (32 random bytes as hex), readable by its owner alone."""
    if not path.exists():
        private_file(path, secrets.token_hex(32))
    return path.read_text().strip()


def private_file(path: Path, text: str) -> Path:
    """`path` with `text`, readable by its owner alone from before the text is in it (a file holding a secret)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text(text)
    return path


def scram_sha_256(password: str, iterations: int = 4096) -> str:
    """PostgreSQL's stored form of `password` for scram-sha-256 (RFC 5802, 7677): what `ALTER ROLE ... PASSWORD`
    and initdb's `--pwfile` take instead of the password, so that the password itself never reaches the server.

    An ASCII password (secret_file's hex) needs no SASLprep.
    """
    salt = secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    server_key = hmac.digest(salted, b"Server Key", "sha256")
    stored_key = hashlib.sha256(client_key).digest()
    salt64, stored64, server64 = (base64.b64encode(raw).decode() for raw in (salt, stored_key, server_key))
    return f"SCRAM-SHA-256${iterations}:{salt64}${stored64}:{server64}"
