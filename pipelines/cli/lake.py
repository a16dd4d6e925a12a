"""`lakehouse status`, `show` and `dead-letters`: what operators look at in the lake, read with hudi-rs, no Spark.

Apart from pipelines/cli/app.py, whose commands write the lake: these only read it (`dead-letters replay`
sends records back to Kafka), and they answer in a second even while a job holds the lake.
"""

from __future__ import annotations

import time

import click

from pipelines.lake.catalog import Table, lake_catalog, lake_table
from pipelines.monitoring.layer_freshness import layer_freshness
from pipelines.runtime.commands import JSON_OPTION, TABLE, echo_json, pass_lake
from pipelines.runtime.kafka_clients import at, described, python_options, require_kafka
from pipelines.runtime.lake import Lake


def _deleted_keys(root: str, table: str, key: tuple[str, ...]) -> int:
    """Keys whose newest recorded change is a delete (change log and delete ledger against main), by the
    table's own key: a declared table's may be composite, or named otherwise than `id`."""
    from pipelines.lake.layout import changelog_path, ledger_path, main_path
    from pipelines.lake.table_stats import has_completed_commit, read_table

    newest: dict[tuple, tuple[int, bool]] = {}
    sources = [(main_path(table, root), False), (changelog_path(table, root), None), (ledger_path(table, root), True)]
    for path, deleted in sources:
        if not has_completed_commit(path):
            continue
        columns = [*key, "_lsn"] + (["_op"] if deleted is None else [])
        for r in read_table(path, columns).to_pylist():
            is_delete = r["_op"] == "d" if deleted is None else deleted
            k = tuple(r[c] for c in key)
            if k not in newest or newest[k][0] < r["_lsn"]:
                newest[k] = (r["_lsn"], is_delete)
    return sum(d for _, d in newest.values())


def _freshness(fresh: dict, since_beat: float) -> dict:
    """A bronze table's freshness as the running stream's last heartbeat saw it, aged to now: its oldest waiting
    change's age (None: nothing waits) and how many wait, against its target."""
    age = None if fresh.get("age") is None else fresh["age"] + since_beat
    return {"age_seconds": age, "waiting": fresh.get("waiting", 0), "target_seconds": fresh["target"],
            "behind": age is not None and age > fresh["target"]}


def _freshness_text(fresh: dict) -> str:
    """A table's freshness in `status`'s text: how long its oldest waiting change has waited, against its target."""
    target = fresh["target_seconds"]
    if fresh["age_seconds"] is None:
        return f"nothing waiting / {target:.0f}s"
    late = "  BEHIND" if fresh["behind"] else ""
    return f"{fresh['age_seconds']:.0f}s ({fresh['waiting']} changes) / {target:.0f}s{late}"


def _dead_letter_reasons(root: str) -> list[tuple[str, str]]:
    """(topic, reason) of every dead letter; none before the store's first commit."""
    from pipelines.lake.layout import dead_letter_path
    from pipelines.lake.table_stats import has_completed_commit, read_table

    if not has_completed_commit(store := dead_letter_path(root)):
        return []
    letters = read_table(store, ["kafka_topic", "reason"])
    return list(zip(letters.column("kafka_topic").to_pylist(), letters.column("reason").to_pylist(), strict=True))


def _layer_text(fresh: dict) -> str:
    """A silver or gold table's freshness in `status`'s text: how long the oldest change bronze holds and it does
    not has waited, against the target."""
    target = fresh["target_seconds"]
    if not fresh["waiting_commits"]:
        return f"nothing waiting / {target:.0f}s"
    late = "  BEHIND" if fresh["behind"] else ""
    return f"{fresh['waiting_seconds']:.0f}s ({fresh['waiting_commits']} commits) / {target:.0f}s{late}"


def _table_row(lake: Lake, table: Table, dead: dict[str, int], freshness: dict[str, dict],
               since_beat: float) -> dict | None:
    """One table's row of `status`; None for a silver or gold table not written yet (a bronze one is listed as not
    created: the stream writes it first)."""
    from pipelines.lake.table_stats import has_completed_commit, table_stats

    row: dict = {"table": table.name, "layer": table.layer}
    if not has_completed_commit(path := table.path(lake.root)):
        return {**row, "created": False} if table.layer == "bronze" else None
    s = table_stats(path)
    row |= {"created": True, "rows": s.rows, "commits": s.commits, "file_groups": s.file_groups,
            "log_files": s.log_files}
    if table.layer == "bronze" and table.source is not None:  # every bronze table people read follows a source
        row |= {"deleted_keys": _deleted_keys(lake.root, table.source, table.key),
                "dead_letters": dead.get(lake.declaration.topic(table.source), 0),
                "freshness": None if (fresh := freshness.get(table.source)) is None else _freshness(fresh, since_beat)}
    else:
        row["freshness"] = freshness.get(table.name)
    if table.layer == "silver":
        quarantine = lake_table(f"silver/_quarantine/{table.source}", lake.declaration).path(lake.root)
        row["quarantined"] = table_stats(quarantine).rows if has_completed_commit(quarantine) else 0
    return row


def lake_status(lake: Lake) -> dict:
    """What `lakehouse status` reports, as one document: the lake root, the stream's health, a row per table that
    people read, and the tables a schema change holds."""
    from pipelines.ingest.schema_cli import held_tables
    from pipelines.ingest.stream import ControlFiles, judge, limits

    reasons = _dead_letter_reasons(lake.root)
    dead: dict[str, int] = {}
    for topic, _ in reasons:
        dead[topic] = dead.get(topic, 0) + 1
    beat = ControlFiles(lake.root).heartbeat()
    health = judge(beat, limits())
    # Each bronze table's freshness as the running stream's last heartbeat saw it (a stopped stream has
    # written what waited: it commits the tables' waiting changes as it stops).
    freshness = (beat.tables or {}) if beat is not None and health.live else {}
    since_beat = time.time() - beat.written_at if beat is not None else 0.0
    # Silver's and gold's, from their timelines: how long what bronze holds and they do not has waited.
    freshness |= {name: f.as_dict() for name, f in layer_freshness(lake.root, lake.declaration).items()}
    # The catalog's tables that people read: bronze's and silver's of each source table, gold's
    # aggregates; not the internal ones (names with a `_` part: change logs, ledgers, quarantine).
    rows = [_table_row(lake, t, dead, freshness, since_beat)
            for t in lake_catalog(lake.declaration) if "/_" not in t.name]
    held = [{"table": table, "events": n, "reason": reason}
            for table, (n, reason) in sorted(held_tables(reasons, lake.root).items())]
    return {"lake_root": lake.root, "stream": {"state": health.state, "why": health.why},
            "tables": [r for r in rows if r is not None], "held": held}


def _status_text(doc: dict) -> list[str]:
    """`status`'s lines: the lake root, the stream, a table of the tables, then each held table."""
    lines = [f"lake root: {doc['lake_root']}", f"stream: {doc['stream']['state']}: {doc['stream']['why']}",
             f"{'table':<18}{'rows':>9}{'commits':>9}{'file groups':>13}{'log files':>11}{'deleted keys':>14}"
             f"{'dead letters':>14}  freshness (oldest waiting change / target; silver, gold: behind bronze)"]
    for r in doc["tables"]:
        if not r["created"]:
            lines.append(f"{r['table']:<18}  (not created yet)")
            continue
        line = f"{r['table']:<18}{r['rows']:>9}{r['commits']:>9}{r['file_groups']:>13}{r['log_files']:>11}"
        if r["layer"] == "bronze":
            line += f"{r['deleted_keys']:>14}{r['dead_letters']:>14}"
            if r["freshness"] is not None:
                line += "  " + _freshness_text(r["freshness"])
        else:
            line += f"{'':>14}{'':>14}"
            if r["freshness"] is not None:
                line += "  " + _layer_text(r["freshness"])
            if r["layer"] == "silver":
                line += f"  quarantined: {r['quarantined']}"
        lines.append(line)
    lines += [f"held: {h['table']} ({h['events']} events in the dead-letter store): {h['reason']}; resolve with "
              "`lakehouse schema accept`, then `lakehouse dead-letters replay --reason schema`" for h in doc["held"]]
    return lines


@click.command()
@JSON_OPTION
@pass_lake
def status(lake: Lake, as_json: bool) -> None:
    """Per bronze, silver and gold table: rows, commits, file groups, log files, deletes, dead letters, quarantine;
    the stream's health, and while it runs, each bronze table's freshness against its target.

    Read with hudi-rs: no Spark needed.
    """
    doc = lake_status(lake)
    if as_json:
        echo_json(doc)
    else:
        click.echo("\n".join(_status_text(doc)))


@click.command()
@click.argument("table", type=TABLE)
@click.option("--limit", type=click.IntRange(min=1), default=10, show_default=True)
@JSON_OPTION
@pass_lake
def show(lake: Lake, table: str, limit: int, as_json: bool) -> None:
    """Print the first rows of a lake table (gold/daily_revenue or gold.daily_revenue), by key order, columns
    starting with `_` left out; read with hudi-rs."""
    from pipelines.lake.table_stats import has_completed_commit, read_table

    path = lake_table(table, lake.declaration).path(lake.root)
    if not has_completed_commit(path):
        raise click.ClickException(f"no table {table} under {lake.root} (not written yet)")
    data = read_table(path)
    columns = [c for c in data.column_names if not c.startswith("_")]
    rows = sorted(data.select(columns).to_pylist(), key=lambda r: tuple((v is None, v) for v in r.values()))[:limit]
    if as_json:
        echo_json({"table": table, "rows": data.num_rows, "columns": columns, "first": rows})
        return
    cells = [columns] + [[str(r[c]) for c in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    click.echo(f"{table}: {data.num_rows} rows")
    for row in cells:
        click.echo("  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)))


@click.group("dead-letters")
def dead_letters() -> None:
    """Inspect and replay the Kafka records that ingest could not use."""


@dead_letters.command("list")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
@JSON_OPTION
@pass_lake
def dead_letters_list(lake: Lake, limit: int, as_json: bool) -> None:
    """Print the newest dead letters: Kafka position, reason and the start of the raw value."""
    from pipelines.lake.layout import dead_letter_path
    from pipelines.lake.table_stats import has_completed_commit, read_table

    rows = []
    if has_completed_commit(store := dead_letter_path(lake.root)):
        rows = sorted(read_table(store, ["position", "reason", "value", "kafka_offset"]).to_pylist(),
                      key=lambda r: r["kafka_offset"], reverse=True)
    if as_json:
        # The raw value's start as text: a record that could not be used may be no UTF-8 at all.
        echo_json({"count": len(rows), "dead_letters": [
            {"position": r["position"], "reason": r["reason"],
             "value_start": (r["value"] or b"")[:80].decode(errors="backslashreplace")} for r in rows[:limit]]})
        return
    if not rows:
        click.echo("no dead letters")
        return
    click.echo(f"{len(rows)} dead letters")
    for r in rows[:limit]:
        value = r["value"][:80] if r["value"] is not None else b""
        click.echo(f"{r['position']}\t{r['reason']}\t{value!r}")


@dead_letters.command("replay")
@click.option("--position", "positions", multiple=True, help="topic/partition/offset to replay (repeatable).")
@click.option("--all", "replay_all", is_flag=True, help="Replay every dead letter.")
@click.option("--reason", "reason", default=None, help="Replay the dead letters whose reason starts with this "
              "(e.g. `schema`: the events a schema change held).")
@click.option("--bootstrap", default=None, help="Kafka brokers  [default: [kafka] bootstrap_servers]")
@pass_lake
def dead_letters_replay(lake: Lake, positions: tuple[str, ...], replay_all: bool, reason: str | None,
                        bootstrap: str | None) -> None:
    """Send dead letters back to their source topic, unchanged, once the cause is fixed.

    A record that is still unusable lands in the dead-letter store again, at its new position.
    """
    from kafka import KafkaProducer

    from pipelines.lake.layout import dead_letter_path
    from pipelines.lake.table_stats import has_completed_commit, read_table

    if not positions and not replay_all and not reason:
        raise click.UsageError("name --position ..., --reason or --all")
    if not has_completed_commit(store := dead_letter_path(lake.root)):
        raise click.ClickException(f"no dead-letter store at {store}")
    rows = read_table(store, ["position", "kafka_topic", "key", "value", "reason"]).to_pylist()
    wanted = rows if replay_all else [r for r in rows if r["position"] in set(positions)
                                      or (reason and (r["reason"] or "").startswith(reason))]
    missing = set(positions) - {r["position"] for r in rows}
    if missing:
        raise click.ClickException(f"no dead letter at {', '.join(sorted(missing))}")
    brokers = at(lake.config.kafka, bootstrap)
    require_kafka(brokers, click.ClickException)
    producer = KafkaProducer(**python_options(brokers), acks="all")
    for r in wanted:
        producer.send(r["kafka_topic"], key=r["key"], value=r["value"])
    producer.flush()
    producer.close()
    click.echo(f"replayed {len(wanted)} dead letters to {described(brokers)}")
