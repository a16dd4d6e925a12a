"""`lakehouse reconcile` at scale: a clean lake, then one with 0.01% drift, against a full comparison.

A declared table of a realistic shape (a bigint key, text, numeric, boolean, timestamptz columns, some NULLs) is
generated in PostgreSQL with generate_series and ingested through the real pipeline: Debezium's initial snapshot
(the real source, dev/lakehouse_dev/pg_source.py) to a private broker, `lakehouse ingest` into bronze, the rows
ingested so far shown as it goes. Then, the stream stopped:

- **clean**: `reconcile_table` with `rounds=0` (a lake no stream writes): its time, buckets, rows read row by row
  from each side; it must find no drift and every row on both sides.
- **drift**: 0.01% of the rows made to differ behind the pipeline's back (Hudi writes of the benchmark's own into
  bronze, which neither the source nor the stream knows of: a third changed, a third deleted, a third added under
  keys the source never had); reconcile again, and the keys it names must be exactly those made, by kind.
- **full comparison**: what reconciling costs without buckets: every row of both sides read, each side's key and
  the md5 of the same canonical text (PostgreSQL by a server-side cursor, bronze by Spark's local iterator), keys
  matched in memory. It must find the same drift.
- **heal**: the stream started again, `heal_table` (an incremental snapshot of the missing and differing keys, a
  delete event for each extra one) and `wait_healed` until bronze matches; timed from the heal's request (the
  stream's own start is reported apart).

The goal (BENCHMARKS.md): 10M rows reconciled in at most 5 minutes on this machine.
Run: `lakehouse dev bench reconcile --help`; `--rows 20000` is a quick check of the whole path.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click

from lakehouse_dev.bench.common import bench_dir, launch_ingest, save, say, table
from lakehouse_dev.kafka_local import KafkaBroker
from lakehouse_dev.pg_source import RealSource
from lakehouse_dev.source_target import dev_environment
from lakehouse_dev.sql_sink import end_offsets
from pipelines.ingest.batch import BatchReport
from pipelines.ingest.stream import ControlFiles
from pipelines.lake.declaration import DECLARATION_VARIABLE, load
from pipelines.runtime.local_process import free_port

NAME = "reconcile"
TABLE = "bench_accounts"
SOURCE = f"public.{TABLE}"
GOAL_ROWS, GOAL_SECONDS = 10_000_000, 300.0
DRIFT_SHARE = 0.0001  # 0.01% of the rows
DDL = (f"CREATE TABLE {SOURCE} (id bigint PRIMARY KEY, owner text NOT NULL, email text, "
       "balance numeric(14,2) NOT NULL, active boolean NOT NULL, opened_at timestamptz NOT NULL, note text)")
# Deterministic rows: a NULL email every 11th, a NULL note every 7th, timestamps spread over years.
FILL = (f"INSERT INTO {SOURCE} SELECT g, 'owner ' || g, CASE WHEN g %% 11 = 0 THEN NULL ELSE 'user' || g || "
        "'@example.com' END, round((g %% 1000003) * 1.37, 2), g %% 3 <> 0, timestamptz '2015-01-01 00:00:00+00' "
        "+ g * interval '17 seconds', CASE WHEN g %% 7 = 0 THEN NULL ELSE md5(g::text) END "
        "FROM generate_series(%s::bigint, %s::bigint) g")
DECLARATION = f'[source]\ntopic_prefix = "shop"\n\n[tables.{TABLE}]\nsource = "{SOURCE}"\nkey = ["id"]\n'
_FILL_CHUNK = 1_000_000
_EXTRA_OFFSET = 10**12  # keys the source never had: a copied row's id shifted by this


@dataclass(frozen=True)
class Plan:
    """What `bench reconcile` runs (its options)."""

    rows: int = 1_000_000
    seed: int = 7
    trigger_seconds: float = 5.0
    ingest_timeout: float = 3600.0
    heal_timeout: float = 900.0


@dataclass
class Drift:
    """The keys made to differ behind the pipeline's back, by the kind reconcile must name them."""

    differ: list[int] = field(default_factory=list)
    missing: list[int] = field(default_factory=list)
    extra: list[int] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {"missing": len(self.missing), "extra": len(self.extra), "differ": len(self.differ)}


@dataclass
class Rig:
    """The running pieces under `home`: the broker, the source, the stream's environment."""

    home: Path
    broker: KafkaBroker
    source: RealSource
    env: dict[str, str]

    @property
    def root(self) -> Path:
        return self.home / "lake"


def drift_keys(rows: int, seed: int) -> Drift:
    """0.01% of `rows` (at least 3), a third each changed, deleted and added (a copy under a new key)."""
    n = max(3, round(rows * DRIFT_SHARE))
    picked = random.Random(seed).sample(range(1, rows + 1), n)
    third = n // 3
    differ, missing, copied = picked[:n - 2 * third], picked[n - 2 * third:n - third], picked[n - third:]
    return Drift(sorted(differ), sorted(missing), sorted(k + _EXTRA_OFFSET for k in copied))


@contextmanager
def rig(home: Path) -> Iterator[Rig]:
    """A broker and the real source (PostgreSQL started, Connect not yet) under a clean `home`; stopped at the end."""
    if home.exists():
        with suppress(Exception):
            RealSource(home / "source").down()
        KafkaBroker(home / "kafka").stop()
        shutil.rmtree(home)
    home.mkdir(parents=True)
    with ExitStack() as stack:
        broker = KafkaBroker(home / "kafka").start()
        stack.callback(broker.stop)
        source = RealSource(home / "source", free_port(), free_port(), broker.bootstrap)
        stack.callback(source.down)
        source.postgres.start()
        (home / "tables.toml").write_text(DECLARATION)
        (home / "erasure.key").write_text("ab" * 32)
        env = {**dev_environment(source.pg_port, source.connect.url), "LAKEHOUSE_ROOT": str(home / "lake"),
               "KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap, DECLARATION_VARIABLE: str(home / "tables.toml"),
               "LAKEHOUSE_ERASURE_KEY_FILE": str(home / "erasure.key"), "LAKEHOUSE_RUN_DIR": str(home / "run")}
        yield Rig(home, broker, source, env)


def fill(r: Rig, rows: int) -> float:
    """The table created and filled in PostgreSQL by generate_series, in chunks; seconds taken."""
    started = time.monotonic()
    with r.source.postgres.connect() as conn:
        conn.autocommit = True
        conn.execute(DDL)
        for first in range(1, rows + 1, _FILL_CHUNK):
            last = min(rows, first + _FILL_CHUNK - 1)
            conn.execute(FILL, (first, last))
            say(f"  PostgreSQL: {last:,} of {rows:,} rows generated")
        conn.execute(f"ANALYZE {SOURCE}")
    return time.monotonic() - started


def launch(r: Rig, log: Path, trigger_seconds: float) -> subprocess.Popen:
    """`lakehouse ingest` on the rig's lake and source, its output appended to `log`."""
    return launch_ingest({**os.environ, **r.env}, log, trigger_seconds)


def stop(r: Rig, ingest: subprocess.Popen) -> None:
    """Ask the stream to stop after its batch (its control file), SIGKILL its group if it does not within 5 min."""
    if ingest.poll() is None:
        ControlFiles(str(r.root)).request_stop("bench reconcile")
        try:
            ingest.wait(timeout=300)
        except subprocess.TimeoutExpired:
            os.killpg(ingest.pid, signal.SIGKILL)
            ingest.wait()


def upserts(log: Path) -> tuple[int, int]:
    """The table's rows upserted by the stream's batches so far (its logged batch lines), and the batches."""
    reports = [b for b in map(BatchReport.parse, log.read_text(errors="replace").splitlines()) if b]
    return sum(b.counts.get(TABLE, {}).get("upsert", 0) for b in reports), len(reports)


def ingest(r: Rig, plan: Plan) -> dict[str, Any]:
    """Connect started (its initial snapshot reads the table) and the stream run until bronze holds every row,
    progress every 15 s; the stream stopped. Seconds from Connect's start.

    The stream starts as soon as the snapshot's first records are in the topic, not when Connect streams: a large
    table's snapshot takes longer than Connect's start may, and the stream applies it as it arrives."""
    log = r.home / "ingest.log"
    started = time.monotonic()
    declaration = load(r.home / "tables.toml")
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="connect-up") as pool:
        connecting = pool.submit(r.source.up, declaration, plan.ingest_timeout)
        while not end_offsets(r.broker.bootstrap, [declaration.topic(TABLE)]) and not connecting.done():
            time.sleep(2)
        if connecting.done():
            connecting.result()  # Connect failed to start: its error
        job = launch(r, log, plan.trigger_seconds)
        try:
            done, batches = 0, 0
            while done < plan.rows:
                _still_going(job, log, connecting, time.monotonic() - started, plan)
                time.sleep(15)
                done, batches = upserts(log)
                took = time.monotonic() - started
                say(f"  ingested {done:,} of {plan.rows:,} rows in {batches} batches, {took:.0f} s "
                    f"({done / took:,.0f} rows/s)" + ("" if connecting.done() else "; Connect snapshotting"))
            seconds = time.monotonic() - started
            connecting.result()  # streaming once its snapshot is done
        finally:
            stop(r, job)
    return {"seconds": round(seconds, 1), "rows_per_s": round(plan.rows / seconds), "batches": batches}


def _still_going(job: subprocess.Popen, log: Path, connecting: Future, took: float, plan: Plan) -> None:
    """ClickException when the stream stopped, Connect failed, or the ingest ran past its timeout."""
    if job.poll() is not None:
        raise click.ClickException(f"the stream stopped ({job.returncode}); log {log}:\n"
                                   + log.read_text(errors="replace")[-3000:])
    if connecting.done() and connecting.exception() is not None:
        raise click.ClickException(f"Kafka Connect did not start streaming: {connecting.exception()}")
    if took > plan.ingest_timeout:
        raise click.ClickException(f"{upserts(log)[0]:,} of {plan.rows:,} rows ingested after "
                                   f"{plan.ingest_timeout:.0f} s (--ingest-timeout); log {log}")


def tamper(lake: Any, drift: Drift) -> float:
    """Bronze made to differ by a Hudi write of the benchmark's own (the source and the stream know nothing of it):
    `drift.differ` rows' note changed (a later `_lsn`, as a stream write would have), `drift.missing` rows deleted
    (as the stream deletes), `drift.extra` added as copies of rows under keys the source never had. Seconds taken."""
    from pyspark.sql import functions as F

    from pipelines.lake.catalog import lake_table, writer_options
    from pipelines.lake.layout import DELETED_FLAG, main_path

    started = time.monotonic()
    spark, path = lake.spark, main_path(TABLE, lake.root)
    bronze = spark.read.format("hudi").load(path)
    bronze = bronze.drop(*[c for c in bronze.columns if c.startswith("_hoodie_") and c != DELETED_FLAG])
    originals = [k - _EXTRA_OFFSET for k in drift.extra]
    # Read once into the driver: the frames below must not read bronze again after the first write.
    picked = spark.createDataFrame(bronze.where(F.col("id").isin(drift.differ + drift.missing + originals))
                                   .collect(), bronze.schema)
    changed = picked.where(F.col("id").isin(drift.differ)).withColumn("note", F.lit("changed behind its back")) \
        .withColumn("_lsn", F.col("_lsn") + 1)
    copied = picked.where(F.col("id").isin(originals)).withColumn("id", (F.col("id") + _EXTRA_OFFSET).cast("bigint"))
    # Deleted as the stream deletes (an upsert flagged deleted, at the row's own position; Hudi's delete operation
    # writes an ordering value the stream's later records cannot be merged with).
    gone = picked.where(F.col("id").isin(drift.missing)).withColumn(DELETED_FLAG, F.lit(True)) \
        .withColumn("_op", F.lit("d"))
    options = writer_options(lake_table(f"bronze/{TABLE}", lake.declaration))
    changed.unionByName(copied).unionByName(gone).write.format("hudi").options(**options) \
        .option("hoodie.datasource.write.operation", "upsert").mode("append").save(path)
    return time.monotonic() - started


def reconciled(lake: Any, conn: Any, what: str) -> Any:
    """`reconcile_table` on the stopped stream's lake (rounds 0: what differs is drift), its figures said."""
    from pipelines.reconcile.compare import Options, reconcile_table

    report = reconcile_table(lake, conn, TABLE, Options(settle=0.0, rounds=0))
    say(f"  reconcile ({what}): {report.seconds:.1f} s, {report.buckets_differing} of {report.buckets} buckets "
        f"differ, rows read: source {report.rows_read['source']:,}, lake {report.rows_read['lake']:,}; "
        f"found {report.counts}")
    return report


def figures_of(report: Any) -> dict[str, Any]:
    """A reconcile report's figures."""
    return {"seconds": report.seconds, "source_rows": report.source_rows, "lake_rows": report.lake_rows,
            "buckets": report.buckets, "buckets_differing": report.buckets_differing,
            "rows_read": {"source": report.rows_read["source"], "lake": report.rows_read["lake"]},
            "found": {k: report.counts.get(k, 0) for k in ("missing", "extra", "differ", "unsettled")}}


def check_found(report: Any, drift: Drift) -> None:
    """The keys reconcile named must be exactly those made to differ, by kind: else the benchmark fails."""
    found = {kind: sorted(int(k["id"]) for k in report.keys.get(kind, [])) for kind in ("missing", "extra", "differ")}
    made = {"missing": drift.missing, "extra": drift.extra, "differ": drift.differ}
    if found != made or report.counts.get("unsettled"):
        wrong = {k: {"made": len(made[k]), "found": len(found[k])} for k in made}
        raise click.ClickException(f"reconcile found other drift than was made: {wrong}, "
                                   f"unsettled {report.counts.get('unsettled')}")


def _pg_hashes(conn: Any, shape: Any) -> dict[str, str]:
    """Every PostgreSQL row's key text and md5 of its canonical text, by a server-side cursor."""
    from psycopg import sql

    from pipelines.reconcile.digest import pg_parts

    key, _, row, _ = pg_parts(shape)
    query = sql.SQL("SELECT {k}, md5({r}) FROM {t}").format(k=key, r=row, t=sql.Identifier("public", TABLE))
    with conn.transaction(), conn.cursor(name="bench_full_comparison") as cursor:
        cursor.itersize = 50_000
        cursor.execute(query)
        return dict(cursor)


def full_comparison(lake: Any, conn: Any) -> dict[str, Any]:
    """Every row of both sides read (key and md5 of the same canonical text reconcile hashes), PostgreSQL's beside
    Spark's, matched in memory: what comparing costs without buckets, and the drift it finds."""
    from concurrent.futures import ThreadPoolExecutor

    from pipelines.lake.layout import main_path
    from pipelines.reconcile.compare import TableReport, shape_of, source_columns
    from pipelines.reconcile.digest import lake_frame

    started = time.monotonic()
    bronze = lake.spark.read.format("hudi").load(main_path(TABLE, lake.root))
    shape = shape_of(lake.declaration.tables[TABLE], source_columns(conn, SOURCE), bronze, 1,
                     TableReport(TABLE, SOURCE))
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="full-comparison") as pool:
        pending = pool.submit(_pg_hashes, conn, shape)
        held = {r["_k"]: r["_h"] for r in lake_frame(bronze, shape).select("_k", "_h").toLocalIterator()}
        source = pending.result()
    found = {"missing": len(source.keys() - held.keys()), "extra": len(held.keys() - source.keys()),
             "differ": sum(1 for k, h in source.items() if k in held and held[k] != h)}
    seconds = time.monotonic() - started
    say(f"  full comparison: {seconds:.1f} s, rows read: source {len(source):,}, lake {len(held):,}; found {found}")
    return {"seconds": round(seconds, 3), "rows_read": {"source": len(source), "lake": len(held)}, "found": found}


def _stream_up(r: Rig, job: subprocess.Popen, log: Path, launched: float) -> None:
    """Wait for the stream launched at `launched` (epoch) to beat: its session is up and reading."""
    while (beat := ControlFiles(str(r.root)).heartbeat()) is None or beat.started_at < launched:
        if job.poll() is not None:
            raise click.ClickException(f"the stream stopped ({job.returncode}); log {log}:\n"
                                       + log.read_text(errors="replace")[-3000:])
        time.sleep(1)


def heal(r: Rig, lake: Any, conn: Any, report: Any, plan: Plan) -> dict[str, Any]:
    """The stream started again, the drift re-delivered through the pipeline (`heal_table`) and reconciled until it
    matches (`wait_healed`); seconds from the heal's request, the stream's start apart."""
    from pipelines.reconcile.compare import Options
    from pipelines.reconcile.heal import heal_table, wait_healed

    log = r.home / "heal.log"
    launched = time.time()
    job = launch(r, log, plan.trigger_seconds)
    try:
        _stream_up(r, job, log, launched)
        up = time.time() - launched
        say(f"  the stream is up after {up:.0f} s; healing")
        started = time.monotonic()
        action = heal_table(lake, conn, report)
        after = wait_healed(lake, conn, [action], Options(settle=0.0, rounds=0), plan.heal_timeout)
        seconds = time.monotonic() - started
    finally:
        stop(r, job)
    if not action.healed:
        raise click.ClickException(f"not healed after {plan.heal_timeout:.0f} s: {action.remaining}; log {log}")
    say(f"  healed in {seconds:.1f} s (the last reconcile of the wait {after[-1].seconds:.1f} s)")
    return {"seconds": round(seconds, 1), "stream_start_seconds": round(up, 1), "snapshot": action.snapshot,
            "snapshot_keys": action.snapshot_keys, "deletes": action.deletes}


def measure(r: Rig, plan: Plan) -> dict[str, Any]:
    """On the ingested lake, the stream stopped: the clean reconcile, the drift made and reconciled, the full
    comparison, the heal."""
    from pipelines.runtime.lake import Lake
    from pipelines.source.postgres import connect

    os.environ.update(r.env)  # the lake's configuration (source, Kafka, declaration) as the stream's
    lake = Lake.at(str(r.root))
    drift = drift_keys(plan.rows, plan.seed)
    with connect(lake.config.source) as conn:
        clean = reconciled(lake, conn, "clean lake")
        if clean.drift or clean.source_rows != plan.rows or clean.lake_rows != plan.rows:
            raise click.ClickException(f"the clean lake is not the source: {figures_of(clean)}")
        say(f"  making drift behind the pipeline's back: {drift.counts()}")
        tampered = tamper(lake, drift)
        drifted = reconciled(lake, conn, "0.01% drift")
        check_found(drifted, drift)
        full = full_comparison(lake, conn)
        if full["found"] != drift.counts():
            raise click.ClickException(f"the full comparison found {full['found']}, not {drift.counts()}")
        healed = heal(r, lake, conn, drifted, plan)
    return {"clean": figures_of(clean), "drift_made": drift.counts(), "tamper_seconds": round(tampered, 1),
            "drifted": figures_of(drifted), "full_comparison": full, "heal": healed}


def run(plan: Plan) -> dict[str, Any]:
    """The whole benchmark at `plan.rows`; figures saved as `reconcile_<rows>.json`, plotted."""
    from lakehouse_dev.bench.plots import bar_chart

    home = bench_dir() / NAME / str(plan.rows)
    say(f"bench reconcile: {plan.rows:,} rows, drift {max(3, round(plan.rows * DRIFT_SHARE)):,} rows; under {home}")
    with rig(home) as r:
        generated = fill(r, plan.rows)
        say(f"ingesting {plan.rows:,} rows: Debezium's snapshot -> Kafka -> lakehouse ingest -> bronze")
        ingested = ingest(r, plan)
        measured = measure(r, plan)
    figures = {"plan": asdict(plan), "rows": plan.rows, "generate_seconds": round(generated, 1), "ingest": ingested,
               **measured, "goal": {"rows": GOAL_ROWS, "seconds": GOAL_SECONDS}}
    name = f"{NAME}_{plan.rows}"
    figures["plot"] = str(bar_chart(bench_dir() / f"{name}.png", f"Reconciliation of {plan.rows:,} rows", {
        "reconcile clean": measured["clean"]["seconds"], "reconcile 0.01% drift": measured["drifted"]["seconds"],
        "full comparison": measured["full_comparison"]["seconds"], "heal": measured["heal"]["seconds"]}, "seconds"))
    save(name, figures)
    return figures


def report(figures: dict[str, Any]) -> str:
    """The results table, then the goal's line."""
    rows = figures["rows"]

    def line(what: str, part: dict[str, Any]) -> dict[str, Any]:
        read = part.get("rows_read", {})
        buckets = f"{part['buckets_differing']:,} of {part['buckets']:,}" if "buckets" in part else ""
        found = part.get("found", {})
        return {"run": what, "seconds": f"{part['seconds']:.1f}", "buckets differing": buckets,
                "rows read (source)": f"{read['source']:,}" if read else "",
                "rows read (lake)": f"{read['lake']:,}" if read else "",
                "found (missing/extra/differ)": "/".join(str(found.get(k, 0)) for k in ("missing", "extra", "differ"))
                if found else ""}

    ingest = figures["ingest"]
    heal = figures["heal"]
    lines = [line(f"ingest ({ingest['rows_per_s']:,} rows/s)", ingest), line("reconcile, clean lake", figures["clean"]),
             line("reconcile, 0.01% drift", figures["drifted"]), line("full comparison", figures["full_comparison"]),
             line(f"heal (stream start {heal['stream_start_seconds']:.0f} s apart)", heal)]
    made = figures["drift_made"]
    columns = ["run", "seconds", "buckets differing", "rows read (source)", "rows read (lake)",
               "found (missing/extra/differ)"]
    slowest = max(figures["clean"]["seconds"], figures["drifted"]["seconds"])
    goal = (f"goal: {GOAL_ROWS:,} rows reconciled in at most {GOAL_SECONDS:.0f} s; "
            + (f"at {rows:,} rows: {slowest:.1f} s, {'met' if slowest <= GOAL_SECONDS else 'NOT met'}"
               if rows >= GOAL_ROWS else f"{slowest:.1f} s at {rows:,} rows: not measured at the goal's size"))
    return "\n".join([f"{rows:,} rows; drift made (missing/extra/differ): {made['missing']}/{made['extra']}/"
                      f"{made['differ']}", table(lines, columns), goal])
