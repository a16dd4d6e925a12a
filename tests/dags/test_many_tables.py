"""The DAGs at many declared tables: their files parse as fast and hold the same tasks whatever the table count,
and the table-services DAG maps jobs over the tables with work, and no other, a few tables to a job.

The tables are real Hudi tables, written by the pipeline (the session's `built_lake`) and copied under the
declared names: a copy is a few file copies, where ingesting tens of tables would be minutes of commits.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from conftest import DAGS, OVERRIDES, many_tables

import hudi_configs

pytestmark = pytest.mark.integration

# Each DAG file parsed as if alone, as Airflow's DAG processor parses it (Airflow imported, the project's modules
# not yet: they are dropped between files): DagBag's own figure per file (what Airflow reports as its parse time).
_PARSE = """
import json, sys, time
sys.path[:0] = sys.argv[1:3]
from airflow.models.dagbag import DagBag
import airflow.sdk
from pathlib import Path
found = {}
for path in sorted(p for p in Path(sys.argv[1]).glob("*.py") if p.name != "lakehouse_common.py"):
    for name in [m for m in sys.modules if m.split(".")[0] in ("pipelines", "hudi_configs", "lakehouse_common")]:
        del sys.modules[name]
    started = time.perf_counter()
    bag = DagBag(dag_folder=str(path), include_examples=False)
    wall = time.perf_counter() - started
    for stat in bag.dagbag_stats:
        found[path.name] = {"seconds": stat.duration.total_seconds(), "wall": wall, "errors": bag.import_errors,
                            "tasks": {d: sorted(bag.dags[d].task_ids) for d in bag.dag_ids}}
print(json.dumps(found, default=str))
"""


def _parse(declaration: Path | None) -> dict:
    env = {**os.environ, "LAKEHOUSE_TABLES": str(declaration)} if declaration else \
        {k: v for k, v in os.environ.items() if k != "LAKEHOUSE_TABLES"}
    done = subprocess.run([sys.executable, "-c", _PARSE, str(DAGS), str(DAGS.parent)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_dag_files_parse_at_50_tables_with_the_tasks_they_have_at_2(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture) -> None:
    """Parse time is measured and printed, not asserted (a loaded machine would fail a bound, not the code); what
    makes it independent of the table count is asserted: the same tasks at 50 declared tables as at the shop's 2."""
    declaration = tmp_path / "tables.toml"
    declaration.write_text(many_tables(50))
    fifty, shop = _parse(declaration), _parse(None)
    assert set(fifty) == {p.name for p in DAGS.glob("*.py") if p.name != "lakehouse_common.py"}
    for name, parsed in fifty.items():
        assert parsed["errors"] == {}, parsed["errors"]
        assert parsed["tasks"] == shop[name]["tasks"], f"{name}: its tasks change with the table count"
    with capsys.disabled():
        print("\nDAG files parsed at 50 declared tables (DagBag's figure, and with the project's imports):")
        for name, parsed in sorted(fifty.items()):
            print(f"  {name:32} {parsed['seconds']:.3f} s  ({parsed['wall']:.3f} s; "
                  f"{shop[name]['seconds']:.3f} s at the shop's 2 tables)")


def test_services_dag_maps_the_due_tables_a_few_to_a_job(built_lake: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """24 declared tables: every third has a bronze table with log files since its first commit (compaction due),
    every third but one a change log of one day (nothing due: expiry needs two days, clustering leaves the newest
    day alone, nothing is past the retention), the rest nothing written yet. The last due table also has a pending
    compaction plan (its timeline file: the decision reads names), the most urgent work. With 3 tables per job,
    the 8 due tables make 3 jobs: each due table in exactly one, none over the limit, the pending plan's in the
    first, the others in the catalog's order. The run's decision is the real one; the mapped jobs are marked done
    instead of run (each would be a spark-submit)."""
    from airflow.models.dagbag import DagBag

    n, per_job = 24, 3
    declaration = tmp_path / "tables.toml"
    declaration.write_text(many_tables(n))
    (tmp_path / "overrides.toml").write_text(f"{OVERRIDES}\n[table_services.jobs]\ntables_per_job = {per_job}\n")
    lake, built = tmp_path / "lake", built_lake / "lake" / "bronze"
    for i in range(n):
        if i % 3 == 0:
            shutil.copytree(built / "orders", lake / "bronze" / f"t{i:02}")
        elif i % 3 == 1:
            shutil.copytree(built / "_changelog" / "orders", lake / "bronze" / "_changelog" / f"t{i:02}")
    urgent = "bronze/t21"
    plan = f"{datetime.now():%Y%m%d%H%M%S%f}"[:17]  # an instant time as Hudi spells it, after every commit
    (lake / urgent / ".hoodie" / "timeline" / f"{plan}.compaction.requested").touch()
    for key, value in {"LAKEHOUSE_TABLES": str(declaration), "LAKEHOUSE_ROOT": str(lake), "LAKEHOUSE_TARGET": "local",
                       "LAKEHOUSE_TABLE_SERVICES": "external", "LAKEHOUSE_HUDI_OVERRIDES":
                       os.pathsep.join([str(hudi_configs.test_profile()), str(tmp_path / "overrides.toml")])}.items():
        monkeypatch.setenv(key, value)

    bag = DagBag(dag_folder=str(DAGS), include_examples=False)
    assert bag.import_errors == {}, bag.import_errors
    run = bag.dags["hudi_table_services"].test(mark_success_pattern="services")

    assert run.state == "success"
    decided = run.get_task_instance("due_tables").xcom_pull(task_ids="due_tables")
    due = [f"bronze/t{i:02}" for i in range(0, n, 3)]
    covered = [t for job in decided for t in job["tables"]]
    assert sorted(covered) == due, "the jobs do not cover exactly the due tables"
    assert len(covered) == len(set(covered)), "a table in two jobs"
    assert all(1 <= len(job["tables"]) <= per_job for job in decided), [job["tables"] for job in decided]
    assert len(decided) == -(-len(due) // per_job), "more jobs than the due tables need"
    order = [urgent, *(t for t in due if t != urgent)]
    assert decided == [{"label": ", ".join(tables), "tables": tables,
                        "args": ["services", *(a for t in tables for a in ("--table", f"{t}:compact,clean,archive"))]}
                       for tables in (order[:3], order[3:6], order[6:])]
    mapped = sorted(ti.map_index for ti in run.get_task_instances() if ti.task_id == "services")
    assert mapped == list(range(len(decided))), "not one mapped job per group of due tables"


def test_a_jobs_label_names_its_tables_within_airflows_limit() -> None:
    """A mapped task's label is kept in 250 characters (and "lakehouse services " + it is an EMR step's name, at
    most 256): the names in full when they fit, else each folder once, else as many as fit and how many more."""
    from pipelines.services.due import job_label

    assert job_label(["bronze/orders"]) == "bronze/orders"
    changelogs = [f"bronze/_changelog/customer_address_{i:02}" for i in range(6)]
    quarantine = [f"silver/_quarantine/customer_address_{i:02}" for i in range(5)]
    assert job_label(changelogs[:5]) == ", ".join(changelogs[:5])
    assert job_label(changelogs) == "bronze/_changelog/" + ", ".join(f"customer_address_{i:02}" for i in range(6))
    long = [f"{name}_with_a_long_suffix" for name in changelogs[:5] + quarantine]
    assert job_label(long) == f"{', '.join(long[:3])} and 7 more"
    for names in (changelogs, changelogs * 2, quarantine + changelogs, long, long * 3):
        assert len(job_label(names)) <= 200
