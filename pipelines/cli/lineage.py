"""`lakehouse lineage`: one Spark run's lineage from the local OpenLineage events, as a reader of the lake's jobs
sees it (which Airflow task ran it, what each write read and wrote)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import click

from pipelines.runtime import settings
from pipelines.runtime.commands import JSON_OPTION, echo_json

if TYPE_CHECKING:
    from pipelines.monitoring.lineage import Run


@click.command()
@click.option("--file", "files", multiple=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A file of OpenLineage events, JSON lines (repeatable)  "
                   "[default: every *.jsonl of $LAKEHOUSE_LINEAGE_DIR, else lineage/ in $LAKEHOUSE_LOG_DIR]")
@click.option("--job", default="lakehouse_etl", show_default=True,
              help="The Spark application's job name (`lakehouse_<command>`)")
@click.option("--run", "run_id", default=None, help="The application's run id  [default: its newest run]")
@JSON_OPTION
def lineage(files: tuple[Path, ...], job: str, run_id: str | None, as_json: bool) -> None:
    """The lineage of one Spark run, from the local OpenLineage events: its Airflow task, then each write as
    `inputs -> job -> outputs` (lake tables by their catalog names)."""
    from pipelines.monitoring import lineage as ol

    paths = list(files) or ol.default_files()
    if not paths:
        raise click.ClickException(f"no OpenLineage events in {settings.lineage_dir()} (is [lineage] of "
                                   "hudi_configs/spark.toml enabled, with the file transport?)")
    runs = ol.fold(ol.read_events(paths))
    apps = [r for r in ol.applications(runs, job) if run_id in (None, r.run_id)]
    if not apps:
        known = sorted({r.job for r in ol.applications(runs)})
        raise click.ClickException(f"no run of {job}" + (f" with id {run_id}" if run_id else "")
                                   + f" in {', '.join(map(str, paths))}; applications there: {', '.join(known)}")
    if as_json:
        echo_json(_lineage_document(runs, apps[-1]))
    else:
        click.echo("\n".join(ol.describe(runs, apps[-1])))


def _lineage_document(runs: dict[str, Run], app: Run) -> dict:
    """`lineage --json`: the application's run, its parent (the Airflow task) and root, and its writes."""
    from pipelines.monitoring import lineage as ol

    def run_ref(ref: tuple[str, str, str] | None) -> dict | None:
        if ref is None:
            return None
        task = runs.get(ref[2])
        return {"namespace": ref[0], "job": ref[1], "run_id": ref[2], "state": task.state if task else None}

    parent = runs.get(app.parent[2]) if app.parent else None
    return {"run_id": app.run_id, "namespace": app.namespace, "job": app.job, "state": app.state,
            "started": app.started, "ended": app.ended, "seconds": app.seconds(),
            "parent": run_ref(app.parent), "root": run_ref(app.root),
            "declared": {"inlets": sorted(map(ol.dataset_name, parent.inputs)) if parent else [],
                         "outlets": sorted(map(ol.dataset_name, parent.outputs)) if parent else []},
            "writes": [asdict(edge) for edge in ol.edges(runs, app)]}
