"""The Airflow UI, started by the project (`dags/airflow_local.sh`, what `make airflow` runs), in headless Chromium.

Chromium and ChromeDriver are Debian's packages (`make setup` installs them); the browser logs
in with the login the script prints and finds the project's DAGs in the UI.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import DAGS

from pipelines.devtools.kafka_local import free_port

DAG_IDS = ("lakehouse_incremental_etl", "hudi_table_services", "data_quality")


@pytest.fixture
def airflow_ui(tmp_path: Path):
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path / "airflow"), "AIRFLOW_PORT": str(free_port()),
           "LAKEHOUSE_ROOT": str(tmp_path / "lake")}
    proc = subprocess.Popen([str(DAGS / "airflow_local.sh")], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        seen = []
        deadline = time.monotonic() + 420
        for line in proc.stdout:
            seen.append(line)
            if match := re.match(r"Airflow UI: (\S+)\s+login: (\S+) / (\S+)", line):
                yield match.groups()
                break
            assert time.monotonic() < deadline, "".join(seen)
        else:
            pytest.fail("airflow_local.sh ended before the UI answered:\n" + "".join(seen[-50:]))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=60)
        # The script's end is not the group's: standalone's scheduler outlived a SIGTERM (seen idle
        # 20 minutes after the suite, with its workers), so whatever is left of it goes after a grace.
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


@pytest.mark.slow
def test_browser_logs_in_and_finds_the_dags(airflow_ui, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    url, user, password = airflow_ui
    browser = _browser()
    try:
        wait = WebDriverWait(browser, 60)
        browser.get(url)
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "input[type=password]")))
        browser.find_element(By.CSS_SELECTOR, "input[name=username]").send_keys(user)
        browser.find_element(By.CSS_SELECTOR, "input[type=password]").send_keys(password)
        browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
        wait.until(lambda b: "login" not in b.current_url)
        # The dag-processor parses the folder in the background: reload the list until all are there.
        deadline = time.monotonic() + 180
        while True:
            browser.get(f"{url}/dags")
            try:
                WebDriverWait(browser, 20).until(lambda b: all(d in b.page_source for d in DAG_IDS))
                browser.save_screenshot(str(tmp_path / "dags.png"))  # kept for a look: pytest's tmp_path
                break
            except Exception:
                if time.monotonic() > deadline:
                    browser.save_screenshot(str(tmp_path / "dags.png"))
                    raise AssertionError(f"DAGs not listed in the UI (screenshot {tmp_path / 'dags.png'})") from None
    finally:
        browser.quit()
