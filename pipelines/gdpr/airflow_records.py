"""What Airflow keeps of an erasure request, and taking it out (the gdpr_erasure DAG's last task).

Airflow 3 keeps a request's customer ids in its metadata database, out of the lake's reach:
the run's conf (the trigger), and the API's event log of the trigger (its body). A task
cannot edit either: the Task SDK has no database access, the Execution API lets a task
delete XComs but not runs, and the public REST API cannot change a run's conf, only delete
a run that is queued, successful or failed (with its task instances and XComs), never one
still running. So, after a verified erasure, the DAG's last task:

- deletes the XComs of its own run (Task SDK, XCom.delete: they name references and
  pseudonyms, never an id, but nothing of the request need stay);
- deletes, through the REST API, every earlier run of the DAG that ended before this run
  started: their requests were filed in the inbox before this run's erasure read it, so they
  are erased (by their own run or by this one), or were refused and never filed;
- leaves its own run (still running) to the next run's clean-up, and the event log to the
  retention command the DAG documents (`airflow db clean --tables log,dag_run ...`).

The REST API is reached as the Airflow connection `airflow_api` says (host with scheme and
port, login and password; `POST /auth/token` for a JWT, as Airflow 3's auth managers
serve it). Without that connection only the XComs are deleted, and the task says so.
Standard library only: it runs in Airflow's environment.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from datetime import datetime

API_CONNECTION = "airflow_api"
# Runs in these states can be deleted (the REST API refuses the others) and are over.
FINISHED = ("success", "failed")
PAGE = 100


class AirflowApi:
    """The few calls of Airflow 3's public REST API (v2) this needs, with a token from /auth/token."""

    def __init__(self, base_url: str, username: str, password: str, timeout: float = 30) -> None:
        self.base = base_url.rstrip("/")
        self.timeout = timeout
        reply = self._call("POST", "/auth/token", {"username": username, "password": password}, token=None)
        self.token = reply["access_token"]

    def _call(self, method: str, path: str, body: dict | None = None, token: str | None = "") -> dict:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {token or self.token}"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data=data, headers=headers, method=method)
        with urllib.request.urlopen(request, timeout=self.timeout) as response:
            text = response.read()
        return json.loads(text) if text else {}

    def finished_runs(self, dag_id: str, ended_before: datetime) -> list[str]:
        """Run ids of the DAG's runs that succeeded or failed before `ended_before` (timezone-aware)."""
        found: list[str] = []
        offset = 0
        while True:
            query = urllib.parse.urlencode([*[("state", s) for s in FINISHED],
                                            ("end_date_lte", ended_before.isoformat()),
                                            ("limit", PAGE), ("offset", offset), ("order_by", "end_date")])
            page = self._call("GET", f"/api/v2/dags/{urllib.parse.quote(dag_id)}/dagRuns?{query}")
            runs = page.get("dag_runs", [])
            found += [r["dag_run_id"] for r in runs]
            offset += len(runs)
            if not runs or offset >= page.get("total_entries", 0):
                return found

    def delete_run(self, dag_id: str, run_id: str) -> None:
        self._call("DELETE", f"/api/v2/dags/{urllib.parse.quote(dag_id)}/dagRuns/{urllib.parse.quote(run_id, safe='')}")


def delete_earlier_runs(api: AirflowApi, dag_id: str, run_id: str, started: datetime) -> list[str]:
    """Delete the DAG's runs that ended before `started` (this run's start), never `run_id`; returns their ids."""
    gone = [r for r in api.finished_runs(dag_id, started) if r != run_id]
    for other in gone:
        api.delete_run(dag_id, other)
    return gone
