"""The `gdpr_erasure` DAG: its trigger form's schema, the command it renders, and runs with `dag.test()`.

An invalid request stops in `validate_request`, once, before anything runs or is filed. A valid
request's whole run on a real lake (filed, erased together with a request waiting in the inbox,
verified, the earlier runs deleted through the REST API) is tests/dags/test_ui_browser.py's last
flow, triggered from the UI's form as a user does, on a real scheduler.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import DAGS

from pipelines.gdpr.request import MAX_IDS

pytestmark = pytest.mark.integration

DAG_ID = "gdpr_erasure"
GOOD = {"customer_ids": [12, 3, 12], "reference": "REQ-2026/04:17_a.b",
        "requested_by": "Jane Doe+dpo@shop.example"}
# Valid to the form's schema (any string names the requester), refused by parse_request: a
# quote that would end the quoted argument of the bash command and run the rest.
INJECTION = "x'; touch {canary}; echo '"


@pytest.fixture(autouse=True)
def inbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test's own erasure inbox (requests waiting for an erasure run)."""
    path = tmp_path / "inbox"
    monkeypatch.setenv("LAKEHOUSE_GDPR_INBOX", str(path))
    return path


@pytest.fixture(autouse=True)
def erasure_key_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The key of the ids' pseudonyms outside the lake, the test's own (not the checkout's .secrets/).

    Autouse, so that it is set before the test's first job: every job must see the same key (the
    shared lake's ingests ran before any erasure, so they never read it).
    """
    path = tmp_path / "erasure.key"
    monkeypatch.setenv("LAKEHOUSE_ERASURE_KEY_FILE", str(path))
    return path


def _dag():
    from airflow.models.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS), include_examples=False)
    assert bag.import_errors == {}, bag.import_errors
    return bag.dags[DAG_ID]


def _validate(dag, conf: dict) -> None:
    """What creating a run does with a trigger's conf (the UI form, the REST API, dag.test)."""
    params = copy.deepcopy(dag.params)
    params.update(conf)
    params.validate()


class _TI:
    """`ti` of a template context: validate_request's return value, as the run would pull it."""

    def __init__(self, returned: dict) -> None:
        self.returned = returned

    def xcom_pull(self, task_ids: str, key: str = "return_value"):
        assert (task_ids, key) == ("validate_request", "return_value"), (task_ids, key)
        return self.returned


def _rendered(task, conf: dict, **context) -> None:
    """Render the task's templates with what validate_request returns for `conf`."""
    returned = _dag().get_task("validate_request").python_callable(params=conf)
    task.render_template_fields({"ti": _TI(returned), **context})


def _bash_argv(command: str) -> list[str]:
    """The arguments bash itself makes of a command line (nothing is executed: `set --`)."""
    done = subprocess.run(["bash", "-c", f"set -- {command}\nprintf '%s\\0' \"$@\""], capture_output=True,
                          check=True)
    return done.stdout.decode().split("\0")[:-1]


def _states(run) -> dict[str, tuple[str, int]]:
    return {ti.task_id: (ti.state, ti.try_number) for ti in run.get_task_instances()}


# (a) ------------------------------------------------------------------------------------------


def test_dag_loads_without_errors_or_spark() -> None:
    dag = _dag()
    assert not [m for m in sys.modules if m == "pyspark" or m.startswith("pyspark.")], "the DAG imported pyspark"
    assert dag.timetable.can_be_scheduled is False and dag.max_active_runs > 1  # runs overlap, erasures do not
    assert set(dag.task_dict) == {"validate_request", "gdpr_erase", "forget_request"}
    assert dag.get_task("gdpr_erase").upstream_task_ids == {"validate_request"}
    assert dag.get_task("forget_request").upstream_task_ids == {"gdpr_erase"}  # only after a verified erasure
    assert dag.get_task("validate_request").retries >= 1  # only an invalid request fails at once


@pytest.mark.parametrize("conf", [
    {**GOOD, "customer_ids": []},
    {**GOOD, "customer_ids": ["x"]},
    {**GOOD, "customer_ids": ["12"]},
    {**GOOD, "customer_ids": [1.5]},
    {**GOOD, "customer_ids": [0]},
    {**GOOD, "customer_ids": "12"},
    {**GOOD, "customer_ids": list(range(1, MAX_IDS + 2))},
    {"reference": "REQ-1", "requested_by": "dpo@shop.example"},  # no customer_ids: required
    {**GOOD, "reference": "REQ 1"},
    {**GOOD, "reference": "'; rm -rf /"},
    {**GOOD, "requested_by": ""},
], ids=["empty", "not-int", "int-as-string", "float", "zero", "not-a-list", "too-many", "missing", "ref-space",
        "ref-quote", "no-requester"])
def test_params_reject_bad_requests(conf: dict) -> None:
    from airflow.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError):
        _validate(_dag(), conf)


def test_params_accept_a_good_request() -> None:
    dag = _dag()
    _validate(dag, GOOD)
    _validate(dag, {**GOOD, "customer_ids": list(range(1, MAX_IDS + 1))})
    # What the form shows: the parameters and their schema.
    schema = dag.params.get_param("customer_ids").schema
    assert schema["items"]["type"] == "integer" and schema["minItems"] == 1 and schema["maxItems"] == MAX_IDS


# (b) ------------------------------------------------------------------------------------------


def test_local_command_erases_the_pending_requests_and_names_nobody(monkeypatch: pytest.MonkeyPatch,
                                                                    inbox: Path) -> None:
    monkeypatch.setenv("LAKEHOUSE_TARGET", "local")
    task = _dag().get_task("gdpr_erase")
    assert task.pool == "lakehouse_lake"  # erasures never overlap
    _rendered(task, GOOD)
    assert "{{" not in task.bash_command and "}}" not in task.bash_command
    argv = _bash_argv(task.bash_command)
    assert argv[0].endswith(".venv/bin/spark-submit")
    assert argv[-4:] == [str(DAGS.parent / "pipelines" / "cli" / "__main__.py"), "gdpr", "erase", "--pending"]
    assert task.env["LAKEHOUSE_TABLE_SERVICES"] == "external" and task.append_env
    assert task.env["LAKEHOUSE_GDPR_INBOX"] == str(inbox)  # the job reads the inbox the request went to


def test_emr_step_erases_the_pending_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    code = "s3://lakehouse-code/release-1"
    monkeypatch.setenv("LAKEHOUSE_TARGET", "emr")
    monkeypatch.setenv("LAKEHOUSE_ROOT", "s3://lakehouse-data/lake")
    add = _dag().get_task("gdpr_erase.add_step")
    assert add.retries == 0  # a retried add would add the step twice
    _rendered(add, GOOD, var={"value": SimpleNamespace(lakehouse_code_uri=code, lakehouse_emr_cluster_id="j-1")})
    (step,) = add.steps
    assert step["HadoopJarStep"]["Args"][-4:] == [f"{code}/cli.py", "gdpr", "erase", "--pending"]
    assert add.job_flow_id == "j-1"


# (c) ------------------------------------------------------------------------------------------


def test_validate_request_names_every_problem_and_files_only_a_valid_request(inbox: Path) -> None:
    from airflow.exceptions import AirflowFailException

    from pipelines.gdpr.inbox import pending

    validate = _dag().get_task("validate_request").python_callable
    with pytest.raises(AirflowFailException) as failed:
        validate(params={"customer_ids": ["x", 0], "reference": "REQ-1", "requested_by": "O'Brien"})
    assert "not a customer id" in str(failed.value) and "requested_by" in str(failed.value)
    assert not inbox.exists()
    # What it returns (its XCom) names no customer.
    assert validate(params=GOOD) == {"reference": "REQ-2026/04:17_a.b", "customers": 2, "duplicates": 1}
    (filed,) = pending()
    assert filed.request.customer_ids == (3, 12) and filed.request.requested_by == "Jane Doe+dpo@shop.example"


def test_a_trigger_the_schema_refuses_creates_no_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow.exceptions import ParamValidationError

    monkeypatch.setenv("LAKEHOUSE_ROOT", str(tmp_path / "lake"))
    with pytest.raises(ParamValidationError):
        _dag().test(run_conf={"customer_ids": ["x"], "reference": "REQ-TEST-1", "requested_by": "dpo@shop.example"})
    assert not (tmp_path / "lake").exists()


def test_an_invalid_request_fails_in_validate_request_and_runs_nothing(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    root, canary = tmp_path / "lake", tmp_path / "canary"
    (root / "silver" / "customers").mkdir(parents=True)
    (root / "silver" / "customers" / "kept").write_text("a row")
    monkeypatch.setenv("LAKEHOUSE_ROOT", str(root))
    monkeypatch.setenv("LAKEHOUSE_TARGET", "local")
    run = _dag().test(run_conf={"customer_ids": [42], "reference": "REQ-TEST-1",
                                "requested_by": INJECTION.format(canary=canary)})
    assert run.state == "failed"
    states = _states(run)
    assert states["validate_request"] == ("failed", 1), states  # one try: no retries
    assert states["gdpr_erase"][0] == "upstream_failed", states  # never ran
    assert not canary.exists()
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) == ["silver", "silver/customers",
                                                                             "silver/customers/kept"]
    assert not list(Path(os.environ["LAKEHOUSE_GDPR_INBOX"]).glob("*")), "an invalid request was filed"
