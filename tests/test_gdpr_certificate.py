"""The erasure's certificate as a type: its file holds the keys the DAG, the benchmarks and the tests read, the
audit line its summary, and a certificate read back from its file equals the one written (no Spark here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines.gdpr.certificate import (
    Certificate,
    FurtherSweep,
    RunSummary,
    Subjects,
    Verification,
    read_certificate,
    write_certificate,
)

pytestmark = pytest.mark.unit


def _certificate() -> Certificate:
    return Certificate(
        reference="REQ/1", requested_by="dpo", status="erased", verified=True,
        started_at="2024-01-01T00:00:00+00:00", finished_at="2024-01-01T00:05:00+00:00",
        subjects=Subjects(customers=["ab" * 32], duplicates_in_request=1, found_in_lake=1),
        run=RunSummary(references=["REQ/1", "REQ-2"], customers=2, found_in_lake=1, orders=3,
                       orders_moved_to_other_customers=1, rows_of_theirs={"orders": 3},
                       rows_moved_to_other_customers={"orders": 1}, texts_checked=2,
                       texts_shared_with_other_customers=0),
        tables={"bronze/orders": {"rows_removed": 3}, "silver/orders": {"rows_removed": 2}, "gold/x": {}},
        purge={"bronze/orders": {"seconds": 1.5}}, kafka={"tombstones": 3}, quality_results={"redacted": 0},
        verification=Verification(passed=True, reads_checked=9, failures=[], scan={"files": 4, "findings": 0},
                                  reads_seconds={"bronze/orders": 0.5}, time_travel_covered_by_a_later_read=2,
                                  texts_now_shared_with_other_customers=0),
        further_sweeps=[FurtherSweep(stale_ingest_commits=1, findings=[])], timings_s={"find": 1.0})


def test_the_file_holds_the_certificates_keys_and_reads_back_equal(tmp_path: Path) -> None:
    root = str(tmp_path / "lake")
    certificate = _certificate()
    path = write_certificate(root, certificate)
    assert path == f"{root}/_gdpr/certificates/REQ_1.json"
    written = json.loads(Path(path).read_text())
    assert set(written) == {"reference", "requested_by", "status", "verified", "started_at", "finished_at",
                            "subjects", "run", "tables", "purge", "kafka", "quality_results", "verification",
                            "further_sweeps", "timings_s"}, "the file does not name its own path"
    assert written["subjects"] == {"customers": ["ab" * 32], "duplicates_in_request": 1, "found_in_lake": 1}
    assert written["run"]["references"] == ["REQ/1", "REQ-2"] and written["run"]["orders_moved_to_other_customers"] == 1
    assert written["verification"]["scan"] == {"files": 4, "findings": 0}
    assert written["further_sweeps"] == [{"stale_ingest_commits": 1, "findings": []}]
    assert read_certificate(path) == Certificate(**{**vars(certificate), "path": path})
    assert Certificate.from_dict(certificate.to_dict()) == certificate

    (audit,) = [json.loads(line) for line in (tmp_path / "lake" / "_gdpr" / "audit.jsonl").read_text().splitlines()]
    assert audit == {"reference": "REQ/1", "requested_by": "dpo", "status": "erased", "verified": True,
                     "started_at": "2024-01-01T00:00:00+00:00", "finished_at": "2024-01-01T00:05:00+00:00",
                     "subjects": ["ab" * 32], "certificate": path, "rows_removed": 5,
                     "run_references": ["REQ/1", "REQ-2"]}

    # A repeated request keeps both runs' certificates; the summary names the one written.
    again = write_certificate(root, certificate)
    assert again != path and Path(again).exists() and Path(path).exists()
    summary = read_certificate(again).summary()
    assert summary == {"reference": "REQ/1", "status": "erased", "verified": True, "certificate": again,
                       "rows_removed": 5}
