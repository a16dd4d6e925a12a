"""A psycopg 3 connection to the source database of `[source]` (pipelines.runtime.config.SourceSettings).

The password is revealed only into the connect call, as its own keyword: never into a DSN string, which a
traceback, a log line or `repr` could show. A failure becomes one `SourceUnavailable` naming
`user@host:port/database` and what failed, in words an operator acts on (the password, the certificate, the
address, the database's name), with libpq's own first line after it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from pipelines.errors import SourceSyncError, SourceUnavailable

if TYPE_CHECKING:
    import psycopg

    from pipelines.runtime.config import SourceSettings

APPLICATION_NAME = "lakehouse-source"

# libpq's messages (PostgreSQL 12-17) and what each means for the operator; the first that matches wins.
_REASONS = (
    ("password authentication failed", "wrong password (check [source] user/password)"),
    ("no password supplied", "the server asks for a password and [source] password is not set"),
    ("certificate verify failed", "the server's certificate did not verify against [source] sslrootcert "
                                  "(wrong CA file, or sslmode verify-full and a host name the certificate lacks)"),
    ("does not match host name", "the server's certificate does not name this host (sslmode verify-full): "
                                 "connect by the name it carries, or use sslmode verify-ca"),
    ("root certificate file", "[source] sslrootcert cannot be read"),
    ("server does not support ssl", "the server does not offer TLS and [source] sslmode requires it"),
    ("connection refused", "connection refused: nothing listens there (host, port, a security group?)"),
    ("timeout expired", "no answer within the connect timeout (host, port, a firewall?)"),
    ("could not translate host name", "the host name does not resolve"),
    ("does not exist", "no such database or user (check [source] database and user)"),
    ("no pg_hba.conf entry", "the server's pg_hba.conf admits no such login from here (user, database, TLS)"),
)


def where(settings: SourceSettings) -> str:
    """`user@host:port/database`: how messages name the source (never with the password); its Airflow Connection's
    id when the endpoint is one not read yet."""
    if settings.airflow_connection is not None:
        return f"Airflow Connection {settings.airflow_connection}"
    return f"{settings.user}@{settings.host}:{settings.port}/{settings.database}"


def connect_options(settings: SourceSettings, *, timeout: float = 10.0) -> dict[str, Any]:
    """psycopg.connect's keywords for `settings` (its Airflow Connection's endpoint, when it names one), the password
    revealed now (a keyword, not a DSN)."""
    settings = settings.endpoint()
    options: dict[str, Any] = {"host": settings.host, "port": settings.port, "dbname": settings.database,
                               "user": settings.user, "sslmode": settings.sslmode,
                               "connect_timeout": max(1, int(timeout)), "application_name": APPLICATION_NAME}
    if settings.sslrootcert is not None:
        options["sslrootcert"] = str(settings.sslrootcert)
    if settings.password is not None:
        options["password"] = settings.password.reveal()
    return options


def reason(message: str) -> str:
    """What a libpq error message means, in the operator's words (its own first line when none fits)."""
    lowered = message.lower()
    for needle, meaning in _REASONS:
        if needle in lowered:
            return meaning
    return "the connection failed"


@contextmanager
def answering(settings: SourceSettings, doing: str) -> Iterator[None]:
    """PostgreSQL's refusal of a statement as a SourceSyncError naming the database, what was being done and, for a
    missing privilege, which privileges the sync needs."""
    import psycopg

    try:
        yield
    except psycopg.Error as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        privilege = isinstance(exc, psycopg.errors.InsufficientPrivilege) or "must be owner" in first
        hint = (f"; the [source] user {settings.user} lacks a privilege (docs/tables.md, \"The privileges it "
                "needs\")") if privilege else ""
        raise SourceSyncError(f"PostgreSQL {where(settings)} refused {doing}: {first}{hint}") from exc


def connect(settings: SourceSettings, *, timeout: float = 10.0, autocommit: bool = True) -> psycopg.Connection:
    """An open connection to the source database (autocommit: each statement of the sync stands alone);
    SourceUnavailable naming the database and what failed."""
    import psycopg

    settings = settings.endpoint()
    options = connect_options(settings, timeout=timeout)
    secret = options.get("password")
    try:
        return psycopg.connect(autocommit=autocommit, **options)
    except psycopg.Error as exc:
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0].strip()
        if secret:
            detail = detail.replace(secret, "***")
        raise SourceUnavailable(f"PostgreSQL {where(settings)} (sslmode {settings.sslmode}): {reason(str(exc))}; "
                                f"libpq: {detail}") from None
