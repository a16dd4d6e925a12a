"""Compaction of bronze's main tables beside the stream, in inline mode (the local default).

Main's writer plans a compaction every 6th delta commit (`hoodie.compact.schedule.inline`,
hudi_configs/bronze.toml; a table's `compact_every` in the declaration sets its own), and this
thread of the ingest process runs the plans while the next batches run. This is Hudi's async
compaction, as its own streaming sink and HoodieStreamer's continuous mode run it. Compacting inline
would make the batch that compacts pay for rewriting the table's base files, a cost that follows the
table's size, not the batch's: on tables of millions of rows, several times a batch's own time.

A plan takes one bucket, so its Spark job is one task on one core. A plan of every bucket would hold
every core for seconds, and Spark does not preempt a running task. The thread's jobs
run in a scheduler pool of their own (spark.toml: FAIR scheduling), so a batch's tasks get the
other core.

The writer's delta commits and a compaction commit the same table at the same time. Hudi
serializes their commits with an in-process lock (bronze.toml). A delta commit after a plan writes
to the file slice the plan opens, never to one being compacted. A writer rolls back only its own
failed delta commits, never a compaction.

A killed compaction stays pending on the timeline. The next process runs it again, after Hudi
rolls the failed attempt back. In external mode (EMR, Airflow's services job) compactions are
planned and run elsewhere, and no thread runs here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from pyspark import SparkContext

from pipelines.lake.catalog import LakeTable, bronze_options, main_writer_options
from pipelines.lake.hudi_timeline import meta_client
from pipelines.lake.layout import main_path
from pipelines.lake.table_stats import has_completed_commit
from pipelines.metastore import catalog_sync
from pipelines.runtime.hudi_client import WriteClient
from pipelines.runtime.lake import Lake

log = logging.getLogger(__name__)

# The Spark scheduler pool of the compactions (spark.toml sets FAIR scheduling between pools).
POOL = "bronze-compaction"


def compactions_run_here() -> bool:
    """Whether main's writer plans compactions for this process to run (inline mode), not the services job."""
    options = bronze_options("table", "bronze")
    return options.get("hoodie.compact.schedule.inline") == "true" and options.get("hoodie.compact.inline") != "true"


class Compactor:
    """Runs the pending compaction plans of the main tables, polled every `every` seconds, on a thread of its own.

    `lake`: the stream's lake under the declaration of its query in progress, whose tables it compacts (all of
    them, unless `tables`); the stream hands it the next query's with `follow`.
    """

    def __init__(self, lake: Lake, every: float, tables: Sequence[str] | None = None) -> None:
        self.lake = lake
        self.every = every
        self._tables = tuple(tables or ())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def follow(self, lake: Lake) -> None:
        """The stream's next query runs on `lake`, perhaps under a changed declaration: from the next round on, its
        tables are the ones compacted (a table it added too)."""
        self.lake = lake

    def start(self) -> Compactor:
        self._thread = threading.Thread(target=self._loop, name="bronze-compactor", daemon=True)
        self._thread.start()
        return self

    def close(self, *, drain: bool) -> None:
        """Stop the thread once its compaction in progress is done; then, with `drain`, run every plan left."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if drain:
            self.run_pending()

    def run_pending(self, stop: threading.Event | None = None) -> list[str]:
        """Run every pending plan of every main table; `stop`, checked between tables, ends it early."""
        done = []
        # The stream's tables now (one declaration for the whole round): a stream that follows a changed
        # declaration compacts the new ones too.
        lake = self.lake
        spark, decl = lake.spark, lake.declaration
        for table in self._tables or decl.names:
            path = main_path(table, lake.root)
            if stop is not None and stop.is_set():
                break
            # A completed commit's file first: a table being created has no timeline Hudi can load yet.
            if not has_completed_commit(path) or \
                    meta_client(spark, path).getActiveTimeline().filterPendingCompactionTimeline().empty():
                continue
            started = time.monotonic()
            options = main_writer_options(decl, table)
            with WriteClient(spark, LakeTable(f"bronze/{table}", path, options), options) as client:
                instants = client.run_compactions()
            catalog_sync.committed(spark, path, options)
            log.info("bronze/%s: compacted %s in %.1fs, beside the stream", table, ", ".join(instants),
                     time.monotonic() - started)
            done += instants
        return done

    def _loop(self) -> None:
        context = SparkContext._active_spark_context
        if context is not None:  # thread-local (pinned threads): only this thread's jobs run in the pool
            context.setLocalProperty("spark.scheduler.pool", POOL)
            context.setJobDescription("bronze compaction")
        while not self._stop.wait(self.every):
            try:
                self.run_pending(self._stop)
            except Exception:  # a compaction that fails is tried again; the stream goes on meanwhile
                log.exception("a compaction of bronze failed (tried again in %.0fs; its plan stays pending)",
                              self.every)
