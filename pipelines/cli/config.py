"""`lakehouse config show|schema`: the effective configuration and where each setting came from, and the JSON
Schema of the file (pipelines/runtime/config.py)."""

from __future__ import annotations

import click

from pipelines.runtime.commands import JSON_OPTION, echo_json, pass_lake
from pipelines.runtime.config import Config, effective
from pipelines.runtime.lake import Lake


@click.group("config")
def config() -> None:
    """The configuration: lakehouse.toml, its profile, the environment and the flags, as in force."""


@config.command("show")
@JSON_OPTION
@pass_lake
def config_show(lake: Lake, as_json: bool) -> None:
    """Every setting in force, with where it came from (a flag, a variable, the file's profile or section, the
    default); a secret shows where it is, never its value."""
    loaded = lake.loaded
    resolved = {"lake.root": lake.root, "lake.tables": lake.declaration.path}  # what no setting means, named
    rows = [(k, resolved.get(k, v) if v is None else v, source) for k, v, source in effective(loaded)]
    if as_json:
        echo_json({"file": str(loaded.path) if loaded.path else None, "profile": loaded.profile,
                   "settings": [{"setting": k, "value": v, "from": source} for k, v, source in rows]})
        return
    click.echo(f"file: {loaded.path or '(none: the embedded defaults)'}; profile: {loaded.profile}")
    width = max(len(k) for k, _, _ in rows)
    for key, value, source in rows:
        click.echo(f"{key:<{width}}  {'-' if value is None else value}  ({source})")


@config.command("schema")
def config_schema() -> None:
    """The JSON Schema of lakehouse.toml's sections (what docs/lakehouse.schema.json publishes)."""
    echo_json(schema())


def schema() -> dict:
    """The file's JSON Schema: the sections, and `profiles` of the same sections."""
    sections = Config.model_json_schema()
    profile = {"type": "object", "additionalProperties": False, "properties": dict(sections["properties"])}
    sections["properties"]["profiles"] = {"type": "object", "additionalProperties": profile,
                                          "description": "Named sets of sections over the file's own ones."}
    sections["title"] = "lakehouse.toml"
    return sections
