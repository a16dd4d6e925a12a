"""A failed run's notice, sent by Airflow's failure callback to a webhook: a real run of a real DAG (`dag.test()`).

The webhook is an HTTP server of the test's own on 127.0.0.1, reached through the Airflow connection
`lakehouse_alerts`, as a chat's or pager's would be. The late notice needs the scheduler and the triggerer
(Deadline Alerts): tests/dags/test_ui_browser.py sees it on the standalone Airflow it starts, and the
dag-processor's failure callback there too.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import DAGS, Webhook, webhook_server

pytestmark = pytest.mark.integration


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    with webhook_server() as hook:
        yield hook


def _dag(dag_id: str):
    from airflow.models.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS), include_examples=False)
    assert bag.import_errors == {}, bag.import_errors
    return bag.dags[dag_id]


def _failed_erasure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A real run of gdpr_erasure that fails: a request its own check refuses (fails at once, no Spark)."""
    monkeypatch.setenv("LAKEHOUSE_ROOT", str(tmp_path / "lake"))
    monkeypatch.setenv("LAKEHOUSE_GDPR_INBOX", str(tmp_path / "inbox"))
    monkeypatch.setenv("LAKEHOUSE_TARGET", "local")
    run = _dag("gdpr_erasure").test(run_conf={"customer_ids": [42], "reference": "REQ-NOTICE-1",
                                              "requested_by": "O'Brien"})
    assert run.state == "failed"
    return run


def test_a_failed_run_notifies_the_webhook(webhook: Webhook, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_LAKEHOUSE_ALERTS", webhook.connection())
    run = _failed_erasure(tmp_path, monkeypatch)
    assert webhook.wait_for(lambda _: True, 30), "no notice reached the webhook"
    (notice,) = webhook.received
    assert notice["event"] == "failed" and notice["state"] == "failed", notice
    assert (notice["dag_id"], notice["run_id"], notice["task_id"]) == ("gdpr_erasure", run.run_id,
                                                                       "validate_request"), notice
    assert f"/dags/gdpr_erasure/runs/{run.run_id}".replace("+", "%2B").replace(":", "%3A") in notice["url"], notice
    assert "gdpr_erasure" in notice["text"] and "validate_request" in notice["text"]
    # The run's conf (customer ids, the requester) is not in the notice.
    assert "O'Brien" not in json.dumps(notice) and "customer" not in json.dumps(notice), notice


def test_without_a_connection_the_notice_is_logged_and_nothing_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_LAKEHOUSE_ALERTS", raising=False)
    with caplog.at_level(logging.WARNING, logger="pipelines.deploy.alerts"):
        run = _failed_erasure(tmp_path, monkeypatch)
    (line,) = [r.getMessage() for r in caplog.records if r.name == "pipelines.deploy.alerts"]
    assert "no Airflow connection 'lakehouse_alerts'" in line and run.run_id in line, line
