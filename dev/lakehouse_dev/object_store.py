"""A local S3-compatible object store on 127.0.0.1 with the bucket `lake`: `make s3-up`, the tests on s3://.

The store is moto's S3 API served alone (`serve` below; moto from PyPI, installed by `make
setup` with the dev extras), not S3Proxy: it needs no Maven artifact of its own and no JVM
beside Spark's, and the project already uses moto for its AWS mocks (S3Proxy 2.6.0, tried,
also refuses the checksum headers current boto3 sends on PutObject: NotImplemented). The
cost: moto keeps the objects in its process (it spills large ones to temporary files), so a
store's content lives as long as its process: `make s3-down` drops the lake on it. Only its
pid, port and log sit in its folder (`.s3/` for `make s3-up`, git-ignored).

Clients reach it through the standard AWS variables (`lakehouse dev s3 env` prints them):
Spark through S3A (hudi_configs/spark.toml [local]), hudi-rs and pyarrow.fs through the
same variables (pipelines/lake/storage.py).
"""

from __future__ import annotations

import contextlib
import json
import random
import signal
import sys
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self
from urllib.parse import parse_qs

import click

from pipelines.runtime.commands import echo_json
from pipelines.runtime.local_process import HOST, LocalProcess
from pipelines.runtime.settings import PROJECT_ROOT

DEFAULT_PORT = 9000
BUCKET = "lake"
# moto accepts any credentials; S3A and the AWS SDKs refuse to sign without some.
ACCESS_KEY = "lakehouse"
SECRET_KEY = "lakehouse-local"
REGION = "us-east-1"
DEFAULT_DIR = PROJECT_ROOT / ".s3"


@dataclass
class ObjectStore(LocalProcess):
    """One moto server, found again through `<data_dir>/server.pid` and `server.port`.

    `port` 0 lets the server bind any free port; `start` then reads back the one it got.
    """

    label = "the object store"
    stop_timeout = 20.0

    data_dir: Path
    port: int = DEFAULT_PORT

    def __post_init__(self) -> None:
        # Absolute: the server, started elsewhere, is told where to write its port.
        self.data_dir = Path(self.data_dir).resolve()

    @property
    def endpoint(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid_path(self) -> Path:
        return self.data_dir / "server.pid"

    @property
    def port_path(self) -> Path:
        return self.data_dir / "server.port"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "server.log"

    @property
    def marker(self) -> str:
        return "lakehouse_dev.object_store"

    def env(self) -> dict[str, str]:
        """The standard AWS variables every client of the store reads (S3A, boto3, pyarrow, hudi-rs)."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": REGION}

    def command(self) -> list[str]:
        return [sys.executable, "-m", "lakehouse_dev.object_store", HOST, str(self.port), str(self.port_path)]

    def prepare(self, log_start: int) -> None:
        # The server writes the port it bound (port 0: the one the kernel gave it), so a test
        # never races another process for a port chosen free beforehand.
        self.port_path.unlink(missing_ok=True)

    def adopt(self, pid: int) -> None:
        self.port = int(self.port_path.read_text())

    def unready(self, pid: int, deadline: float) -> str | None:
        if not self.port_path.exists():
            return f"not listening yet (port {self.port})"
        self.port = int(self.port_path.read_text())
        try:
            urllib.request.urlopen(self.endpoint, timeout=2).close()  # ListBuckets
        except urllib.error.HTTPError:
            pass  # an answer, if a refusal: the server is up
        except (urllib.error.URLError, OSError):
            return f"no answer on {self.endpoint}"
        return None

    def slow_down(self, fraction: float) -> dict[str, int]:
        """From now on, answer `fraction` of requests (drawn at random) with S3's `503 SlowDown`; 0 stops it.

        Returns the store's counts since it started: `requests` served and `slow_down` answered so.
        """
        request = urllib.request.Request(f"{self.endpoint}{FAULTS_PATH}?slow_down={fraction}", method="PUT")
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def start(self, timeout: float | None = None) -> Self:
        """Start the server (unless this folder's already runs) and create the bucket; idempotent."""
        super().start(timeout)
        import boto3  # here, not at the top: every `lakehouse` command imports this module

        s3 = boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=ACCESS_KEY,
                          aws_secret_access_key=SECRET_KEY, region_name=REGION)
        with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
            s3.create_bucket(Bucket=BUCKET)
        return self


def running(data_dir: Path) -> ObjectStore | None:
    """The store started from `data_dir`, if it runs."""
    store = ObjectStore(data_dir)
    if (pid := store.pid()) is None:
        return None
    store.adopt(pid)
    return store


_DATA_DIR = click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_DIR,
                         show_default=True, help="Folder of the server's pid, port and log.")


@click.group("s3")
def s3() -> None:
    """The local S3-compatible object store (moto server) with the bucket `lake`."""


@s3.command()
@click.option("--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT, show_default=True,
              help="Port on 127.0.0.1 (0: any free port, printed).")
@_DATA_DIR
def start(port: int, data_dir: Path) -> None:
    """Start the store (if not running) and create the bucket `lake`."""
    store = ObjectStore(data_dir, port).start()
    click.echo(f"object store on {store.endpoint}, bucket {BUCKET}; `eval \"$(.venv/bin/lakehouse dev s3 env)\"`, "
               f"then LAKEHOUSE_ROOT=s3://{BUCKET}/<prefix>")


@s3.command()
@_DATA_DIR
def stop(data_dir: Path) -> None:
    """Stop the store; what it held is gone."""
    ObjectStore(data_dir).stop()


@s3.command()
@_DATA_DIR
@click.option("--json", "as_json", is_flag=True, help="The variables as one JSON object instead of `export` lines.")
def env(data_dir: Path, as_json: bool) -> None:
    """Print `export` lines of the AWS variables that point every client at the store (for `eval`).

    Exit 1 if no store runs from --data-dir.
    """
    if (store := running(data_dir)) is None:
        raise click.ClickException(f"no object store runs from {data_dir}: `make s3-up` starts one")
    if as_json:
        echo_json(store.env())
        return
    for key, value in store.env().items():
        click.echo(f"export {key}={value}")


# No bucket can be named so (bucket names have no underscore): the store's own control path.
FAULTS_PATH = "/_faults"
SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message></Error>")


class SlowDown:
    """moto's application, answering a fraction of requests `503 SlowDown` as S3 does over a prefix's request rate.

    moto has no fault injection of its own (its `/moto-api` resets and seeds, nothing fails), and a
    proxy in front cannot answer HTTP for the store: this is the one way the store itself says it.
    `PUT /_faults?slow_down=F` sets the fraction (`ObjectStore.slow_down`; 0, as at the start, refuses none) and
    returns the counts so far, which say what rate of faults a job met.
    """

    def __init__(self, app: Any) -> None:
        self.app, self.fraction, self.rng = app, 0.0, random.Random(53)
        self.counts, self.lock = {"requests": 0, "slow_down": 0}, threading.Lock()  # the server is threaded

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("PATH_INFO") == FAULTS_PATH:
            self.fraction = float(parse_qs(environ.get("QUERY_STRING", "")).get("slow_down", ["0"])[0])
            body = json.dumps(self.counts).encode()
            start_response("200 OK", [("Content-Length", str(len(body)))])
            return [body]
        with self.lock:
            self.counts["requests"] += 1
            refused = bool(self.fraction) and self.rng.random() < self.fraction
            self.counts["slow_down"] += refused
        if refused:
            environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))  # the body, as a server reads it
            start_response("503 Slow Down", [("Content-Type", "application/xml"),
                                            ("Content-Length", str(len(SLOW_DOWN)))])
            return [SLOW_DOWN]
        return self.app(environ, start_response)


def serve(host: str, port: int, port_file: Path) -> None:
    """Serve moto's S3 API alone, the way `python -m moto.server` serves all of AWS.

    moto's all-services dispatcher finds the service of every request among some 180 by its
    host and signature, about 6 ms a request; a Hudi commit through S3A makes hundreds of
    requests, so that overhead would be a third of the object-store test's time
    (tests/test_object_store.py). The S3 application alone answers the same requests.
    `port` 0 binds any free port; the port bound is written to `port_file` (whole or not at all)
    once the socket listens, which is what `ObjectStore.start` waits for.
    """
    from moto.server import MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server = make_server(host, port, SlowDown(create_backend_app("s3")), threaded=True,
                         request_handler=MotoRequestHandler)
    partial = port_file.with_suffix(".tmp")
    partial.write_text(f"{server.port}\n")
    partial.replace(port_file)
    server.serve_forever()


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]))
