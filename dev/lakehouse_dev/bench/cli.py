"""`lakehouse dev bench ...`: each benchmark as a command; `all` is what `make bench` runs."""

from __future__ import annotations

import os
from pathlib import Path

import click

from pipelines.runtime import settings

# Kept here (not imported from lakehouse_dev.bench.commits) so that `--help` starts no Spark import.
_COMMIT_VARIANTS = ("project", "timeline_server_off", "timeline_server_markers", "no_auto_clean",
                    "clean_every_10_commits", "no_auto_archive", "metadata_table")
# Freshness is measured at the rate of its goal (p95 at most 15 s at 2,000 records/s),
# by `bench freshness` and by `bench all` alike.
FRESHNESS_RATE = 2000.0
# A new ingest JVM compiles Spark's and Hudi's code for its first minutes (dev/lakehouse_dev/bench/
# freshness.py, run): the counted minutes follow this much steady production, as a stream's days would.
FRESHNESS_WARMUP_MINUTES = 3.0
# Kept here (not imported from soak_plan) so that `--help` imports no numpy.
_SOAK_KINDS = ("broker_kill", "kafka_blackout", "postgres_restart", "postgres_blackout", "kafka_latency",
               "kafka_bandwidth", "kafka_reset_peer", "postgres_latency")
SEED = click.option("--seed", type=int, default=7, show_default=True, help="Generator seed (same seed, same data).")
TRIGGER = click.option("--trigger-seconds", type=click.FloatRange(min=0), default=settings.INGEST_TRIGGER_SECONDS,
                       show_default=True, help="The ingest stream's micro-batch interval.")


@click.group()
@click.option("--sink", type=click.Choice(["kafka", "sql"]), envvar="LAKEHOUSE_BENCH_SINK", default="kafka",
              show_default=True,
              help="How backlogs reach Kafka: the generator's records (kafka), or its changes as SQL on a real "
                   "PostgreSQL captured by Debezium (sql; ingest, etl, erasure, reads).")
def bench(sink: str) -> None:
    """Benchmarks: figures printed, saved as JSON and plotted to PNG in LAKEHOUSE_BENCH_DIR (default .bench/)."""
    os.environ["LAKEHOUSE_BENCH_SINK"] = sink  # read where each benchmark's broker starts (bench/common.py)


@bench.command()
@click.option("--events", type=click.IntRange(min=1000), default=1_000_000, show_default=True,
              help="Backlog size in change events (60% snapshot, 20% updates, 5% deletes).")
@click.option("--contender", "contenders", multiple=True,
              type=click.Choice(["lakehouse", "lakehouse_before_tuning", "lakehouse_cluster", "hudi_sink",
                                 "parquet"]),
              help="Run only these; repeatable  [default: all five]")
@click.option("--overrides", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="A LAKEHOUSE_HUDI_OVERRIDES file for the Hudi writers (tuning experiments).")
@SEED
def ingest(events: int, contenders: tuple[str, ...], overrides: Path | None, seed: int) -> None:
    """Catch-up throughput: the lakehouse job vs Hudi's own streaming sink vs plain Parquet appends, same backlog."""
    from lakehouse_dev.bench import ingest as b

    click.echo(b.report(b.run(events, seed, contenders or b.CONTENDERS, overrides)))


@bench.command()
@click.option("--minutes", type=click.FloatRange(min=0.25), default=5.0, show_default=True,
              help="How long the generator produces at the steady rate.")
@click.option("--rate", type=click.FloatRange(min=1), default=FRESHNESS_RATE, show_default=True,
              help="Kafka records per second, the contract's noise included (BENCHMARKS.md's freshness goal "
                   "is set at 2,000).")
@TRIGGER
@click.option("--warmup-minutes", type=click.FloatRange(min=0), default=FRESHNESS_WARMUP_MINUTES, show_default=True,
              help="Steady production before the counted minutes, while the new ingest JVM compiles its code; "
                   "its figures are reported apart.")
@click.option("--snapshot-rows", type=click.IntRange(min=4), default=2000, show_default=True,
              help="Live rows of the source's snapshot, ingested before the steady phase (a quarter customers): "
                   "how large the tables are that the steady batches change and compact.")
@click.option("--on", "spark_on", multiple=True, type=click.Choice(["local", "cluster"]),
              help="Where the stream's Spark runs: local[2], or a standalone cluster the benchmark starts (a master "
                   "and two one-core workers); both, one after the other, compares them  [default: local]")
@SEED
def freshness(minutes: float, rate: float, trigger_seconds: float, warmup_minutes: float, snapshot_rows: int,
              spark_on: tuple[str, ...], seed: int) -> None:
    """Delay from an event's source time to its visibility in bronze (p50/p95/p99), and lag over time."""
    from lakehouse_dev.bench import freshness as b

    runs = {}
    for where in dict.fromkeys(spark_on or ("local",)):
        runs[where] = b.run(minutes, rate, trigger_seconds, seed, warmup_minutes, snapshot_rows,
                            on_cluster=where == "cluster")
        click.echo(f"{where}:\n{b.report(runs[where])}")
    if len(runs) == 2:
        click.echo(b.compare(runs["local"], runs["cluster"]))


@bench.command(name="tables")
@click.option("--tables", "n_tables", type=click.IntRange(min=1, max=999), default=50, show_default=True,
              help="Declared tables of mixed shapes (keys, composite keys, 1 to 17 columns of every type).")
@click.option("--rate", type=click.FloatRange(min=1), default=FRESHNESS_RATE, show_default=True,
              help="Kafka records per second over all the tables.")
@click.option("--minutes", type=click.FloatRange(min=0.1), default=5.0, show_default=True,
              help="Counted minutes of steady production.")
@click.option("--warmup-minutes", type=click.FloatRange(min=0), default=FRESHNESS_WARMUP_MINUTES, show_default=True,
              help="Steady production before the counted minutes, while the new ingest JVM compiles its code.")
@TRIGGER
@click.option("--zipf", "exponent", type=click.FloatRange(min=0), default=2.0, show_default=True,
              help="Exponent of the tables' Zipf shares of the records (2: the busiest 5 of 50 take 90%; 0: even).")
@click.option("--hot", type=click.IntRange(min=1), default=5, show_default=True,
              help="The busiest tables, compared with the shop's freshness.")
@click.option("--target", type=click.FloatRange(min=1, max=86400), default=15.0, show_default=True,
              help="Every table's freshness_seconds in the declaration.")
@click.option("--cold-target", type=click.FloatRange(min=1, max=86400), default=None,
              help="freshness_seconds of the tables beyond the --hot busiest  [default: --target]")
@click.option("--snapshot-rows", type=click.IntRange(min=0), default=2000, show_default=True,
              help="Snapshot rows over all the tables, by their shares (at least 20 each), ingested first.")
@click.option("--reference/--no-reference", default=True, show_default=True,
              help="Also run the shop's two-table freshness at the same rate (the hot tables' goal).")
@click.option("--reference-minutes", type=click.FloatRange(min=0.1), default=None,
              help="Counted minutes of the shop's run  [default: --minutes]")
@click.option("--reference-warmup-minutes", type=click.FloatRange(min=0), default=None,
              help="Its warm-up  [default: --warmup-minutes]")
@click.option("--reference-from", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="The shop's figures saved by `bench freshness` at the same rate in this session (freshness.json), "
                   "instead of a run of its own.")
@click.option("--deployments/--no-deployments", default=True, show_default=True,
              help="Also run the busiest --touched tables' changes on deployments of --touched, --small and all "
                   "the tables: batch time, start and peak driver memory.")
@click.option("--touched", type=click.IntRange(min=1), default=3, show_default=True,
              help="Tables the deployments' batches touch.")
@click.option("--small", type=click.IntRange(min=1), default=5, show_default=True,
              help="The small deployment whose start and memory the full one's are set against.")
@click.option("--deployment-minutes", type=click.FloatRange(min=0.1), default=1.0, show_default=True,
              help="Counted minutes of each deployment's run.")
@click.option("--deployment-warmup-minutes", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="Each deployment's warm-up (a new JVM each).")
@SEED
def tables(n_tables: int, rate: float, minutes: float, warmup_minutes: float, trigger_seconds: float, exponent: float,
           hot: int, target: float, cold_target: float | None, snapshot_rows: int, reference: bool,
           reference_minutes: float | None, reference_warmup_minutes: float | None, reference_from: Path | None,
           deployments: bool, touched: int, small: int, deployment_minutes: float, deployment_warmup_minutes: float,
           seed: int) -> None:
    """Many declared tables in one stream: per-table freshness against each table's target, the hot tables against
    the shop, and what idle tables cost a batch, the start and the driver's memory."""
    from lakehouse_dev.bench import tables as b

    plan = b.Plan(n_tables, rate, minutes, warmup_minutes, trigger_seconds, exponent, min(hot, n_tables), target,
                  cold_target, snapshot_rows, seed,
                  reference_minutes=(reference_minutes or minutes) if reference else 0.0,
                  reference_warmup_minutes=warmup_minutes if reference_warmup_minutes is None
                  else reference_warmup_minutes,
                  reference_from=reference_from if reference else None, deployments=deployments,
                  touched=min(touched, n_tables), small=small, deployment_minutes=deployment_minutes,
                  deployment_warmup_minutes=deployment_warmup_minutes)
    click.echo(b.report(b.run(plan)))


@bench.command()
@click.option("--events", type=click.IntRange(min=1000), default=300_000, show_default=True,
              help="Backlog the lake is built from.")
@SEED
def etl(events: int, seed: int) -> None:
    """Incremental etl cycle after 0.1%, 1% and 10% of the rows changed, against a full rebuild."""
    from lakehouse_dev.bench import etl as b

    click.echo(b.report(b.run(events, seed)))


@bench.command()
@click.option("--rows", "sizes", type=click.IntRange(min=1000), multiple=True,
              help="Live rows of the lakes (snapshot size); repeatable  [default: 100000 and 1000000]")
@click.option("--changes", type=click.IntRange(min=0), default=20_000, show_default=True,
              help="Change events after the snapshot (orders move between customers among them).")
@click.option("--customers", type=click.IntRange(min=1), default=10, show_default=True,
              help="Customers erased together in the batch run (after a run erasing one).")
@click.option("--rebuild", is_flag=True, help="Build the lakes anew instead of reusing those built before.")
@click.option("--one/--no-one", default=True, show_default=True,
              help="Also erase one customer alone, before the batch (each run on its own copy of the lake).")
@SEED
def erasure(sizes: tuple[int, ...], changes: int, customers: int, rebuild: bool, one: bool, seed: int) -> None:
    """Wall time of erasing one customer, then a batch of customers in one run, at two lake sizes."""
    from lakehouse_dev.bench import erasure as b

    click.echo(b.report(b.run(sizes or b.SIZES, changes, customers, seed, rebuild, one)))


@bench.command()
@click.option("--events", type=click.IntRange(min=1000), default=200_000, show_default=True, help="Backlog size.")
@click.option("--batches", type=click.IntRange(min=2), default=40, show_default=True,
              help="Micro-batches the backlog is ingested in (log files per file group).")
@SEED
def reads(events: int, batches: int, seed: int) -> None:
    """Bronze snapshot query time with many log files, before and after compaction."""
    from lakehouse_dev.bench import reads as b

    click.echo(b.report(b.run(events, batches, seed)))


@bench.command()
@click.option("--rows", "sizes", type=click.IntRange(min=1000), multiple=True,
              help="Live rows of the bronze tables (customers and orders together); repeatable  "
                   "[default: 100000 and 2000000]")
@click.option("--changes", type=click.IntRange(min=100), default=10_000, show_default=True,
              help="Change events in the measured batch.")
@SEED
def scale(sizes: tuple[int, ...], changes: int, seed: int) -> None:
    """The same batch of changes against bronze tables of two sizes: batch time must follow the batch, not the table."""
    from lakehouse_dev.bench import scale as b

    if len(set(sizes)) == 1:
        raise click.BadParameter("give two different sizes (or none for the defaults)", param_hint="--rows")
    click.echo(b.report(b.run(sizes or b.SIZES, changes, seed)))


@bench.command()
@click.option("--rows", type=click.IntRange(min=1), default=2_000, show_default=True, help="Rows per commit.")
@click.option("--warm-up", type=click.IntRange(min=0), default=3, show_default=True,
              help="Commits before the measured ones (JIT, first commit of a table).")
@click.option("--commits", type=click.IntRange(min=1), default=8, show_default=True,
              help="Measured commits per variant; the median is the figure.")
@click.option("--variant", "variants", multiple=True, type=click.Choice(list(_COMMIT_VARIANTS)),
              help="Run only these; repeatable  [default: all]")
def commits(rows: int, warm_up: int, commits: int, variants: tuple[str, ...]) -> None:
    """The fixed cost of one bronze commit (main and change log), with one writer option changed at a time."""
    from lakehouse_dev.bench import commits as b

    chosen = variants or tuple(_COMMIT_VARIANTS)
    click.echo(b.report(b.run(rows, warm_up, commits, chosen if "project" in chosen else ("project", *chosen))))


@bench.command()
@click.option("--minutes", type=click.FloatRange(min=1), default=30.0, show_default=True,
              help="How long the steady load runs, warm-up and tail included.")
@click.option("--rate", type=click.FloatRange(min=1), default=FRESHNESS_RATE, show_default=True,
              help="Debezium's records per second (a delete is two: its event and a tombstone), committed in "
                   "PostgreSQL a few changes per transaction.")
@click.option("--every", "every_minutes", type=click.FloatRange(min=0.5), default=3.0, show_default=True,
              help="Minutes between faults: one fault at a random time in each slot of this length.")
@click.option("--fault", "kinds", multiple=True, type=click.Choice(_SOAK_KINDS),
              help="Fault kinds to draw from; repeatable (postgres_blackout and postgres_latency: on Debezium's "
                   "connections to PostgreSQL)  [default: broker_kill, kafka_blackout, postgres_restart, "
                   "postgres_blackout]")
@click.option("--fault-seconds", type=click.FloatRange(min=1), default=None,
              help="Every fault's duration  [default: per kind: broker_kill 30, kafka_blackout and "
                   "postgres_blackout 60, postgres_restart 20, toxics 60 (reset_peer 30)]")
@click.option("--warmup-minutes", type=click.FloatRange(min=0), default=FRESHNESS_WARMUP_MINUTES, show_default=True,
              help="No fault before this (the new JVM compiles its code); its freshness is reported apart.")
@click.option("--tail-minutes", type=click.FloatRange(min=0), default=3.0, show_default=True,
              help="No fault in the last minutes of the load: room for the last recovery.")
@TRIGGER
@click.option("--snapshot-rows", type=click.IntRange(min=4), default=2000, show_default=True,
              help="Rows in the database before Debezium's first snapshot (a quarter customers).")
@click.option("--ensure-seconds", type=click.FloatRange(min=5), default=300.0, show_default=True,
              help="`lakehouse stream ensure` this often, as the bronze_ingest_stream DAG's schedule runs it.")
@click.option("--etl/--no-etl", default=True, show_default=True,
              help="After the check of bronze, one `lakehouse etl`, and silver with its quarantine checked too.")
@SEED
def soak(minutes: float, rate: float, every_minutes: float, kinds: tuple[str, ...], fault_seconds: float | None,
         warmup_minutes: float, tail_minutes: float, trigger_seconds: float, snapshot_rows: int,
         ensure_seconds: float, etl: bool, seed: int) -> None:
    """The real source (PostgreSQL + Debezium) at a steady rate into the supervised stream for --minutes, a fault
    from a seeded schedule every few minutes; then rows lost / duplicated / resurrected per table against
    PostgreSQL, recovery per fault, freshness during and outside faults, the driver JVM's memory over the run
    (its live set, after a full collection, every 2 minutes).

    About --minutes plus 5 to 10 (start, catch-up, checks). Not part of `bench all`."""
    from lakehouse_dev.bench import soak as b

    plan = b.SoakPlan(minutes, rate, seed, every_minutes, kinds or b.DEFAULT_KINDS, warmup_minutes, tail_minutes,
                      fault_seconds, trigger_seconds, snapshot_rows, ensure_seconds, etl)
    if not plan.faults:
        raise click.BadParameter("no fault fits: give more --minutes, a shorter --every or --fault-seconds",
                                 param_hint="--minutes")
    click.echo(b.report(b.run(plan)))


@bench.command(name="reconcile")
@click.option("--rows", type=click.IntRange(min=3000), default=1_000_000, show_default=True,
              help="Rows of the declared table generated in PostgreSQL and ingested through Debezium's snapshot "
                   "(BENCHMARKS.md's goal is at 10,000,000).")
@TRIGGER
@click.option("--ingest-timeout", type=click.FloatRange(min=60), default=3600.0, show_default=True,
              help="Seconds the ingest of the rows may take before the benchmark gives up.")
@click.option("--heal-timeout", type=click.FloatRange(min=10), default=900.0, show_default=True,
              help="Seconds the heal may take before the benchmark fails.")
@SEED
def reconcile(rows: int, trigger_seconds: float, ingest_timeout: float, heal_timeout: float, seed: int) -> None:
    """`lakehouse reconcile` on a clean lake and on one with 0.01% drift (made behind the pipeline's back; the
    drift found must be exactly it), a full comparison of every row for reference, and the heal's time.

    The table is ingested through the real source first (about 3 minutes per million rows here). Not part of
    `bench all`."""
    from lakehouse_dev.bench import reconcile as b

    click.echo(b.report(b.run(b.Plan(rows, seed, trigger_seconds, ingest_timeout, heal_timeout))))


@bench.command(name="all")
@click.option("--events", type=click.IntRange(min=1000), default=1_000_000, show_default=True,
              help="Backlog size of the ingest benchmark.")
@click.option("--minutes", type=click.FloatRange(min=0.25), default=5.0, show_default=True,
              help="Length of the freshness run and of the tables run.")
@click.pass_context
def run_all(ctx: click.Context, events: int, minutes: float) -> None:
    """Every benchmark with its defaults, one after the other (about an hour and a half on 2 cores)."""
    from lakehouse_dev.bench.common import bench_dir

    ctx.invoke(ingest, events=events, contenders=(), overrides=None, seed=7)
    ctx.invoke(scale, sizes=(), changes=10_000, seed=7)
    ctx.invoke(freshness, minutes=minutes, rate=FRESHNESS_RATE, trigger_seconds=settings.INGEST_TRIGGER_SECONDS,
               warmup_minutes=FRESHNESS_WARMUP_MINUTES, spark_on=(), seed=7)
    # The shop's reference of `tables` is the freshness run just done: same rate, same session.
    ctx.invoke(tables, minutes=minutes, reference_from=bench_dir() / "freshness.json")
    ctx.invoke(etl, events=300_000, seed=7)
    ctx.invoke(erasure, sizes=(), changes=20_000, customers=10, seed=7)
    ctx.invoke(reads, events=200_000, batches=40, seed=7)


@bench.command(name="parquet-sink")
@click.option("--root", required=True, help="Folder the Parquet files are appended to.")
@click.option("--bootstrap", required=True, help="Kafka brokers.")
def parquet_sink(root: str, bootstrap: str) -> None:
    """The Parquet upper bound's writer (run by `bench ingest`): consume the topics once into Parquet appends."""
    from lakehouse_dev.bench.parquet_sink import run_parquet_sink
    from pipelines.runtime.spark import get_spark

    run_parquet_sink(get_spark("lakehouse-bench-parquet"), root, bootstrap)


@bench.command(name="hudi-sink")
@click.option("--root", required=True, help="Folder of the two Hudi tables (<root>/customers, <root>/orders).")
@click.option("--bootstrap", required=True, help="Kafka brokers.")
def hudi_sink(root: str, bootstrap: str) -> None:
    """The plain-Hudi reference's writer (run by `bench ingest`): Hudi's streaming sink consumes the topics once.

    It stands in for HoodieStreamer, whose bundle Maven Central does not serve here for Hudi 1.0.x
    (`lakehouse_dev.bench.hudi_sink`).
    """
    from lakehouse_dev.bench.hudi_sink import run_hudi_sink
    from pipelines.runtime.spark import get_spark

    run_hudi_sink(get_spark("lakehouse-bench-hudi-sink"), root, bootstrap)
