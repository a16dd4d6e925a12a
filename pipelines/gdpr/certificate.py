"""The erasure's certificate (`_gdpr/certificates/<reference>.json`) and its line in the audit log
(`_gdpr/audit.jsonl`): pseudonyms, counts, instants and timings, never the personal data.
Beside the lake, on its object store too.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from pipelines.lake import storage
from pipelines.runtime.settings import gdpr_path


def certificate_path(root: str, reference: str) -> str:
    return f"{gdpr_path(root)}/certificates/{reference.replace('/', '_')}.json"


def write_certificate(root: str, certificate: dict[str, object]) -> None:
    """The certificate, and one line of the audit log, beside the lake (on its object store too); sets its path."""
    path = certificate_path(root, str(certificate["reference"]))
    text = json.dumps(certificate, indent=2, sort_keys=True, default=str)
    if storage.exists(path):  # a repeated request keeps every run's certificate
        path = f"{path.removesuffix('.json')}.{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}.json"
    storage.write_text(path, text)
    audit = {k: certificate[k] for k in ("reference", "requested_by", "status", "verified", "started_at",
                                         "finished_at")}
    audit |= {"subjects": certificate["subjects"]["customers"], "certificate": path,
              "rows_removed": sum(int(t.get("rows_removed", 0)) for t in certificate["tables"].values()),
              "run_references": certificate["run"]["references"]}
    storage.append_text(f"{gdpr_path(root)}/audit.jsonl", json.dumps(audit, sort_keys=True, default=str) + "\n")
    certificate["certificate"] = path
