"""The erasure's certificate (`_gdpr/certificates/<reference>.json`) and its line in the audit log
(`_gdpr/audit.jsonl`): pseudonyms, counts, instants and timings, never the personal data.
Beside the lake, on its object store too.

`Certificate` is what the erasure returns and what the file holds: its fields are the file's keys
(`to_dict`, `from_dict`), so a reader of either gets names its type checker knows. The reports of the
steps that other modules run (the sweep per table, the purge per table, Kafka, the quality results)
stay the mappings those modules build: the certificate carries them as they are.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from pipelines.lake import storage
from pipelines.lake.layout import gdpr_path

# A step's report as the module that ran it writes it: counts, instants and seconds.
Report = dict[str, Any]

# "nothing left to erase": the lake held none of the request's customers and the run removed nothing.
Status = Literal["erased", "nothing left to erase", "NOT VERIFIED"]


@dataclass(frozen=True)
class Subjects:
    """The request's own customers: their pseudonyms, and how many the lake held."""

    customers: list[str]
    duplicates_in_request: int
    found_in_lake: int


@dataclass(frozen=True)
class RunSummary:
    """What the run did for all its requests together; per declared table, counts only (keys may be personal)."""

    references: list[str]
    customers: int
    found_in_lake: int
    orders: int
    orders_moved_to_other_customers: int
    rows_of_theirs: dict[str, int]
    rows_moved_to_other_customers: dict[str, int]
    texts_checked: int
    texts_shared_with_other_customers: int


@dataclass(frozen=True)
class Verification:
    """What the verification checked (pipelines.gdpr.verify) and every finding; `passed` when there is none."""

    passed: bool
    reads_checked: int
    failures: list[str]
    scan: Report
    reads_seconds: dict[str, float]
    time_travel_covered_by_a_later_read: int
    texts_now_shared_with_other_customers: int


@dataclass(frozen=True)
class FurtherSweep:
    """Why the run swept and purged again: ingest commits that raced the sweep, or what verification found."""

    stale_ingest_commits: int
    findings: list[str]


@dataclass(frozen=True)
class Certificate:
    """One request's certificate. `path` is where it was written (write_certificate), the file's `certificate`."""

    reference: str
    requested_by: str
    status: Status
    verified: bool
    started_at: str
    finished_at: str
    subjects: Subjects
    run: RunSummary
    tables: dict[str, Report]
    purge: dict[str, Report]
    kafka: Report
    quality_results: Report
    verification: Verification
    further_sweeps: list[FurtherSweep] = field(default_factory=list)
    timings_s: dict[str, float] = field(default_factory=dict)
    path: str | None = None

    @property
    def rows_removed(self) -> int:
        """Rows the run's sweeps removed, over every table: the figure the summary and the audit line show."""
        return sum(int(done.get("rows_removed", 0)) for done in self.tables.values())

    def to_dict(self) -> dict[str, Any]:
        """The certificate as its file holds it; `certificate` (the path) only once it is written."""
        data = asdict(self)
        path = data.pop("path")
        return data if path is None else {**data, "certificate": path}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Certificate:
        """A certificate read back from its file (or from to_dict)."""
        fields = {k: v for k, v in data.items() if k != "certificate"}
        return cls(**{**fields, "subjects": Subjects(**data["subjects"]), "run": RunSummary(**data["run"]),
                      "verification": Verification(**data["verification"]),
                      "further_sweeps": [FurtherSweep(**s) for s in data.get("further_sweeps", [])]},
                   path=data.get("certificate"))

    def summary(self) -> dict[str, Any]:
        """The line `lakehouse gdpr erase` prints per request: its outcome, where its certificate is, rows removed."""
        return {"reference": self.reference, "status": self.status, "verified": self.verified,
                "certificate": self.path, "rows_removed": self.rows_removed}


def certificate_path(root: str, reference: str) -> str:
    return f"{gdpr_path(root)}/certificates/{reference.replace('/', '_')}.json"


def read_certificate(path: str) -> Certificate:
    """The certificate written at `path` (on the lake's object store too)."""
    return Certificate.from_dict({**json.loads(storage.read_text(path)), "certificate": path})


def write_certificate(root: str, certificate: Certificate) -> str:
    """The certificate, and one line of the audit log, beside the lake (on its object store too); returns its path."""
    path = certificate_path(root, certificate.reference)
    data = certificate.to_dict()
    data.pop("certificate", None)  # the file does not name itself: a copy elsewhere stays true
    text = json.dumps(data, indent=2, sort_keys=True, default=str)
    if storage.exists(path):  # a repeated request keeps every run's certificate
        path = f"{path.removesuffix('.json')}.{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}.json"
    storage.write_text(path, text)
    audit = {"reference": certificate.reference, "requested_by": certificate.requested_by,
             "status": certificate.status, "verified": certificate.verified, "started_at": certificate.started_at,
             "finished_at": certificate.finished_at, "subjects": certificate.subjects.customers, "certificate": path,
             "rows_removed": certificate.rows_removed, "run_references": certificate.run.references}
    storage.append_text(f"{gdpr_path(root)}/audit.jsonl", json.dumps(audit, sort_keys=True, default=str) + "\n")
    return path
