"""`lakehouse status`, `show` and `dead-letters`: what operators look at in the lake, read with hudi-rs, no Spark.

Apart from pipelines/cli/app.py, whose commands write the lake: these only read it (`dead-letters replay`
sends records back to Kafka), and they answer in a second even while a job holds the lake.
"""

from __future__ import annotations

import time

import click

from pipelines.lake.declaration import declared
from pipelines.runtime import settings
from pipelines.runtime.local_process import require_kafka


def _deleted_keys(table: str, key: tuple[str, ...]) -> int:
    """Keys whose newest recorded change is a delete (change log and delete ledger against main), by the
    table's own key: a declared table's may be composite, or named otherwise than `id`."""
    from pipelines.lake.table_stats import has_completed_commit, read_table
    from pipelines.runtime.settings import changelog_path, ledger_path, main_path

    newest: dict[tuple, tuple[int, bool]] = {}
    sources = [(main_path(table), False), (changelog_path(table), None), (ledger_path(table), True)]
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


def _freshness(fresh: dict, since_beat: float) -> str:
    """A table's line in `status`: how long its oldest waiting change has waited, against its target."""
    target = fresh["target"]
    if fresh.get("age") is None:
        return f"nothing waiting / {target:.0f}s"
    age = fresh["age"] + since_beat
    late = "  BEHIND" if age > target else ""
    return f"{age:.0f}s ({fresh['waiting']} changes) / {target:.0f}s{late}"


@click.command()
def status() -> None:
    """Per bronze, silver and gold table: rows, commits, file groups, log files, deletes, dead letters, quarantine;
    the stream's health, and while it runs, each bronze table's freshness against its target.

    Read with hudi-rs: no Spark needed.
    """
    from pipelines.lake.catalog import lake_catalog, lake_table
    from pipelines.lake.table_stats import has_completed_commit, read_table, table_stats
    from pipelines.runtime.settings import dead_letter_path

    dead: dict[str, int] = {}
    reasons: list[tuple[str, str]] = []
    if has_completed_commit(dead_letter_path()):
        letters = read_table(dead_letter_path(), ["kafka_topic", "reason"])
        reasons = list(zip(letters.column("kafka_topic").to_pylist(), letters.column("reason").to_pylist(),
                           strict=True))
        for t, _ in reasons:
            dead[t] = dead.get(t, 0) + 1
    from pipelines.ingest.stream import ControlFiles, judge, limits

    click.echo(f"lake root: {settings.lake_root()}")
    beat = ControlFiles(settings.lake_root()).heartbeat()
    health = judge(beat, limits())
    click.echo(f"stream: {health.state}: {health.why}")
    # Each bronze table's freshness as the running stream's last heartbeat saw it (a stopped stream has
    # written what waited: it commits the tables' waiting changes as it stops).
    freshness = (beat.tables or {}) if beat is not None and health.live else {}
    click.echo(f"{'table':<18}{'rows':>9}{'commits':>9}{'file groups':>13}{'log files':>11}{'deleted keys':>14}"
               f"{'dead letters':>14}  freshness (oldest waiting change / target)")
    # The catalog's tables that people read: bronze's and silver's of each source table, gold's
    # aggregates; not the internal ones (names with a `_` part: change logs, ledgers, quarantine).
    topic = declared().topic
    for table in [t for t in lake_catalog() if "/_" not in t.name]:
        path = table.path()
        if not has_completed_commit(path):
            if table.layer == "bronze":
                click.echo(f"{table.name:<18}  (not created yet)")
            continue
        s = table_stats(path)
        line = f"{table.name:<18}{s.rows:>9}{s.commits:>9}{s.file_groups:>13}{s.log_files:>11}"
        if table.layer == "bronze" and table.source is not None:
            line += f"{_deleted_keys(table.source, table.key):>14}{dead.get(topic(table.source), 0):>14}"
            if beat is not None and (fresh := freshness.get(table.source)) is not None:
                line += "  " + _freshness(fresh, time.time() - beat.written_at)
        elif table.layer == "silver":
            quarantine = lake_table(f"silver/_quarantine/{table.source}").path()
            quarantined = table_stats(quarantine).rows if has_completed_commit(quarantine) else 0
            line += f"{'':>14}{'':>14}  quarantined: {quarantined}"
        click.echo(line)
    from pipelines.ingest.schema_cli import held_tables

    for name, (n, reason) in sorted(held_tables(reasons).items()):
        click.echo(f"held: {name} ({n} events in the dead-letter store): {reason}; resolve with "
                   "`lakehouse schema accept`, then `lakehouse dead-letters replay --reason schema`")


@click.command()
@click.argument("table")
@click.option("--limit", type=click.IntRange(min=1), default=10, show_default=True)
def show(table: str, limit: int) -> None:
    """Print the first rows of a lake table (e.g. gold/daily_revenue), by key order; read with hudi-rs."""
    from pipelines.lake.table_stats import has_completed_commit, read_table

    path = settings.table_path(*table.split("/", 1))
    if not has_completed_commit(path):
        raise click.ClickException(f"no table {table} under {settings.lake_root()}")
    data = read_table(path)
    columns = [c for c in data.column_names if not c.startswith("_")]
    rows = sorted(data.select(columns).to_pylist(), key=lambda r: tuple((v is None, v) for v in r.values()))[:limit]
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
def dead_letters_list(limit: int) -> None:
    """Print the newest dead letters: Kafka position, reason and the start of the raw value."""
    from pipelines.lake.table_stats import has_completed_commit, read_table
    from pipelines.runtime.settings import dead_letter_path

    if not has_completed_commit(dead_letter_path()):
        click.echo("no dead letters")
        return
    rows = sorted(read_table(dead_letter_path(), ["position", "reason", "value", "kafka_offset"]).to_pylist(),
                  key=lambda r: r["kafka_offset"], reverse=True)
    click.echo(f"{len(rows)} dead letters")
    for r in rows[:limit]:
        value = r["value"][:80] if r["value"] is not None else b""
        click.echo(f"{r['position']}\t{r['reason']}\t{value!r}")


@dead_letters.command("replay")
@click.option("--position", "positions", multiple=True, help="topic/partition/offset to replay (repeatable).")
@click.option("--all", "replay_all", is_flag=True, help="Replay every dead letter.")
@click.option("--reason", "reason", default=None, help="Replay the dead letters whose reason starts with this "
              "(e.g. `schema`: the events a schema change held).")
@click.option("--bootstrap", default=None, help="Kafka brokers  [default: $KAFKA_BOOTSTRAP_SERVERS]")
def dead_letters_replay(positions: tuple[str, ...], replay_all: bool, reason: str | None,
                        bootstrap: str | None) -> None:
    """Send dead letters back to their source topic, unchanged, once the cause is fixed.

    A record that is still unusable lands in the dead-letter store again, at its new position.
    """
    from kafka import KafkaProducer

    from pipelines.lake.table_stats import has_completed_commit, read_table
    from pipelines.runtime.settings import dead_letter_path

    if not positions and not replay_all and not reason:
        raise click.UsageError("name --position ..., --reason or --all")
    if not has_completed_commit(dead_letter_path()):
        raise click.ClickException(f"no dead-letter store at {dead_letter_path()}")
    rows = read_table(dead_letter_path(), ["position", "kafka_topic", "key", "value", "reason"]).to_pylist()
    wanted = rows if replay_all else [r for r in rows if r["position"] in set(positions)
                                      or (reason and (r["reason"] or "").startswith(reason))]
    missing = set(positions) - {r["position"] for r in rows}
    if missing:
        raise click.ClickException(f"no dead letter at {', '.join(sorted(missing))}")
    brokers = bootstrap or settings.kafka_bootstrap()
    require_kafka(brokers, click.ClickException)
    producer = KafkaProducer(bootstrap_servers=brokers, acks="all")
    for r in wanted:
        producer.send(r["kafka_topic"], key=r["key"], value=r["value"])
    producer.flush()
    producer.close()
    click.echo(f"replayed {len(wanted)} dead letters to {brokers}")
