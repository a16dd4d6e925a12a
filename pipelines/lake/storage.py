"""Files under the lake root that are not Hudi tables, on a local path or an object store: one way, pyarrow.fs.

Erasure certificates, the audit log, Great Expectations' results and Data Docs, and the
erasure's file scan must live (and be found) where the lake lives: on EMR the driver's
local disk vanishes with the cluster. pyarrow.fs serves both kinds of root from Python
without a JVM (pyarrow is already a dependency, for hudi-rs), so the Airflow-side and
Spark-side code use the same calls. Hudi's own files go through Hudi (Hadoop's S3A, or
EMRFS on EMR); hudi-rs gets the same endpoint and credentials (`hudi_storage_options`).

An `s3://` or `s3a://` root is reached through the standard AWS variables: `AWS_ENDPOINT_URL`
(set for a local store: `lakehouse dev s3 env`), `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
`AWS_REGION`; unset, the AWS SDK's usual chain applies (an instance role on EMR).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlparse

from pyarrow import fs as pafs
from tenacity import retry, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from hudi_configs import section

S3_SCHEMES = ("s3", "s3a")
T = TypeVar("T")


def is_remote(uri: str) -> bool:
    return "://" in uri and urlparse(uri).scheme != "file"


def _s3() -> pafs.S3FileSystem:
    endpoint = os.environ.get("AWS_ENDPOINT_URL") or None
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None
    attempts = int(section("storage", "python_s3")["max_attempts"])
    return pafs.S3FileSystem(endpoint_override=endpoint, region=region,
                             retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=attempts),
                             scheme=urlparse(endpoint).scheme if endpoint else "https",
                             # A path-style endpoint (a local store) has no per-bucket host names.
                             force_virtual_addressing=False)


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """The file system of `uri` and the path on it (a local path is made absolute)."""
    if "://" not in uri:
        return pafs.LocalFileSystem(), os.path.abspath(uri)
    parsed = urlparse(uri)
    if parsed.scheme in S3_SCHEMES:
        return _s3(), f"{parsed.netloc}{parsed.path}".rstrip("/")
    return pafs.FileSystem.from_uri(uri)


def exists(uri: str) -> bool:
    fs, path = filesystem(uri)
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def modified(uri: str) -> float | None:
    """When the file was last written (epoch seconds), None when the store does not say."""
    fs, path = filesystem(uri)
    mtime = fs.get_file_info(path).mtime
    return mtime.timestamp() if mtime is not None else None


# The AWS SDK's error names for a request that may succeed when made again (aws-sdk-cpp's
# CoreErrors). INTERNAL_FAILURE is also what a `503 SlowDown` on a GetObject of a small file becomes:
# the SDK writes the error's body into the buffer pyarrow sized to the file, overflows it ("Failed to
# flush response stream") and does not retry. UNKNOWN: a 5xx the SDK has no name for.
_TRANSIENT_AWS = frozenset({"INTERNAL_FAILURE", "NETWORK_CONNECTION", "SERVICE_UNAVAILABLE", "SLOW_DOWN",
                            "THROTTLING", "REQUEST_TIMEOUT", "UNKNOWN"})
_AWS_ERROR = re.compile(r"AWS Error (\w+)")


def is_transient(error: BaseException) -> bool:
    """Whether a failed object-store read is worth making again: a network or server fault, never a
    missing object or a refusal (those are final)."""
    if not isinstance(error, OSError) or isinstance(error, FileNotFoundError | PermissionError):
        return False
    named = _AWS_ERROR.search(str(error))
    return named is not None and named.group(1) in _TRANSIENT_AWS


def _retried(call: Callable[[], T]) -> T:
    """`call` made again on a transient store fault, with backoff: the SDK's own retries miss some (_TRANSIENT_AWS)."""
    attempts = int(section("storage", "python_s3")["max_attempts"])
    return retry(retry=retry_if_exception(is_transient), stop=stop_after_attempt(attempts),
                 wait=wait_exponential_jitter(initial=0.1, max=5), reraise=True)(call)()


def read_bytes(uri: str) -> bytes:
    fs, path = filesystem(uri)

    def read() -> bytes:
        with fs.open_input_stream(path) as stream:
            return stream.read()

    return _retried(read) if is_remote(uri) else read()


def read_text(uri: str) -> str:
    return read_bytes(uri).decode()


def write_bytes(uri: str, data: bytes) -> None:
    """Write a whole file: readers see the old one or this one, never a part.

    A new object on a store is that already; a local file is written aside, then renamed (and the part
    written aside removed when the write fails: a full disk leaves the old file, whole, and nothing else).
    """
    fs, path = filesystem(uri)
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    target = path
    if isinstance(fs, pafs.LocalFileSystem):
        path = f"{target}.{os.getpid()}.tmp"
    try:
        with fs.open_output_stream(path) as stream:
            stream.write(data)
    except OSError:
        # A full disk (ENOSPC) cuts the write: the part written aside goes, or every failed heartbeat of
        # a stream on a full disk would leave a file nothing removes, holding the space back.
        if path != target:
            with contextlib.suppress(OSError):
                fs.delete_file(path)
        raise
    if path != target:
        fs.move(path, target)


def delete(uri: str) -> None:
    """Remove one file; nothing if it is not there."""
    fs, path = filesystem(uri)
    with contextlib.suppress(FileNotFoundError):
        fs.delete_file(path)


def write_text(uri: str, text: str) -> None:
    write_bytes(uri, text.encode())


def append_text(uri: str, text: str) -> None:
    """Append to a small file. Objects cannot be appended to: the file is read and written whole."""
    write_bytes(uri, (read_bytes(uri) if exists(uri) else b"") + text.encode())


def list_files(uri: str) -> list[str]:
    """Every file under `uri`, recursively, relative to it, sorted; [] if there is no such folder."""
    fs, path = filesystem(uri)
    selector = pafs.FileSelector(path, recursive=True, allow_not_found=True)
    prefix = path.rstrip("/") + "/"
    return sorted(i.path[len(prefix):] for i in fs.get_file_info(selector) if i.type == pafs.FileType.File)


def list_dir(uri: str) -> list[str]:
    """Names directly under `uri` (files and folders); [] if there is no such folder."""
    fs, path = filesystem(uri)
    return sorted(i.base_name for i in fs.get_file_info(pafs.FileSelector(path, allow_not_found=True)))


@contextlib.contextmanager
def local_copy(uri: str) -> Iterator[Path]:
    """A local folder holding what is under `uri`, for libraries that only write local files.

    A local `uri` is itself. A remote one is copied into a temporary folder, and on a clean
    exit the folder is copied back and what was removed from it is removed from the store.
    """
    if not is_remote(uri):
        Path(uri).mkdir(parents=True, exist_ok=True)
        yield Path(uri)
        return
    fs, path = filesystem(uri)
    local_fs = pafs.LocalFileSystem()
    with tempfile.TemporaryDirectory(prefix="lakehouse-store-") as tmp:
        before = list_files(uri)
        for rel in before:
            Path(tmp, rel).parent.mkdir(parents=True, exist_ok=True)
            _retried(partial(pafs.copy_files, f"{path}/{rel}", f"{tmp}/{rel}", source_filesystem=fs,
                             destination_filesystem=local_fs))
        yield Path(tmp)
        after = list_files(tmp)
        for rel in after:
            pafs.copy_files(f"{tmp}/{rel}", f"{path}/{rel}", source_filesystem=local_fs, destination_filesystem=fs)
        for rel in set(before) - set(after):
            fs.delete_file(f"{path}/{rel}")


def remove_tree(uri: str) -> None:
    """Remove a folder and everything under it; nothing if it is not there."""
    if not is_remote(uri):
        shutil.rmtree(uri, ignore_errors=True)
        return
    fs, path = filesystem(uri)
    with contextlib.suppress(FileNotFoundError):
        fs.delete_dir(path)


def hudi_storage_options(uri: str) -> dict[str, str]:
    """hudi-rs's storage options for a table at `uri`: the local store's endpoint over plain HTTP."""
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    if urlparse(uri).scheme not in S3_SCHEMES or not endpoint:
        return {}
    return {"aws_endpoint": endpoint, "aws_allow_http": str(endpoint.startswith("http://")).lower()}
