"""The Airflow UI, started by the project (`dags/airflow_local.sh`, what `make airflow` runs), in headless Chromium.

Chromium and ChromeDriver are Debian's packages (`make setup` installs them). One Airflow (standalone:
api-server, scheduler, dag-processor, triggerer) serves every flow of this module, started once (it takes
minutes), on a copy of a bronze lake the real pipeline built (conftest's `built_lake`: Kafka, ingest, Hudi),
with its own Kafka broker, so that the DAGs' tasks run the real CLI (spark-submit, Hudi) as in production.
The browser does what an operator does: logs in, finds the DAGs, triggers the ETL from its page and waits
in the UI for the run's success, opens the task's log and finds the job's summary line; meanwhile (the refusals
need no Spark) fills the erasure form with a malformed reference and reads the refusal, then a request the
DAG's own check refuses (the run fails, naming why); after the ETL a valid request, erased in one run with a
request waiting in the inbox, and reads their verified status from the erasure task's log. The lake is read back
(hudi-rs: nobody else's rows changed), and Airflow is asked through its REST API which runs it keeps: the refused
run, whose conf named the customer, was deleted by the DAG's last task.

The notices are seen arriving at a webhook of the test's (an HTTP server on 127.0.0.1, the connection
`lakehouse_alerts`): the failed erasure run's, sent by the dag-processor's failure callback, and the ETL run's
late notice, sent by the triggerer when the run's Deadline Alert (a short `LAKEHOUSE_LATE_AFTER`) passed
while Spark was still working.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import quote, unquote

import pytest
from conftest import DAGS, PROJECT, _lake_env, kafka_up, lakehouse, webhook_server

from lakehouse_dev.kafka_local import free_port
from pipelines.gdpr.airflow_records import AirflowApi

pytestmark = pytest.mark.integration

DAG_IDS = ("lakehouse_incremental_etl", "hudi_table_services", "data_quality")
# A run is late this long after it was queued (every DAG's deadline, lakehouse_common.alerting): well under
# what an etl cycle's spark-submit takes here, so the ETL run is still running when its deadline passes.
LATE_AFTER_SECONDS = 15
SUMMARY = re.compile(r"etl: (\d+) of (\d+) tables changed in [\d.]+ s")


@pytest.fixture(scope="module")
def webhook():
    with webhook_server() as hook:
        yield hook


@pytest.fixture(scope="module")
def ui_lake(built_lake: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A private copy of the built bronze lake with its broker up: the environment of the jobs the UI starts."""
    where = tmp_path_factory.mktemp("ui-lake")
    shutil.copytree(built_lake, where, dirs_exist_ok=True)
    env = {**_lake_env(where, kafka_up(where / "kafka")), "LAKEHOUSE_GDPR_INBOX": str(where / "inbox"),
           "LAKEHOUSE_ERASURE_KEY_FILE": str(where / "erasure.key")}
    try:
        yield env
    finally:
        lakehouse("dev", "kafka", "stop", "--data-dir", str(where / "kafka"))


@pytest.fixture(scope="module")
def airflow_ui(ui_lake: dict[str, str], webhook, tmp_path_factory: pytest.TempPathFactory):
    """`dags/airflow_local.sh` on a free port, once for the module: (url, user, password, the lake's env)."""
    home, port, password = tmp_path_factory.mktemp("airflow-ui"), free_port(), "not-a-secret"
    # The admin's password known before the start: the erasure DAG's last task deletes the request's earlier runs
    # through the REST API as this user (its connection `airflow_api`), as an operator configures it.
    (home / "passwords.json").write_text(json.dumps({"admin": password}))
    env = {**os.environ, **ui_lake, "AIRFLOW_HOME": str(home / "airflow"), "AIRFLOW_PORT": str(port),
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(home / "passwords.json"),
           "AIRFLOW_CONN_AIRFLOW_API": f"http://admin:{password}@127.0.0.1:{port}",
           # Only the runs the browser triggers: no scheduled run of the ETL queues beside them once unpaused.
           "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
           "LAKEHOUSE_LATE_AFTER": str(LATE_AFTER_SECONDS),
           "AIRFLOW_CONN_LAKEHOUSE_ALERTS": webhook.connection()}
    proc = subprocess.Popen([str(DAGS / "airflow_local.sh")], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        seen = []
        deadline = time.monotonic() + 420
        for line in proc.stdout:
            seen.append(line)
            if match := re.match(r"Airflow UI: (\S+)\s+login: (\S+) / (\S+)", line):
                url, user, password = match.groups()
                yield SimpleNamespace(url=url, user=user, password=password, env=ui_lake,
                                      log=home / "airflow" / "standalone.log", refused=[])
                break
            assert time.monotonic() < deadline, "".join(seen)
        else:
            pytest.fail("airflow_local.sh ended before the UI answered:\n" + "".join(seen[-50:]))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=60)
        # The script's end is not the group's: standalone's scheduler can outlive a SIGTERM, with its
        # workers, so whatever is left of it goes after a grace.
        deadline = time.monotonic() + 20
        with contextlib.suppress(ProcessLookupError):
            while time.monotonic() < deadline:
                os.killpg(proc.pid, 0)
                time.sleep(0.5)
            os.killpg(proc.pid, signal.SIGKILL)


def _browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


@pytest.fixture(scope="module")
def browser(airflow_ui, tmp_path_factory: pytest.TempPathFactory):
    """Chromium logged in to the UI (the login form, the password airflow_local.sh printed)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    shots = tmp_path_factory.mktemp("screenshots")
    browser = _browser()
    try:
        wait = WebDriverWait(browser, 60)
        browser.get(airflow_ui.url)
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "input[type=password]")))
        browser.find_element(By.CSS_SELECTOR, "input[name=username]").send_keys(airflow_ui.user)
        browser.find_element(By.CSS_SELECTOR, "input[type=password]").send_keys(airflow_ui.password)
        browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        wait.until(lambda b: "login" not in b.current_url)
        browser.shots = shots  # kept for a look when a flow fails (pytest's temporary directory)
        yield browser
    finally:
        browser.quit()


def _shot(browser, name: str) -> Path:
    path = browser.shots / f"{name}.png"
    browser.save_screenshot(str(path))
    return path


def _text(browser) -> str:
    from selenium.webdriver.common.by import By

    return browser.find_element(By.TAG_NAME, "body").text


def _open_trigger_form(browser, url: str, dag_id: str):
    """The DAG's page, its Trigger button clicked: the trigger dialog."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{url}/dags/{dag_id}")
    wait = WebDriverWait(browser, 60)
    wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, "button[aria-label='Trigger Dag']"))).click()
    return wait.until(ec.visibility_of_element_located((By.CSS_SELECTOR, ".chakra-dialog__content")))


def _submit(browser, dialog) -> str | None:
    """Click the dialog's Trigger: the new run's id (the UI opens its page), or None when the trigger was refused."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    (button,) = [b for b in dialog.find_elements(By.CSS_SELECTOR, "button") if b.text == "Trigger"]
    button.click()
    # An accepted trigger closes the dialog before the run's page opens: a stale dialog means wait for the URL.
    WebDriverWait(browser, 60, ignored_exceptions=(StaleElementReferenceException,)).until(
        lambda b: "/runs/" in b.current_url or "Bad Request" in dialog.text)
    if "/runs/" in browser.current_url:
        return unquote(browser.current_url.split("/runs/", 1)[1].split("/")[0])
    return None


def _fill_erasure_form(browser, dialog, customer_id: int, reference: str, requested_by: str) -> None:
    """Type the request into the form: the ids' JSON editor (typed so that it is valid JSON only once
    complete: the editor reformats valid JSON at each keystroke), the reference and the requester."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    dialog.find_element(By.CSS_SELECTOR, ".cm-content").click()
    (ActionChains(browser).key_down(Keys.CONTROL).send_keys("a").key_up(Keys.CONTROL).send_keys(Keys.BACKSPACE)
     .send_keys(str(customer_id)).send_keys(Keys.HOME).send_keys("[").send_keys(Keys.END).send_keys("]").perform())
    dialog.find_element(By.ID, "element_reference").send_keys(reference)
    dialog.find_element(By.ID, "element_requested_by").send_keys(requested_by)
    lines = [line.text.strip() for line in dialog.find_elements(By.CSS_SELECTOR, ".cm-line") if line.text.strip()]
    assert lines == ["[", str(customer_id), "]"], lines


def _run_page(url: str, dag_id: str, run_id: str) -> str:
    return f"{url}/dags/{dag_id}/runs/{quote(run_id, safe='')}"


class _RunsApi(AirflowApi):
    """The project's REST API client (pipelines.gdpr.airflow_records), with the one call only this test needs."""

    def run_state(self, dag_id: str, run_id: str) -> str:
        return self._call("GET", f"/api/v2/dags/{quote(dag_id)}/dagRuns/{quote(run_id, safe='')}")["state"]


def _wait_for_run(browser, airflow_ui, dag_id: str, run_id: str, timeout: float) -> str:
    """The state a run ended in (success, failed), as its page's badge shows it.

    The waiting asks the REST API, with the browser on a blank page: a run's page left open polls and
    redraws the grid every few seconds, and Chromium's rendering was a fifth of this suite's CPU. The page
    is opened once the run has ended, and its badge must say what the API said."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get("about:blank")
    api = _RunsApi(airflow_ui.url, airflow_ui.user, airflow_ui.password)
    deadline = time.monotonic() + timeout
    while (state := api.run_state(dag_id, run_id)) not in ("success", "failed"):
        if time.monotonic() > deadline:
            raise AssertionError(f"{dag_id} run {run_id} still {state} after {timeout} s")
        time.sleep(3)
    browser.get(_run_page(airflow_ui.url, dag_id, run_id))
    xpath = f"//h2[contains(normalize-space(.), '{run_id}')]/..//span[contains(@class, 'chakra-badge')]"
    try:
        badge = WebDriverWait(browser, 60).until(lambda b: next(
            (e.text.strip().lower() for e in b.find_elements(By.XPATH, xpath) if e.text.strip().lower() == state),
            None))
    except Exception as exc:
        raise AssertionError(f"{dag_id} run {run_id} ended {state}, its page does not say so (screenshot "
                             f"{_shot(browser, 'run-' + dag_id)})") from exc
    return badge


# What a user's scrolling to the end of the log does: every scrolled pane of the page, and the page, down.
_SCROLL_DOWN = """
for (const e of document.querySelectorAll('*')) {
  const style = getComputedStyle(e);
  if (e.scrollHeight > e.clientHeight && ['auto', 'scroll'].includes(style.overflowY)) e.scrollTop = e.scrollHeight;
}
window.scrollTo(0, document.body.scrollHeight);
"""


def _task_log(browser, url: str, dag_id: str, run_id: str, task_id: str, wanted: Callable[[str], bool]) -> str:
    """From the run's page, open the task's page (its log) by its link, as a user does; the first log line
    `wanted` accepts (the log is scrolled down while it loads: the lines looked for are near its end)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(_run_page(url, dag_id, run_id))
    link = WebDriverWait(browser, 60).until(lambda b: next(
        (a for a in b.find_elements(By.CSS_SELECTOR, f"a[href*='/runs/'][href$='/tasks/{task_id}']")
         if a.is_displayed()), None))
    link.click()
    found: list[str] = []

    def loaded(b) -> bool:
        # The log is a virtualized list in a pane of its own: lines are drawn as it scrolls to them.
        b.execute_script(_SCROLL_DOWN)
        found[:] = [line for line in _text(b).splitlines() if wanted(line)]
        return bool(found)

    try:
        WebDriverWait(browser, 90, poll_frequency=2).until(loaded)
    except Exception:
        raise AssertionError(f"{task_id}'s log shows no such line (screenshot {_shot(browser, task_id)})") from None
    return found[0]


@pytest.mark.slow
def test_browser_logs_in_and_finds_the_dags(airflow_ui, browser) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    # The dag-processor parses the folder in the background: reload the list until all are there.
    deadline = time.monotonic() + 180
    while True:
        browser.get(f"{airflow_ui.url}/dags")
        try:
            WebDriverWait(browser, 20).until(lambda b: all(d in b.page_source for d in DAG_IDS))
            break
        except Exception:
            if time.monotonic() > deadline:
                raise AssertionError(f"DAGs not listed in the UI (screenshot {_shot(browser, 'dags')})") from None


@pytest.fixture(scope="module")
def etl_run(airflow_ui, browser) -> str:
    """The ETL triggered from its page (its Trigger button, the dialog's Trigger): the run's id, from the page the
    UI opens. A fixture, so that the erasure form's refusals run while Spark works (they need no lake slot)."""
    run_id = _submit(browser, _open_trigger_form(browser, airflow_ui.url, "lakehouse_incremental_etl"))
    assert run_id and run_id.startswith("manual__"), browser.current_url
    return run_id


def _customer(env: dict[str, str]) -> int:
    """A customer of the source (the generator's state), in bronze since the lake was built."""
    return json.loads(Path(env["LAKEHOUSE_SOURCE_STATE"]).read_text())["state"]["customers"][0]["id"]


@pytest.mark.slow
def test_erasure_form_refuses_bad_requests_with_the_reason(airflow_ui, browser, webhook, etl_run: str) -> None:
    url, customer = airflow_ui.url, _customer(airflow_ui.env)

    # The form's schema (the DAG's Params): a malformed reference is refused, with the reason, and no run starts.
    dialog = _open_trigger_form(browser, url, "gdpr_erasure")
    _fill_erasure_form(browser, dialog, customer, "REQ 7; rm -rf", "dpo@shop.example")
    assert _submit(browser, dialog) is None, "a malformed reference started a run"
    refusal = dialog.text
    assert "Invalid input for param reference" in refusal and "does not match" in refusal, refusal

    # Valid to the schema (any text names the requester), refused by the DAG's own check: the run fails at its
    # first task, whose log names the reason, and the failure notice names the DAG, the run and the task.
    dialog = _open_trigger_form(browser, url, "gdpr_erasure")
    _fill_erasure_form(browser, dialog, customer, "REQ-UI-0", "O'Brien")
    refused = _submit(browser, dialog)
    assert refused, "the trigger was refused by the form"
    airflow_ui.refused.append(refused)  # its conf names the customer: a verified erasure deletes it (below)
    assert _wait_for_run(browser, airflow_ui, "gdpr_erasure", refused, timeout=300) == "failed"
    reason = _task_log(browser, url, "gdpr_erasure", refused, "validate_request",
                       lambda line: "invalid erasure request" in line)
    assert "requested_by" in reason and "no quotes" in reason, reason
    notice = webhook.wait_for(lambda n: n["event"] == "failed" and n["run_id"] == refused, 120)
    assert notice, f"no failure notice of {refused}: {webhook.received}"
    assert (notice["dag_id"], notice["task_id"]) == ("gdpr_erasure", "validate_request"), notice
    assert "O'Brien" not in json.dumps(notice), "the notice repeats the run's conf"


@pytest.mark.slow
def test_etl_triggered_in_the_ui_runs_on_the_lake_and_logs_its_summary(airflow_ui, browser, webhook,
                                                                        etl_run: str) -> None:
    url, lake, run_id = airflow_ui.url, Path(airflow_ui.env["LAKEHOUSE_ROOT"]), etl_run
    assert _wait_for_run(browser, airflow_ui, "lakehouse_incremental_etl", run_id, timeout=600) == "success"

    line = _task_log(browser, url, "lakehouse_incremental_etl", run_id, "etl", SUMMARY.search)
    changed, tables = map(int, SUMMARY.search(line).groups())
    assert changed >= 4 and changed <= tables, line  # silver and gold built from bronze: real work
    for table in ("silver/customers", "silver/orders", "gold/customer_ltv", "gold/daily_revenue"):
        assert list((lake / table / ".hoodie" / "timeline").glob("*.commit")), f"{table}: no commit"

    # The run outlived its deadline (LATE_AFTER_SECONDS after it was queued): the triggerer sent the notice.
    notice = webhook.wait_for(lambda n: n["event"] == "late" and n["run_id"] == run_id, 120)
    assert notice, f"no late notice of {run_id}: {webhook.received}"
    assert notice["dag_id"] == "lakehouse_incremental_etl" and notice["state"] in ("queued", "running"), notice
    assert run_id in unquote(notice["url"]) and url in notice["url"], notice


def _hudi_rows(lake: Path, table: str, key: str) -> dict:
    """A table's rows by key, read with hudi-rs in .venv (no JVM; Airflow's environment has no Hudi reader)."""
    code = ("import json, sys; from pipelines.lake.table_stats import read_table; "
            "print(json.dumps(read_table(sys.argv[1]).to_pylist(), default=str))")
    done = subprocess.run([str(PROJECT / ".venv" / "bin" / "python"), "-c", code, str(lake / table)], cwd=PROJECT,
                          capture_output=True, text=True, timeout=300, check=True)
    return {r[key]: {c: v for c, v in r.items() if not c.startswith("_hoodie")} for r in json.loads(done.stdout)}


@pytest.mark.slow
def test_erasure_from_the_form_is_verified_in_the_task_log(airflow_ui, browser) -> None:
    """After the ETL (the customer is in silver and gold too): a valid request, erased in one run with a request
    waiting in the inbox, and the erasure task's log says both are verified (the job's summary, one JSON line).
    Nobody else's rows changed, the certificates name nobody, and Airflow keeps no run whose conf named a customer:
    the DAG's last task deleted the refused run through the REST API."""
    url, env = airflow_ui.url, airflow_ui.env
    lake, state = Path(env["LAKEHOUSE_ROOT"]), json.loads(Path(env["LAKEHOUSE_SOURCE_STATE"]).read_text())["state"]
    customers = _hudi_rows(lake, "silver/customers", "id")
    subject = _customer(env)
    waiting = next(c["id"] for c in state["customers"] if c["id"] in customers and c["id"] != subject)
    lakehouse("gdpr", "request", "--customer-id", str(waiting), "--reference", "REQ-UI-0a", env=env)
    dialog = _open_trigger_form(browser, url, "gdpr_erasure")
    _fill_erasure_form(browser, dialog, subject, "REQ-UI-1", "dpo@shop.example")
    run_id = _submit(browser, dialog)
    assert run_id, "a valid request was refused"
    assert _wait_for_run(browser, airflow_ui, "gdpr_erasure", run_id, timeout=900) == "success"
    line = _task_log(browser, url, "gdpr_erasure", run_id, "gdpr_erase", lambda line: '"REQ-UI-1"' in line)
    summaries = {s["reference"]: s for s in json.loads(line[line.index("[{"):line.rindex("}]") + 2])}
    assert summaries.keys() == {"REQ-UI-0a", "REQ-UI-1"}, summaries
    assert all(s["status"] == "erased" and s["verified"] is True for s in summaries.values()), summaries
    assert summaries["REQ-UI-1"]["rows_removed"] > 0, summaries
    people = [c for c in state["customers"] if c["id"] in (subject, waiting)]
    for summary in summaries.values():
        certificate = json.loads(Path(summary["certificate"]).read_text())
        assert certificate["verified"] is True and certificate["reference"] == summary["reference"]
        text = json.dumps(certificate).lower()
        assert not [p for p in people if p["email"].strip().lower() in text or p["full_name"].lower() in text], \
            "a certificate repeats personal data"
    assert not list(Path(env["LAKEHOUSE_GDPR_INBOX"]).glob("*")), "the inbox keeps an erased request"

    gone = {subject, waiting}
    assert _hudi_rows(lake, "silver/customers", "id") == {k: v for k, v in customers.items() if k not in gone}, \
        "another customer changed"
    assert not gone & _hudi_rows(lake, "gold/customer_ltv", "customer_id").keys()
    # The refused run's conf named the subject: deleted, with every other run that ended before this one.
    api = AirflowApi(url, airflow_ui.user, airflow_ui.password)
    assert airflow_ui.refused and api.finished_runs("gdpr_erasure", datetime.now(UTC)) == [run_id]
