"""The secrets a job needs, resolved where the job starts and handed to the code that uses them.

The erasure key is the one today: the secret of the pseudonymising hash (pipelines.lake.erasure_registry).
A secret is never a value in a file of the project or an argument on a command line (both are visible:
in git, in `ps`, in the EMR console); it comes from the environment, a file outside the lake, or AWS
Secrets Manager.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from pipelines.errors import SecretError
from pipelines.runtime.settings import erasure_key_file


def erasure_key(key_file: Path | None = None) -> str:
    """The secret of the pseudonymising hash, from the first of:

    - LAKEHOUSE_ERASURE_KEY: the key itself;
    - LAKEHOUSE_ERASURE_KEY_SECRET: an AWS Secrets Manager secret (name or ARN) holding it.
      This is how EMR jobs get it: a step's driver runs on any node of the cluster, where a
      key file would not be, and step arguments are visible in the EMR console;
    - a key file (LAKEHOUSE_ERASURE_KEY_FILE), made on first use.

    Every job that hashes (ingest, etl, erasure) must see the same key: with another one,
    the registry no longer recognises erased customers.
    """
    if key := os.environ.get("LAKEHOUSE_ERASURE_KEY"):
        return key
    if secret := os.environ.get("LAKEHOUSE_ERASURE_KEY_SECRET"):
        return _secret_value(secret)
    path = key_file or erasure_key_file()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32))
    return path.read_text().strip()


def secrets_manager_value(secret: str, named: str | None = None) -> str:
    """The string of an AWS Secrets Manager secret (a name or an ARN), never made here: every job must find the same
    one. SecretError names it as `named` (default: the secret's id) and says why it cannot be read."""
    import boto3

    named = named or f"AWS Secrets Manager secret {secret}"
    # An ARN names its region; a name uses the environment's (AWS_REGION, the profile).
    region = secret.split(":")[3] if secret.startswith("arn:") and secret.count(":") >= 6 else None
    try:
        value = boto3.client("secretsmanager", region_name=region).get_secret_value(SecretId=secret)
    except Exception as exc:
        raise SecretError(f"{named}: cannot read it from AWS Secrets Manager ({type(exc).__name__}: {exc})") from exc
    return (value.get("SecretString") or "").strip()


def _secret_value(secret: str) -> str:
    """The erasure key from AWS Secrets Manager, long enough to key the hash."""
    named = f"LAKEHOUSE_ERASURE_KEY_SECRET={secret}"
    return checked_erasure_key(secrets_manager_value(secret, named), named)


def checked_erasure_key(key: str, named: str) -> str:
    """`key` if it is long enough to key the hash; SecretError naming where it came from (`named`) otherwise."""
    if len(key) < 32:
        raise SecretError(f"{named}: the secret's string is {len(key)} characters; the erasure key must be at "
                          "least 32 (e.g. `openssl rand -hex 32`)")
    return key
