"""The CLI's one dialect without a JVM: `--version`, the root help, the table-name parser and its exit 2, `--json`
documents of the read commands that need no Spark, `stream status`'s exit code, and the exit code of each kind of
lake error (pipelines/cli/root.py)."""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from importlib import metadata
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from pipelines.cli import main
from pipelines.cli.root import LakehouseGroup
from pipelines.errors import DeclarationError, KafkaUnavailable, LakehouseError, UnknownTable
from pipelines.ingest.stream import HEARTBEAT, ControlFiles, Heartbeat
from pipelines.lake.catalog import lake_catalog, table_name
from pipelines.runtime.declared import read_declaration

pytestmark = pytest.mark.unit


def cli(tmp_path: Path, *args: str) -> Result:
    """`lakehouse ARGS` on an empty lake and run folder of its own."""
    env = {"LAKEHOUSE_ROOT": str(tmp_path / "lake"), "LAKEHOUSE_RUN_DIR": str(tmp_path / "run")}
    return CliRunner().invoke(main, list(args), env=env)


def document(result: Result) -> dict:
    """The one JSON document a `--json` command printed: stdout parses whole, as one value."""
    return json.loads(result.stdout)


def test_version_and_the_root_help_list_the_operator_commands_and_the_exit_codes(tmp_path: Path) -> None:
    version = CliRunner().invoke(main, ["--version"])
    assert version.exit_code == 0 and version.stdout == f"lakehouse-cdc {metadata.version('lakehouse-cdc')}\n"
    shown = CliRunner().invoke(main, ["--help"])
    assert shown.exit_code == 0, shown.output
    listed = shown.stdout.split("Commands:", 1)[1].split("Exit codes", 1)[0]
    assert {"status", "show", "stream", "connector", "catalog", "sql", "etl", "ingest"} <= {
        line.split()[0] for line in listed.splitlines() if line.strip()}
    assert "  dev " not in listed and "bench" not in listed
    for code in ("0  done, or healthy", "1  what was checked", "2  bad usage or bad input"):
        assert code in shown.stdout
    assert "LAKEHOUSE_ROOT" in shown.stdout and "KAFKA_BOOTSTRAP_SERVERS" in shown.stdout


def test_a_table_is_named_by_its_lake_name_or_its_dotted_name() -> None:
    decl = read_declaration()
    for table in lake_catalog(decl):
        layer, rest = table.name.split("/", 1)
        assert table_name(table.name, decl) == table_name(f"{layer}.{rest.replace('/', '_')}", decl) == table.name
    assert table_name("silver.orders", decl) == table_name("silver/orders", decl) \
        == table_name("SILVER.Orders", decl) == "silver/orders"
    assert table_name("bronze._changelog_orders", decl) == "bronze/_changelog/orders"
    assert table_name("bronze.orders_rt", decl) == table_name("bronze.orders_ro", decl) == "bronze/orders"
    with pytest.raises(UnknownTable) as error:
        table_name("silver/custmers", decl)
    assert isinstance(error.value, KeyError) and isinstance(error.value, LakehouseError)
    assert str(error.value).startswith("no lake table is registered as 'silver/custmers'; the tables: bronze/")
    assert "silver/customers" in str(error.value)


@pytest.mark.parametrize("args", [("show", "silver.custmers"), ("changes", "silver.custmers"),
                                  ("services", "--table", "silver.custmers:compact")])
def test_an_unknown_table_is_bad_input_naming_it_and_the_tables(tmp_path: Path, args: tuple[str, ...]) -> None:
    done = cli(tmp_path, *args)
    assert done.exit_code == 2, done.output
    assert "no lake table is registered as 'silver.custmers'" in done.stderr and "silver/customers" in done.stderr
    assert done.stdout == ""


def test_a_table_without_a_change_feed_is_bad_input(tmp_path: Path) -> None:
    done = cli(tmp_path, "changes", "bronze._deletes_orders")
    assert done.exit_code == 2 and "'bronze/_deletes/orders' is not a table with a change feed" in done.stderr


def test_schema_takes_a_declared_table_or_its_bronze_table_in_either_spelling(tmp_path: Path) -> None:
    for name in ("orders", "bronze/orders", "bronze.orders"):
        done = cli(tmp_path, "schema", "show", name, "--json")
        assert done.exit_code == 0, done.output
        assert document(done) == {"tables": [{"table": "bronze/orders", "created": False, "columns": []}]}
    wrong = cli(tmp_path, "schema", "show", "silver.orders")
    assert wrong.exit_code == 2 and "no declared table 'silver.orders'" in wrong.stderr


def test_status_and_dead_letters_answer_one_json_document_on_an_empty_lake(tmp_path: Path) -> None:
    status = cli(tmp_path, "status", "--json")
    assert status.exit_code == 0, status.output
    doc = document(status)
    assert doc["lake_root"] == str(tmp_path / "lake") and doc["held"] == []
    assert doc["stream"]["state"] == "absent"
    assert doc["tables"] == [{"table": f"bronze/{t}", "layer": "bronze", "created": False}
                             for t in ("customers", "orders")]
    letters = cli(tmp_path, "dead-letters", "list", "--json")
    assert letters.exit_code == 0 and document(letters) == {"count": 0, "dead_letters": []}
    text = cli(tmp_path, "status")
    assert text.exit_code == 0 and "bronze/orders       (not created yet)" in text.stdout


def test_stream_status_exits_0_only_when_healthy(tmp_path: Path) -> None:
    absent = cli(tmp_path, "stream", "status", "--json")
    assert absent.exit_code == 1, absent.output
    assert document(absent) | {"log": None} == {"state": "absent", "why": "no heartbeat: the stream never ran on this "
                                                "lake", "healthy": False, "live": False, "pid": None, "log": None}
    assert document(absent)["log"] == str(tmp_path / "run" / "bronze-stream" / "stream.log")
    assert cli(tmp_path, "stream", "status").exit_code == 1
    # A running stream's fresh heartbeat, of a process on another host (its pid cannot be checked from here).
    now = time.time()
    beat = Heartbeat(owner="o", host="elsewhere", pid=1, pid_started=1.0, started_at=now - 100, written_at=now,
                     state="running", batch=7, last_progress_at=now)
    ControlFiles(str(tmp_path / "lake")).write(HEARTBEAT, json.dumps(asdict(beat)).encode())
    healthy = cli(tmp_path, "stream", "status", "--json")
    assert healthy.exit_code == 0, healthy.output
    assert document(healthy)["state"] == "healthy" and document(healthy)["healthy"] is True
    text = cli(tmp_path, "stream", "status")
    assert text.exit_code == 0 and text.stdout.startswith("healthy: pid 1 on elsewhere: batch 7")


def test_stream_subcommands_take_only_their_own_options(tmp_path: Path) -> None:
    for action in ("status", "stop", "wait"):
        done = cli(tmp_path, "stream", action, "--trigger-seconds", "2")
        assert done.exit_code == 2 and "No such option '--trigger-seconds'" in done.stderr, (action, done.output)
    assert cli(tmp_path, "stream", "start", "--timeout", "5").exit_code == 2
    for action in ("status", "ensure", "start", "stop", "restart", "upgrade", "wait"):
        assert cli(tmp_path, "stream", action, "--help").exit_code == 0


def test_lineage_json_is_the_run_its_task_and_its_writes(tmp_path: Path) -> None:
    root = tmp_path / "lake"

    def event(kind: str, run: str, job: str, at: str, **extra: object) -> dict:
        return {"eventType": kind, "eventTime": at, "run": {"runId": run, "facets": extra.pop("facets", {})},
                "job": {"namespace": "lakehouse", "name": job, "facets": extra.pop("job_facets", {})}, **extra}

    app_type = {"jobType": {"integration": "SPARK", "jobType": "APPLICATION"}}
    task = {"parent": {"run": {"runId": "task-1"}, "job": {"namespace": "airflow", "name": "etl.run"}}}
    write = {"parent": {"run": {"runId": "app-1"}, "job": {"namespace": "lakehouse", "name": "lakehouse_etl"}}}
    events = [event("START", "app-1", "lakehouse_etl", "2030-01-01T00:00:00Z", job_facets=app_type, facets=task),
              event("COMPLETE", "write-1", "lakehouse_etl.silver", "2030-01-01T00:00:05Z", facets=write,
                    inputs=[{"namespace": "file", "name": f"{root}/bronze/orders"}],
                    outputs=[{"namespace": "file", "name": f"{root}/silver/orders"}]),
              event("COMPLETE", "app-1", "lakehouse_etl", "2030-01-01T00:00:10Z", job_facets=app_type)]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    done = cli(tmp_path, "lineage", "--file", str(tmp_path / "events.jsonl"), "--json")
    assert done.exit_code == 0, done.output
    doc = document(done)
    assert (doc["run_id"], doc["job"], doc["state"], doc["seconds"]) == ("app-1", "lakehouse_etl", "COMPLETE", 10.0)
    assert doc["parent"] == {"namespace": "airflow", "job": "etl.run", "run_id": "task-1", "state": None}
    assert doc["writes"] == [{"inputs": ["bronze/orders"], "job": "lakehouse_etl.silver",
                              "outputs": ["silver/orders"], "run_id": "write-1"}]


def test_each_kind_of_lake_error_has_its_exit_code_and_its_message_on_stderr() -> None:
    group = LakehouseGroup()

    @group.command()
    @click.argument("kind")
    def fail(kind: str) -> None:
        raise {"kafka": KafkaUnavailable("no broker of 127.0.0.1:1 answers"),
               "declaration": DeclarationError("tables.toml: tables.x.key: missing")}[kind]

    kafka = CliRunner().invoke(group, ["fail", "kafka"])
    assert (kafka.exit_code, kafka.stderr, kafka.stdout) == (1, "Error: no broker of 127.0.0.1:1 answers\n", "")
    declaration = CliRunner().invoke(group, ["fail", "declaration"])
    assert (declaration.exit_code, declaration.stderr) == (2, "Error: tables.toml: tables.x.key: missing\n")


def test_a_service_that_does_not_answer_is_exit_1_and_no_catalog_is_exit_2(tmp_path: Path) -> None:
    # Nothing listens on port 1: Connect's refusal comes at once, as a ConnectError the root group prints.
    connect = cli(tmp_path, "connector", "status", "--connect-url", "http://127.0.0.1:1", "--json")
    assert connect.exit_code == 1 and "Kafka Connect does not answer at http://127.0.0.1:1" in connect.stderr
    assert connect.stdout == "" and "Traceback" not in connect.output
    catalog = CliRunner().invoke(main, ["catalog", "status", "--json"],
                                 env={"LAKEHOUSE_ROOT": str(tmp_path / "lake"), "LAKEHOUSE_METASTORE_URI": "",
                                      "LAKEHOUSE_TARGET": "local"})
    assert catalog.exit_code == 2 and "no catalog: set LAKEHOUSE_METASTORE_URI" in catalog.stderr
