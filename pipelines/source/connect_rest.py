"""Kafka Connect's REST API as `[connect]` reaches it (pipelines.runtime.config.ConnectSettings): basic
authentication from `username` and the revealed `password`, https verified against `ssl_ca_file` (else the
system's CAs).

Standard library only (urllib): the connector watchdog's Airflow worker imports it without the project's other
dependencies. The `Authorization` header is built for each request and never kept, logged or put in a message;
a 401 or 403 says which URL refused and which settings to check.
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.errors import ConnectError

if TYPE_CHECKING:
    from pipelines.runtime.config import ConnectSettings, Secret


@dataclass(frozen=True)
class ConnectClient:
    """One Connect cluster's REST API: `url` (http:// or https://), optional basic authentication."""

    url: str
    username: str | None = None
    password: Secret | None = field(default=None, repr=False)
    ssl_ca_file: Path | None = None
    timeout: float = 30.0

    @classmethod
    def from_settings(cls, settings: ConnectSettings, url: str | None = None, timeout: float = 30.0) -> ConnectClient:
        """The client of `[connect]` (its Airflow Connection's endpoint, read now, when it names one), at `url` instead
        of the section's when given (a command's flag)."""
        settings = settings.endpoint()
        return cls((url or settings.url).rstrip("/"), settings.username, settings.password, settings.ssl_ca_file,
                   timeout)

    def connector_path(self, name: str, *parts: str) -> str:
        """`/connectors/<name>/<parts>`, the name quoted."""
        return "/".join([f"/connectors/{urllib.parse.quote(name, safe='')}", *parts])

    def _headers(self, with_body: bool) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if with_body:
            headers["Content-Type"] = "application/json"
        if self.username is not None and self.password is not None:
            pair = f"{self.username}:{self.password.reveal()}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
        return headers

    def _context(self) -> ssl.SSLContext | None:
        if not self.url.startswith("https://"):
            return None
        return ssl.create_default_context(cafile=str(self.ssl_ca_file) if self.ssl_ca_file else None)

    def call(self, path: str, method: str = "GET", body: Any = None, timeout: float | None = None, *,
             missing: Any = ConnectError) -> Any:
        """The JSON answer of `method path` ({} for an empty body); ConnectError naming the URL and why. `missing`:
        what a 404 gives instead of the error, when given."""
        url = f"{self.url}{path}"
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(url, data=data, method=method, headers=self._headers(data is not None))
        try:
            with urllib.request.urlopen(request, timeout=timeout or self.timeout, context=self._context()) as answer:
                raw = answer.read()
        except urllib.error.HTTPError as exc:
            if exc.code == 404 and missing is not ConnectError:
                return missing
            detail = exc.read().decode(errors="replace")[:500]
            if exc.code in (401, 403):
                who = f"as {self.username!r}" if self.username else "without credentials"
                raise ConnectError(f"Kafka Connect refused {method} {url} {who} (HTTP {exc.code}): check [connect] "
                                   "username/password") from None
            raise ConnectError(f"Kafka Connect answered {exc.code} to {method} {url}: {detail}") from None
        except ssl.SSLError as exc:
            raise ConnectError(f"Kafka Connect at {url}: TLS failed ({exc.reason}); check [connect] ssl_ca_file") \
                from None
        except (urllib.error.URLError, OSError) as exc:
            raise ConnectError(f"Kafka Connect does not answer at {url}: {exc}") from None
        return json.loads(raw) if raw else {}

    def exists(self, name: str) -> bool:
        """Whether Connect runs a connector of that name (a 404 is no)."""
        return self.call(self.connector_path(name), missing=None) is not None

    def config(self, name: str) -> dict[str, str]:
        """The connector's config (`GET /connectors/<name>/config`), its `name` included."""
        return dict(self.call(self.connector_path(name, "config")))

    def put_config(self, name: str, config: dict[str, str]) -> Any:
        """Replace the connector's config (`PUT /connectors/<name>/config`): its task restarts with it."""
        return self.call(self.connector_path(name, "config"), "PUT", {k: v for k, v in config.items() if k != "name"})

    def status(self, name: str, timeout: float | None = None) -> dict[str, Any]:
        """The connector's and its tasks' states (`GET /connectors/<name>/status`)."""
        return dict(self.call(self.connector_path(name, "status"), timeout=timeout))

    def restart(self, name: str, *, only_failed: bool = True) -> Any:
        """Restart the connector and its tasks (only the failed ones: Connect's `onlyFailed`, KIP-745)."""
        query = f"?includeTasks=true&onlyFailed={str(only_failed).lower()}"
        return self.call(self.connector_path(name, "restart") + query, "POST")
