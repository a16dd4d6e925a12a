"""The lake's errors: one base, `LakehouseError`, and a kind for each failure a caller acts on differently.

An entry point catches `LakehouseError` and prints its message, which names what was wrong and where (the
file and field, the address that did not answer, the table); a caller that can recover (wait for Kafka,
leave the catalog sync for later, quarantine a request) catches its kind. A kind that used to be a builtin
error keeps that builtin as a second base, so an `except ValueError` or `except RuntimeError` written
against it still holds.
"""

from __future__ import annotations


class LakehouseError(Exception):
    """A failure of the lake that its message explains: what was wrong and where."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


# --------------------------------------------------------------------------- what the operator declared

class DeclarationError(LakehouseError, ValueError):
    """A declaration that cannot be used; the message names the file, the table and the field."""


class SettingError(LakehouseError, ValueError):
    """An environment variable or a TOML setting that cannot be used; the message names it and what it takes."""


class UnknownTable(LakehouseError, KeyError):
    """A table name the lake does not have; the message lists the names it has.

    A KeyError too, since a lookup by name raised one; `str` is the message, not KeyError's quoted key.
    """


class SetupError(LakehouseError, RuntimeError):
    """The machine lacks what the lake needs to run here (Java, pyspark, the resolved jars), or a setup step could not
    make it; the message says what."""


# --------------------------------------------------------------------------- the services the lake reads and writes

class KafkaUnavailable(LakehouseError, RuntimeError):
    """Kafka does not answer: no broker of the bootstrap list, or for longer than the stream waits for it."""


class SourceError(LakehouseError, RuntimeError):
    """The change-data source (the PostgreSQL database, Kafka Connect and its Debezium connector) failed or refused a
    request."""


class SourceUnavailable(SourceError):
    """The source database cannot be reached or refuses the login; the message names host:port/database and user,
    and what failed (never the password)."""


class ConnectError(SourceError):
    """Kafka Connect did not answer, refused a request, or the connector did not come back."""


class SourceSyncError(SourceError):
    """The source could not be made to follow the declaration; the message says which step and why."""


class DeclarationMismatch(SourceSyncError):
    """The declaration does not match the source database; one line per problem, nothing was changed."""


class StorageError(LakehouseError, ValueError):
    """The lake's storage does not hold what it should: no lake root, a timeline file cut short or in a format
    not read here, a commit that is missing; the message names the path."""


class CatalogUnavailable(LakehouseError, RuntimeError):
    """The catalog cannot be reached: the sync is left for later, the lake goes on."""


class QueryError(LakehouseError, ValueError):
    """A statement the catalog cannot answer as asked: an unknown table, a time it no longer holds."""


class PrometheusError(LakehouseError, RuntimeError):
    """Prometheus did not answer, or refused a query (with its reason)."""


class SecretError(LakehouseError, RuntimeError):
    """A secret the lake needs cannot be read, or is not what it must be; the message names the secret."""


# --------------------------------------------------------------------------- processes the lake starts

class StreamError(LakehouseError, RuntimeError):
    """The stream could not be started or stopped, or the action is unknown; the message says why."""


class AnotherStreamRunning(StreamError):
    """Another ingest stream holds this lake's checkpoint: two writers would corrupt it."""


class RecordsLost(StreamError):
    """Kafka no longer holds records a table has not read: the stream stops rather than skip them.

    A stored position below its partition's log start offset (retention, or a delete-records request, removed
    records the stream never read), or above its end (the topic was recreated or truncated: offsets the lake
    applied no longer exist). The message names every such partition with the lost range and its table, and the
    way back (`lakehouse reconcile --table T --heal`); `tables` names the tables.
    """

    def __init__(self, message: str, *, tables: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.tables = tables


class ProcessError(LakehouseError, RuntimeError):
    """A local background process did not start, did not become ready, or did not stop; the message says which."""


class StartFailed(LakehouseError):
    """A local process will never serve (a failed task, a fatal error): waiting longer cannot help."""


# --------------------------------------------------------------------------- erasure

class ErasureError(LakehouseError, ValueError):
    """An erasure that cannot run as asked: no request, a declared table it does not cover, references repeated."""


class InvalidRequest(ErasureError):
    """The request cannot run as given; the message lists every problem."""


# --------------------------------------------------------------------------- writes

class ReconcileError(LakehouseError, RuntimeError):
    """A table that cannot be reconciled (no such source table, a key that cannot be compared, no bronze commit);
    the message names the table and why."""


class WriteFailed(LakehouseError, RuntimeError):
    """A Hudi commit recorded records it failed to write (`totalWriteErrors` of its write stats), and was rolled back.

    Hudi's bulk insert through its row writer catches a record that fails to write, commits the others, and says
    so only in the commit's metadata: without this error the batch would look whole and miss those records. The
    attributes say which table (`table`, its path), which commit (`instant`), how many records (`errors`) and in
    which files (`files`: partition and file name, errors there).
    """

    def __init__(self, message: str, *, table: str, instant: str, errors: int,
                 files: tuple[tuple[str, str, int], ...] = ()) -> None:
        super().__init__(message)
        self.table, self.instant, self.errors, self.files = table, instant, errors, files
