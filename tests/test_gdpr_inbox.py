"""Erasure requests in batches, before any Spark: the checks of a batch, the inbox (a folder, and S3
on the project's local store, a moto server), and the CLI's refusals, which touch nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from lakehouse_dev.object_store import BUCKET, ObjectStore
from pipelines.cli.app import main
from pipelines.errors import InvalidRequest
from pipelines.gdpr import inbox
from pipelines.gdpr.request import parse_request, parse_requests

pytestmark = pytest.mark.unit


def test_a_batch_is_refused_whole_naming_each_bad_request() -> None:
    good = {"customer_ids": [3, 3, 5], "reference": "REQ-1", "requested_by": "dpo"}
    assert [r.customer_ids for r in parse_requests([good, {**good, "reference": "REQ-2"}])] == [(3, 5), (3, 5)]
    with pytest.raises(InvalidRequest) as refused:
        parse_requests([good, {**good, "customer_ids": ["x"]}, "REQ-3", good])
    message = str(refused.value)
    assert "request #2: not a customer id" in message and "request #3: expected an object" in message
    assert "REQ-1 given more than once" in message
    with pytest.raises(InvalidRequest, match="non-empty list"):
        parse_requests([])
    with pytest.raises(InvalidRequest, match="more than 1000"):
        parse_requests([{**good, "reference": f"R-{i}", "customer_ids": list(range(1, 401))} for i in range(3)])


def _round_trip(where: str) -> None:
    first = parse_request([7, 8], "REQ-2026/1", "dpo@shop.example")
    second = parse_request([9], "REQ-2026-2", "dpo")
    inbox.file_request(first, where)
    filed_first = {f.request.reference: f.filed_at for f in inbox.pending(where)}["REQ-2026/1"]
    inbox.file_request(second, where)
    inbox.file_request(parse_request([7, 8, 10], "REQ-2026/1", "dpo@shop.example"), where)  # replaces it
    waiting = inbox.pending(where)
    assert [(f.request.reference, f.request.customer_ids) for f in waiting] == [
        ("REQ-2026-2", (9,)), ("REQ-2026/1", (7, 8, 10))]
    # Filed again, a request keeps its first filing time: the erasure-overdue alert counts from it.
    assert waiting[1].filed_at == filed_first <= waiting[0].filed_at
    assert inbox.oldest(where) == (2, filed_first)
    inbox.remove(waiting[:1])
    assert [f.request.reference for f in inbox.pending(where)] == ["REQ-2026/1"]


def test_inbox_in_a_folder(tmp_path: Path) -> None:
    _round_trip(str(tmp_path / "inbox"))
    (tmp_path / "inbox" / "broken.json").write_text('{"customer_ids": "7"}')
    with pytest.raises(InvalidRequest, match=r"broken\.json: .*customer ids must be a list"):
        inbox.pending(str(tmp_path / "inbox"))


def test_inbox_on_s3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with ObjectStore(tmp_path / "s3", 0) as store:
        for key, value in store.env().items():
            monkeypatch.setenv(key, value)
        _round_trip(f"s3://{BUCKET}/ops/gdpr/inbox")


def test_cli_refusals_touch_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAKEHOUSE_ROOT", str(tmp_path / "lake"))
    monkeypatch.setenv("LAKEHOUSE_GDPR_INBOX", str(tmp_path / "inbox"))
    runner = CliRunner()
    requests = tmp_path / "requests.json"
    requests.write_text(json.dumps([{"customer_ids": [1], "reference": "A", "requested_by": "x"},
                                    {"customer_ids": [], "reference": "A", "requested_by": "x"}]))
    for args, says in ((["--requests-file", str(requests)], "request #2: no customer id"),
                       (["--requests-file", str(requests), "--reference", "B"], "give neither"),
                       (["--pending", "--customer-id", "4"], "give neither")):
        done = runner.invoke(main, ["gdpr", "erase", *args])
        assert done.exit_code == 2 and says in done.output, (args, done.output)
    done = runner.invoke(main, ["gdpr", "request", "--customer-id", "x", "--reference", "R-1"])
    assert done.exit_code == 2 and "#1 ('x')" in done.output
    done = runner.invoke(main, ["gdpr", "erase", "--pending"])  # nothing filed: nothing to do, no Spark
    assert done.exit_code == 0 and json.loads(done.output)["status"] == "no pending request"
    assert not (tmp_path / "lake").exists() and not (tmp_path / "inbox").exists()
