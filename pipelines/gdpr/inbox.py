"""Erasure requests waiting for the next erasure run (pure Python: the Airflow DAG files them).

Requests arrive one at a time (a form, a ticket) but an erasure's cost is mostly its purge
of every table it touches, so they are erased in batches: each request is filed here when
it is accepted, and the next `lakehouse gdpr erase --pending` takes every request waiting,
erases them in one run and writes one certificate each. A request leaves the inbox once
its erasure is verified; a run that fails or does not verify leaves it there for the next.
Runs must not overlap (the DAG's tasks share one pool slot): two would take the same requests.

The inbox holds customer ids, so it lives outside the lake root (LAKEHOUSE_GDPR_INBOX:
a folder, by default `.gdpr/requests` of the checkout, or an `s3://` prefix that Airflow's
workers and the EMR cluster both reach; read and written through pipelines.lake.storage), and a
request file is deleted, not kept, once erased: the certificate under `_gdpr/` is the lasting
record, with pseudonyms only.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

from pipelines.errors import InvalidRequest
from pipelines.gdpr.request import ErasureRequest, parse_request
from pipelines.lake import storage

SUFFIX = ".json"


@dataclass(frozen=True)
class Filed:
    """A request in the inbox, and where it is (to remove it once erased)."""

    request: ErasureRequest
    location: str
    # When it was filed (epoch seconds): how long it has waited is what the erasure-overdue alert watches.
    filed_at: float


def inbox() -> str:
    """LAKEHOUSE_GDPR_INBOX, or `.gdpr/requests` of the checkout (outside the lake, like the source state)."""
    from pipelines.runtime.settings import PROJECT_ROOT

    return (os.environ.get("LAKEHOUSE_GDPR_INBOX") or str(PROJECT_ROOT / ".gdpr" / "requests")).rstrip("/")


def _name(reference: str) -> str:
    return reference.replace("/", "_") + SUFFIX


def _document(request: ErasureRequest, filed_at: float) -> str:
    return json.dumps({"customer_ids": list(request.customer_ids), "reference": request.reference,
                       "requested_by": request.requested_by, "filed_at": filed_at})


def _filed_at(location: str) -> float:
    """A request filed again keeps its first filing time: the person has waited since then."""
    try:
        return float(json.loads(storage.read_text(location))["filed_at"])
    except (OSError, ValueError, KeyError, TypeError):
        return time.time()


def file_request(request: ErasureRequest, where: str | None = None) -> str:
    """Put the request in the inbox; returns its location. Filing the same reference again replaces it."""
    where = where or inbox()
    if not storage.is_remote(where):  # ids: a local inbox is for its owner's eyes only
        os.makedirs(where, mode=0o700, exist_ok=True)
    location = f"{where}/{_name(request.reference)}"
    storage.write_text(location, _document(request, _filed_at(location)))  # whole or not at all
    return location


def _documents(where: str) -> Iterator[tuple[str, str]]:
    for name in storage.list_dir(where):
        if name.endswith(SUFFIX):
            yield f"{where}/{name}", storage.read_text(f"{where}/{name}")


def pending(where: str | None = None) -> list[Filed]:
    """Every request waiting, oldest reference first; a file that is not a valid request is named and refused."""
    found = []
    for location, text in _documents(where or inbox()):
        try:
            doc = json.loads(text)
            request = parse_request(doc.get("customer_ids"), doc.get("reference"), doc.get("requested_by"))
            # A request filed before the inbox kept the time: its file's time.
            filed_at = float(doc.get("filed_at") or storage.modified(location) or time.time())
            found.append(Filed(request, location, filed_at))
        except (ValueError, AttributeError) as exc:
            detail = str(exc) if isinstance(exc, InvalidRequest) else f"not a request document ({exc})"
            raise InvalidRequest(f"erasure inbox {location}: {detail}") from exc
    return found


def oldest(where: str | None = None) -> tuple[int, float | None]:
    """How many requests wait, and when the oldest of them was filed (None: none waits)."""
    waiting = pending(where)
    return len(waiting), min((f.filed_at for f in waiting), default=None)


def remove(filed: list[Filed]) -> None:
    """Take erased requests out of the inbox (they hold the ids)."""
    for item in filed:
        storage.delete(item.location)
