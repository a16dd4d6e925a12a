"""A certificate authority of the local stack's own, and the certificates it signs: what the secured broker
(lakehouse_dev.kafka_local, `secure_port`) serves, and what its clients trust (`ca.pem`).

Made once per state folder with trustme (python-trio/trustme), kept there, never committed: a test that
needs a CA nobody trusts makes a second one.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from pathlib import Path

from pipelines.runtime.local_process import HOST


@dataclass(frozen=True)
class LocalTls:
    """The files of one folder's CA: its certificate, and a server's key and certificate chain in one PEM file
    (the form Kafka's PEM key store takes)."""

    folder: Path

    @property
    def ca_file(self) -> Path:
        return self.folder / "ca.pem"

    @property
    def server_pem(self) -> Path:
        return self.folder / "server.pem"

    def ensure(self) -> LocalTls:
        """Make the CA and a certificate for 127.0.0.1 and localhost, unless the folder has them."""
        if self.ca_file.exists() and self.server_pem.exists():
            return self
        # Here, not at the top: Airflow's environment imports the dev tools without their dependencies.
        import trustme
        from cryptography.hazmat.primitives import serialization

        self.folder.mkdir(parents=True, exist_ok=True)
        ca = trustme.CA(organization_name="lakehouse local stack")
        server = ca.issue_cert(HOST, "localhost")
        ca.cert_pem.write_to_path(str(self.ca_file))
        # Kafka's PEM key store reads a PKCS#8 key only; trustme writes the EC key in SEC1's form.
        key = serialization.load_pem_private_key(server.private_key_pem.bytes(), password=None)
        with self.server_pem.open("wb") as out:
            out.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption()))
            for blob in server.cert_chain_pems:
                out.write(blob.bytes())
        self.server_pem.chmod(0o600)
        return self


def secret_file(path: Path) -> str:
    """The secret in `path`, made on first use (32 random bytes as hex), readable by its owner alone."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(secrets.token_hex(32))
        path.chmod(0o600)
    return path.read_text().strip()
