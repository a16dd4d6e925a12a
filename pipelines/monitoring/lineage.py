"""OpenLineage events of the pipeline's runs, read back from the local file transports (pure Python, no Spark).

Two producers append JSON lines to the lineage folder (`pipelines.runtime.settings.lineage_dir`;
docs/deploying.md, "Lineage"): openlineage-spark's listener in every Spark job (`spark.jsonl`,
hudi_configs/spark.toml [lineage]) and Airflow's OpenLineage provider in every task (`airflow.jsonl`).
A Spark application is one run (job `lakehouse_etl`); each of its SQL executions that writes is a child
run whose parent is the application's; an application started by an Airflow task has that task's run as
its parent. Datasets are named as the listener names them: namespace `file` (or the object store's
`s3://bucket`) and the table's path, which `lake_relative` turns into the catalog's name.

`lakehouse lineage` prints one application's edges, `inputs -> job -> outputs`, from these files.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from pipelines.lake.layout import lake_relative
from pipelines.runtime.settings import lineage_dir

# openlineage-spark names the job of a datasource write after its `table` option, and without one after the
# value of any option whose key contains "table" (SaveIntoDataSourceCommandVisitor.jobNameSuffix, 1.53.0): for
# Hudi, whichever `hoodie.table.*` option a hash set yields first, e.g. `DATA_BEFORE_AFTER`, the CDC logging
# mode, for every silver and gold write alike. Hudi ignores this option; the lake's writers set it.
JOB_NAME_OPTION = "table"


def named_for_lineage(path: str, options: dict[str, str]) -> dict[str, str]:
    """A Hudi write's `options` with the one that names its OpenLineage job after its table (JOB_NAME_OPTION):
    Hudi's table name (`silver_orders`), else the table's lake-relative path."""
    return {JOB_NAME_OPTION: options.get("hoodie.table.name") or lake_relative(path), **options}


Dataset = tuple[str, str]  # (namespace, name) as the events carry them


@dataclass
class Run:
    """One OpenLineage run, its events folded: what it read and wrote over all of them (a write's START
    names no output when its table does not exist yet, the listener finding the output by reading it)."""

    run_id: str
    namespace: str
    job: str
    job_type: str = ""  # the jobType facet's `integration/jobType`: SPARK/APPLICATION, SPARK/SQL_JOB, AIRFLOW/TASK
    parent: tuple[str, str, str] | None = None  # (namespace, job, run id) of the parent run
    root: tuple[str, str, str] | None = None  # the same of the root run (an Airflow DAG run)
    events: list[str] = field(default_factory=list)  # event types in file order
    started: str | None = None
    ended: str | None = None
    inputs: dict[Dataset, list[str]] = field(default_factory=dict)  # dataset -> its schema's field names
    outputs: dict[Dataset, list[str]] = field(default_factory=dict)

    @property
    def state(self) -> str:
        """The last terminal event type (COMPLETE, FAIL, ABORT), else the last one."""
        terminal = [e for e in self.events if e in ("COMPLETE", "FAIL", "ABORT")]
        return (terminal or self.events or ["?"])[-1]

    def seconds(self) -> float | None:
        if not (self.started and self.ended):
            return None
        return (_time(self.ended) - _time(self.started)).total_seconds()


def _time(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def _ref(facet: dict | None) -> tuple[str, str, str] | None:
    if not facet or "run" not in facet or "job" not in facet:
        return None
    return facet["job"]["namespace"], facet["job"]["name"], facet["run"]["runId"]


def default_files() -> list[Path]:
    """Every `*.jsonl` of the lineage folder (Spark's and Airflow's)."""
    return sorted(lineage_dir().glob("*.jsonl"))


def read_events(files: Iterable[Path]) -> Iterator[dict]:
    """The run events of `files`, in file order."""
    for path in files:
        with path.open(encoding="utf-8") as fh:
            yield from read_events_from_lines(fh)


def read_events_from_lines(lines: Iterable[str]) -> Iterator[dict]:
    """The run events of JSON lines (job and dataset events, which carry no `eventType`, are skipped)."""
    for line in lines:
        if line.strip() and "eventType" in (event := json.loads(line)):
            yield event


def fold(events: Iterable[dict]) -> dict[str, Run]:
    """Runs by id, each with the union of its events' datasets."""
    runs: dict[str, Run] = {}
    for event in events:
        run_id = event["run"]["runId"]
        run = runs.get(run_id) or runs.setdefault(
            run_id, Run(run_id, event["job"]["namespace"], event["job"]["name"]))
        parent = (event["run"].get("facets") or {}).get("parent")
        if kind := ((event["job"].get("facets") or {}).get("jobType")):
            run.job_type = f"{kind.get('integration')}/{kind.get('jobType')}"
        run.parent = run.parent or _ref(parent)
        run.root = run.root or _ref((parent or {}).get("root"))
        run.events.append(event["eventType"])
        if event["eventType"] == "START":
            run.started = run.started or event["eventTime"]
        elif event["eventType"] in ("COMPLETE", "FAIL", "ABORT"):
            run.ended = event["eventTime"]
        for key, into in (("inputs", run.inputs), ("outputs", run.outputs)):
            for d in event.get(key) or []:
                fields = [f["name"] for f in ((d.get("facets") or {}).get("schema") or {}).get("fields", [])]
                if fields or (d["namespace"], d["name"]) not in into:
                    into[(d["namespace"], d["name"])] = fields
    return runs


def children(runs: dict[str, Run], parent: Run) -> list[Run]:
    """The runs whose parent is `parent`, by start time."""
    return sorted((r for r in runs.values() if r.parent and r.parent[2] == parent.run_id),
                  key=lambda r: r.started or "")


SPARK_APPLICATION = "SPARK/APPLICATION"


def applications(runs: dict[str, Run], job: str | None = None) -> list[Run]:
    """The Spark applications' runs (of job `job` if given: `lakehouse_etl`), oldest first."""
    return sorted((r for r in runs.values() if r.job_type == SPARK_APPLICATION and job in (None, r.job)),
                  key=lambda r: r.started or "")


def dataset_name(d: Dataset) -> str:
    """A dataset as the catalog names it (`silver/orders`) when it is a lake table, else `namespace:name`."""
    namespace, name = d
    relative = lake_relative(name)
    return relative if relative != name else f"{namespace}:{name}"


@dataclass(frozen=True)
class Edge:
    """One write of an application: what its plan read, the job, what it wrote."""

    inputs: tuple[str, ...]
    job: str
    outputs: tuple[str, ...]
    run_id: str


def edges(runs: dict[str, Run], app: Run) -> list[Edge]:
    """The application's child runs that wrote something, as edges (lake tables by their catalog names)."""
    return [Edge(tuple(sorted(map(dataset_name, r.inputs))), r.job, tuple(sorted(map(dataset_name, r.outputs))),
                 r.run_id)
            for r in children(runs, app) if r.outputs]


def describe(runs: dict[str, Run], app: Run) -> list[str]:
    """The lines `lakehouse lineage` prints for one application: itself, its parent task, its edges."""
    seconds = app.seconds()
    lines = [f"run {app.run_id}  {app.namespace}/{app.job}  {app.state}"
             + (f" in {seconds:.1f} s" if seconds is not None else "") + f"  (started {app.started})"]
    if app.parent:
        task = runs.get(app.parent[2])
        lines.append(f"parent: {app.parent[0]}/{app.parent[1]} run {app.parent[2]}"
                     + (f" ({task.state})" if task else " (its events are not in these files)"))
        if task:
            for key, datasets in (("inlets", task.inputs), ("outlets", task.outputs)):
                if datasets:
                    lines.append(f"  declared {key}: {', '.join(sorted(map(dataset_name, datasets)))}")
    if app.root and app.root != app.parent:
        lines.append(f"root: {app.root[0]}/{app.root[1]} run {app.root[2]}")
    found = edges(runs, app)
    for edge in found:
        lines.append(f"{', '.join(edge.inputs) or '(no input reported)'}\n"
                     f"  -> {edge.job}\n  -> {', '.join(edge.outputs)}")
    if not found:
        lines.append("no write reported")
    return lines
