"""Every lake table registered by name in a catalog, kept in step with its commits.

Analysts and incremental consumers find tables by name (`silver.orders`), not by path. With
`LAKEHOUSE_METASTORE_URI` set (a Hive Metastore's thrift URI; `make catalog-up` runs one) every
writer hands each table it committed to a syncer that runs Hudi's own meta sync tool on it
(HiveSyncTool in HMS mode; AwsGlueCatalogSyncTool into the Glue Data Catalog on the EMR target):
it creates the databases and tables, follows the schema (added columns, widened types) and adds the
new partitions. Options: hudi_configs/catalog.toml.

The sync runs beside the writer, on a thread of its own, not in the write (why: catalog.toml), for
two reasons. A catalog must never stop the lake: when the metastore is down the commits go on, the
tables stay pending and are tried again every RETRY_SECONDS and when a batch job ends, and
`lakehouse catalog status` says which are behind. And a stream batch does not wait for the
catalog: a sync takes 0.1 to 0.3 s a table, several tables a batch on its critical path. A sync
is incremental (Hudi reads the timeline since the table's `last_commit_time_sync`), so a table
committed twice while its sync waited needs one sync. A process killed with syncs
pending leaves those tables behind until their next commit or `lakehouse catalog sync`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import TYPE_CHECKING
from urllib.parse import urlparse

import hudi_configs
from pipelines.errors import CatalogUnavailable, SettingError
from pipelines.lake.catalog import dotted_name
from pipelines.lake.jvm import jvm_of
from pipelines.lake.layout import lake_relative
from pipelines.runtime import console
from pipelines.runtime.local_process import port_open

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

METASTORE_VARIABLE = "LAKEHOUSE_METASTORE_URI"
LAYERS = ("bronze", "silver", "gold")
# How long a failed sync waits before it is tried again (a commit of the table does not hurry it).
RETRY_SECONDS = 30.0
# How long a batch job waits at its end for the syncs of its commits.
FLUSH_SECONDS = 120.0
BASE_FILE_FORMAT = "PARQUET"


def metastore_uri() -> str | None:
    """`LAKEHOUSE_METASTORE_URI`: the Hive Metastore the tables are registered in (thrift://host:port)."""
    uri = os.environ.get(METASTORE_VARIABLE) or None
    if uri is not None and not uri.startswith("thrift://"):
        raise SettingError(f"{METASTORE_VARIABLE}={uri!r}: expected a Hive Metastore's thrift://host:port")
    return uri


def catalog_kind() -> str | None:
    """Where the tables are registered: `glue` on the EMR target, `hms` with a metastore URI, else None."""
    if hudi_configs.target() == "emr":
        return "glue"
    return "hms" if metastore_uri() else None


def catalog_name(lake_name: str) -> str:
    """`database.table` of a lake table (`bronze/_changelog/orders` -> `bronze._changelog_orders`): its dotted name."""
    return dotted_name(lake_name)


def sync_properties(path: str, options: dict[str, str], kind: str | None = None) -> dict[str, str]:
    """What Hudi's sync tool is given for the table at `path`: its writer's options, catalog.toml's, its names."""
    kind = kind or catalog_kind() or "hms"
    database, table = catalog_name(lake_relative(path)).split(".", 1)
    props = {**options, **hudi_configs.section("catalog", "common"), **hudi_configs.section("catalog", kind),
             "hoodie.datasource.hive_sync.database": database, "hoodie.datasource.hive_sync.table": table,
             "hoodie.datasource.meta.sync.base.path": path,
             "hoodie.datasource.hive_sync.base_file_format": BASE_FILE_FORMAT}
    if kind == "hms":
        props["hoodie.datasource.hive_sync.metastore.uris"] = metastore_uri() or ""
    return props


def in_lake(path: str) -> bool:
    """Whether `path` is a table of the lake's layers (the erasure registry and other stores are not synced)."""
    return lake_relative(path) != path and lake_relative(path).split("/", 1)[0] in LAYERS


def require_metastore(uri: str | None = None) -> None:
    """CatalogUnavailable unless the Hive Metastore (`uri`, default LAKEHOUSE_METASTORE_URI) accepts a connection.

    Looked at before Hive's client is used: it retries a refused connection for seconds before it fails.
    """
    parsed = urlparse((uri or metastore_uri() or "").split(",")[0])
    if not port_open(parsed.port or 9083, parsed.hostname or "127.0.0.1"):
        raise CatalogUnavailable(f"the Hive Metastore at {parsed.geturl()} ({METASTORE_VARIABLE}) does not answer")


def sync_now(spark: SparkSession, path: str, options: dict[str, str]) -> None:
    """Run the catalog's Hudi sync tool on one table now; CatalogUnavailable when the metastore does not answer."""
    kind = catalog_kind()
    if kind is None:
        raise SettingError(f"no catalog to sync to: set {METASTORE_VARIABLE} (or LAKEHOUSE_TARGET=emr for Glue)")
    props = sync_properties(path, options, kind)
    if kind == "hms":
        require_metastore(props["hoodie.datasource.hive_sync.metastore.uris"])
    jvm = jvm_of(spark.sparkContext)
    typed = jvm.org.apache.hudi.common.config.TypedProperties()
    for key, value in props.items():
        typed.setProperty(key, value)
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    fs = jvm.org.apache.hadoop.fs.Path(path).getFileSystem(conf)
    jvm.org.apache.hudi.sync.common.util.SyncUtilHelpers.runHoodieMetaSync(
        props["hoodie.meta.sync.client.tool.class"], typed, conf, fs, path, BASE_FILE_FORMAT)


class Syncer:
    """The process's syncer: a daemon thread that syncs the tables handed to it, latest options first.

    Nothing of it is needed to recover from a crash: the catalog is derived from the tables, and a
    table synced late is synced in full (schema and every partition since its last sync).
    """

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self._pending: dict[str, dict[str, str]] = {}  # path -> the newest writer options
        self._busy = False
        self._retry_at = 0.0
        self._failures = 0
        self._down_since: float | None = None
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="catalog-sync", daemon=True)
        self._thread.start()

    def request(self, path: str, options: dict[str, str]) -> None:
        with self._cond:
            self._pending[path] = options
            self._cond.notify_all()

    def behind(self) -> list[str]:
        """Catalog names of the tables committed and not yet synced."""
        with self._cond:
            return sorted(catalog_name(lake_relative(p)) for p in self._pending)

    def flush(self, timeout: float) -> list[str]:
        """Sync what is pending now, without waiting for its retry, and wait until it is done, or failed
        again, or `timeout`; the tables still behind."""
        deadline = time.monotonic() + timeout
        with self._cond:
            failures, self._retry_at = self._failures, 0.0
            self._cond.notify_all()
            while (self._pending or self._busy) and self._failures == failures:
                if not self._cond.wait(max(0.0, deadline - time.monotonic())) and time.monotonic() >= deadline:
                    break
        return self.behind()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending or time.monotonic() < self._retry_at:
                    self._cond.wait(None if not self._pending else self._retry_at - time.monotonic())
                path, options = next(iter(self._pending.items()))
                del self._pending[path]
                self._busy = True
            try:
                started = time.monotonic()
                sync_now(self.spark, path, options)
            except Exception as exc:  # CatalogUnavailable, or the tool's own failure: the table stays pending
                self._failed(path, options, exc)
            else:
                log.debug("catalog: synced %s in %.2f s", catalog_name(lake_relative(path)), time.monotonic() - started)
                self._synced()
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _failed(self, path: str, options: dict[str, str], exc: Exception) -> None:
        with self._cond:
            self._pending.setdefault(path, options)  # unless a newer commit asked again meanwhile
            self._failures += 1
            self._retry_at = time.monotonic() + RETRY_SECONDS
            first = self._down_since is None
            self._down_since = self._down_since or time.time()
            waiting = sorted(catalog_name(lake_relative(p)) for p in self._pending)
        if first:  # once per outage: every table committed meanwhile joins the list
            log.warning("catalog: could not sync %s (%s); the lake's commits go on, the catalog is behind on %s, "
                        "tried again every %.0f s", catalog_name(lake_relative(path)),
                        console.first_line(exc), ", ".join(waiting), RETRY_SECONDS)

    def _synced(self) -> None:
        with self._cond:
            if self._down_since is None:
                return
            outage, self._down_since = time.time() - self._down_since, None
        log.warning("catalog: syncing again after %.0f s", outage)


_SYNCER: Syncer | None = None
_LOCK = threading.Lock()


def committed(spark: SparkSession, path: str, options: dict[str, str]) -> None:
    """Register (or bring up to date) the table at `path` in the catalog, in the background; a no-op
    without a catalog or for a path outside the lake's layers."""
    global _SYNCER
    if catalog_kind() is None or not in_lake(path):
        return
    with _LOCK:
        # One per process: the jobs' sessions (`newSession()`s among them) share one context and JVM.
        if _SYNCER is None or _SYNCER.spark.sparkContext is not spark.sparkContext:
            _SYNCER = Syncer(spark)
    _SYNCER.request(path, options)


def flush(timeout: float = FLUSH_SECONDS) -> list[str]:
    """Wait for this process's pending syncs (a batch job, before it exits); the tables still behind, logged."""
    if _SYNCER is None:
        return []
    behind = _SYNCER.flush(timeout)
    if behind:
        log.warning("catalog: behind on %s (the metastore did not answer); the next commit of each, or "
                    "`lakehouse catalog sync`, brings them up to date", ", ".join(behind))
    return behind


def catalog_session_conf() -> dict[str, str]:
    """Session options that read the lake's tables by name from the catalog (hudi_configs/spark.toml)."""
    kind = catalog_kind()
    if kind is None:
        raise SettingError(f"no catalog: set {METASTORE_VARIABLE} (`make catalog-up` prints it) "
                           "or run on the EMR target (Glue)")
    conf = hudi_configs.section("spark", f"catalog_{kind}")
    if kind == "hms":
        conf["spark.hadoop.hive.metastore.uris"] = metastore_uri() or ""
    return conf
