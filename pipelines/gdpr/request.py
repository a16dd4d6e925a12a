"""An erasure request, checked before anything runs (pure Python: the Airflow DAG imports it).

A request names customer ids, a reference (the ticket it answers) and who asked. Every
problem is collected into one message, so a person fixing the form sees all of them at
once; nothing is registered or deleted for a request that does not pass.

Ids are pseudonymised with a keyed hash wherever the erasure itself keeps a record (the
registry that stops erased customers from coming back, the certificate, the audit log).
Source ids are small sequential integers: an unkeyed hash of one is reversed by hashing
every integer, so the key (LAKEHOUSE_ERASURE_KEY, or a key file kept outside the lake) is
what makes the records non-personal for whoever can read the lake.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from pipelines.errors import InvalidRequest

MAX_IDS = 1000
MAX_ID = 2**63 - 1  # a PostgreSQL bigint
REFERENCE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$"
REQUESTER_PATTERN = r"^[\w@.+ -]{1,200}$"


@dataclass(frozen=True)
class ErasureRequest:
    customer_ids: tuple[int, ...]  # unique, ascending
    reference: str
    requested_by: str
    duplicates: int = 0  # ids named more than once, dropped


def _as_id(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and re.fullmatch(r"\s*\d+\s*", value):
        number = int(value)
    else:
        return None
    return number if 1 <= number <= MAX_ID else None


def parse_request(customer_ids: Iterable[object] | object, reference: object, requested_by: object) -> ErasureRequest:
    """Check a request as a person or a form sends it; raises InvalidRequest naming every problem."""
    problems = []
    if isinstance(customer_ids, (str, bytes, int)) or not isinstance(customer_ids, Iterable):
        problems.append(f"customer ids must be a list of positive integers, got {type(customer_ids).__name__}")
        values: list[object] = []
    else:
        values = list(customer_ids)
    if not values and not problems:
        problems.append("no customer id given: the request must name at least one customer")
    if len(values) > MAX_IDS:
        problems.append(f"{len(values)} customer ids in one request; at most {MAX_IDS}: split it into several requests")
    ids = [_as_id(v) for v in values]
    bad = [f"#{i + 1} ({v!r})" for i, (v, n) in enumerate(zip(values, ids, strict=True)) if n is None]
    if bad:
        shown = ", ".join(bad[:10]) + (f" and {len(bad) - 10} more" if len(bad) > 10 else "")
        problems.append(f"not a customer id (a positive integer up to {MAX_ID}): {shown}")
    if not isinstance(reference, str) or not re.fullmatch(REFERENCE_PATTERN, reference):
        problems.append(f"reference {reference!r} must be 1-128 characters of letters, digits and . _ : / -, "
                        "starting with a letter or digit (it names the certificate)")
    if not isinstance(requested_by, str) or not re.fullmatch(REQUESTER_PATTERN, requested_by.strip()):
        problems.append(f"requested_by {requested_by!r} must name who asked for the erasure: 1-200 letters, "
                        "digits, spaces and @ . + _ - (no quotes: it travels on command lines)")
    if problems:
        raise InvalidRequest("invalid erasure request: " + "; ".join(problems))
    unique = sorted({n for n in ids if n is not None})
    return ErasureRequest(tuple(unique), str(reference), str(requested_by).strip(), len(ids) - len(unique))


def parse_requests(doc: object) -> list[ErasureRequest]:
    """Check a batch of requests (a JSON list of request objects); raises InvalidRequest naming every problem.

    One bad request refuses the whole batch: a batch is erased in one run, and an operator
    fixes it before anything is touched. References must differ: each names a certificate.
    """
    if not isinstance(doc, list) or not doc:
        raise InvalidRequest(f"invalid erasure requests: expected a non-empty list of requests, got {doc!r:.80}")
    requests, problems = [], []
    for i, item in enumerate(doc):
        if not isinstance(item, dict):
            problems.append(f"request #{i + 1}: expected an object with customer_ids, reference, requested_by")
            continue
        try:
            requests.append(parse_request(item.get("customer_ids"), item.get("reference"), item.get("requested_by")))
        except InvalidRequest as exc:
            problems.append(f"request #{i + 1}: {str(exc).removeprefix('invalid erasure request: ')}")
    references = [r.reference for r in requests]
    if repeated := sorted({r for r in references if references.count(r) > 1}):
        problems.append(f"reference(s) {', '.join(repeated)} given more than once: each names its own certificate")
    if sum(len(r.customer_ids) for r in requests) > MAX_IDS:
        problems.append(f"more than {MAX_IDS} customer ids in one run: split the batch")
    if problems:
        raise InvalidRequest("invalid erasure requests: " + "; ".join(problems))
    return requests
