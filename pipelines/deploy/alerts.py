"""Notices of the lakehouse DAGs: a failed run, and a run still going past its deadline ("late").

Airflow's own mechanisms deliver them; this module only says what the notice holds and where it goes:

- a failed run: the DAG's `on_failure_callback` (the dag-processor runs it, `dag.test()` in-process), with
  the run's last task instance, the one whose failure ended the run;
- a late run: Airflow 3.1's Deadline Alerts (the SLAs of Airflow 2 are gone). A DAG's `deadline` makes the
  scheduler store, for each run, a time: when the run was queued plus the DAG's `late_after`. A run that has
  not succeeded by then has the scheduler hand the alert's callback to the triggerer, which awaits it (an
  `AsyncCallback`: a notifier class, instantiated with the callback's kwargs and a small context holding the
  run, then awaited).

Both are `LakehouseNotifier`, the http provider's `HttpNotifier` (a `BaseNotifier` of `airflow.sdk`) with the
payload built here: the provider already does the HTTP part (connection lookup, TLS, proxies, timeouts and
headers from the connection's extras, a sync hook for the callback and an async one for the triggerer), and
it is in the Airflow environment already (the amazon provider requires it). The Slack and PagerDuty
providers' notifiers each speak to one service only and would be two more dependencies for what a JSON POST
does; apprise would be one more library for the same POST.

Where it goes is configuration: the Airflow connection `lakehouse_alerts` (type http; the whole webhook URL
as its host). The payload follows the URL: Slack incoming webhooks (`hooks.slack.com`) get `{"text": ...}`;
PagerDuty's Events API v2 (`events.pagerduty.com`) an event with the connection's password as routing key;
any other URL (a chat's or your own webhook) a JSON object with `text` and the fields. Without the
connection a notice is logged as a warning and nothing fails. The notice names the DAG, the run and the
task, never the run's conf (the erasure DAG's conf holds customer ids).

Imported by Airflow only (the DAG files, the dag-processor, the triggerer): a module of the installed
project, not of the DAG folder, because the triggerer imports a deadline callback by its dotted path and the
DAG folder is on no component's path but the parser's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlparse

from airflow.providers.http.notifications.http import HttpNotifier

ALERTS_CONNECTION = "lakehouse_alerts"

log = logging.getLogger(__name__)


def _get(obj: Any, name: str) -> Any:
    """An attribute of a context's object or a key of its dict form (the triggerer's context holds dicts)."""
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def describe(event: str, context: Mapping[str, Any]) -> dict[str, Any]:
    """The notice's fields from a callback's context: what happened to which DAG, run and task, and why.

    A failure callback's context has the DAG, the run (an object) and the run's last task instance `ti`;
    a deadline's has only `dag_run` (the REST API's form of the run, a dict) and `deadline`.
    """
    run = context.get("dag_run")
    dag = context.get("dag")
    ti = context.get("ti")
    dag_id = _get(dag, "dag_id") or _get(run, "dag_id") or _get(ti, "dag_id")
    run_id = context.get("run_id") or _get(run, "run_id") or _get(run, "dag_run_id") or _get(ti, "run_id")
    fields: dict[str, Any] = {
        "event": event, "dag_id": dag_id, "run_id": run_id, "task_id": _get(ti, "task_id"),
        "map_index": _get(ti, "map_index"), "try_number": _get(ti, "try_number"),
        "state": _get(run, "state") or ("failed" if event == "failed" else None),
        "reason": context.get("reason"), "url": _run_url(dag_id, run_id),
    }
    deadline = context.get("deadline")
    if deadline:
        fields["deadline"] = str(_get(deadline, "deadline_time"))
        fields["queued_at"] = str(_get(run, "queued_at"))
    if event == "late":
        what = f"is late: still {fields['state']} past its deadline {fields.get('deadline')}"
    else:
        task = fields["task_id"] or "?"
        if fields["map_index"] not in (None, -1):
            task = f"{task}[{fields['map_index']}]"
        what = f"failed (task {task}, reason {fields['reason'] or 'task_failure'})"
    fields["text"] = f"[lakehouse] DAG {dag_id} run {run_id} {what}: {fields['url']}"
    return fields


def _run_url(dag_id: str | None, run_id: str | None) -> str | None:
    """The run's page in the UI (api.base_url), where its tasks' logs are."""
    if not dag_id or not run_id:
        return None
    from airflow.configuration import conf

    base = conf.get("api", "base_url", fallback="") or ""
    return f"{base.rstrip('/')}/dags/{quote(dag_id)}/runs/{quote(run_id, safe='')}"


class LakehouseNotifier(HttpNotifier):
    """A notice of a failed (`event="failed"`) or late (`event="late"`) run, POSTed to the connection's URL.

    Usable wherever Airflow takes a notifier: `on_failure_callback=LakehouseNotifier()`, and
    `AsyncCallback(LakehouseNotifier, kwargs={"event": "late"})` of a DeadlineAlert (the triggerer passes
    `context` as a keyword, then awaits the instance).
    """

    # Nothing to render: the payload is built from the context. (Rendering would also fail under `dag.test()`,
    # whose DAG callbacks get a SerializedDAG without a template environment in Airflow 3.1.8.)
    template_fields = ()

    def render_template_fields(self, context: Any, jinja_env: Any = None) -> None:
        """No templates (see template_fields)."""

    def __init__(self, *, event: str = "failed", conn_id: str = ALERTS_CONNECTION,
                 context: dict[str, Any] | None = None) -> None:
        super().__init__(http_conn_id=conn_id, context=context)
        self.event = event

    def _payload(self, context: Mapping[str, Any], connection: Any) -> dict[str, Any] | None:
        """The notice in the form the connection's URL expects; None (and a log line) when none is to be sent."""
        fields = describe(self.event, context)
        if self.event == "late" and fields["state"] in ("success", "failed"):
            # A deadline is dropped when its run succeeds, not when it fails (the failure sent its own notice).
            log.info("%s: run ended %s before its deadline was handled: no late notice", fields["run_id"],
                     fields["state"])
            return None
        if connection is None:
            log.warning("no Airflow connection %r (an http connection whose host is a webhook URL, see "
                        "docs/deploying.md, 'Notices'): not sent: %s", self.http_conn_id, fields["text"])
            return None
        url = connection.host or ""
        host = urlparse(url if "://" in url else f"https://{url}").hostname or ""
        if host == "hooks.slack.com":
            return {"text": fields["text"]}
        if host.endswith("pagerduty.com"):
            return {"routing_key": connection.password, "event_action": "trigger",
                    "dedup_key": f"{fields['dag_id']}/{fields['run_id']}/{self.event}",
                    "payload": {"summary": fields["text"][:1024], "source": f"airflow {fields['dag_id']}",
                                "severity": "error" if self.event == "failed" else "warning",
                                "custom_details": {k: v for k, v in fields.items() if k != "text"}}}
        return fields

    def notify(self, context: Mapping[str, Any]) -> None:
        """Send the notice (the failure callback's way: synchronous)."""
        from airflow.exceptions import AirflowNotFoundException

        try:
            connection = self.hook.get_connection(self.http_conn_id)
        except AirflowNotFoundException:
            connection = None
        payload = self._payload(context, connection)
        if payload is not None:
            response = self.hook.run(endpoint=self.endpoint, json=payload)
            log.info("%s notice sent to %r: HTTP %s", self.event, self.http_conn_id, response.status_code)

    async def async_notify(self, context: Mapping[str, Any]) -> None:
        """Send the notice (the triggerer's way, for a deadline: asynchronous)."""
        import aiohttp
        from airflow.exceptions import AirflowNotFoundException

        try:
            connection = await self.async_hook.aget_connection(self.http_conn_id)
        except AirflowNotFoundException:
            connection = None
        payload = self._payload(context, connection)
        if payload is None:
            return
        async with aiohttp.ClientSession() as session:
            response = await self.async_hook.run(session=session, endpoint=self.endpoint, json=payload)
            log.info("%s notice sent to %r: HTTP %s", self.event, self.http_conn_id, response.status)
