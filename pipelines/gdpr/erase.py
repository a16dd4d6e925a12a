"""`lakehouse gdpr erase`: a customer's data out of every table, every retained version and every file.

Contract section 4. One run erases the customers of one or many requests (erase_all: the
sweep, purge and verification are paid once for the batch, and each request gets its own
certificate). An order is the customers' when its newest version names one of them; an order
the source has given to another customer since stays (its current row is that customer's),
and only its versions naming the subject go. One run does, in order (each step timed for the
certificate):

1. register: the customers' and their orders' pseudonyms (keyed hashes, pipelines.gdpr.request)
   go into the registry `_gdpr/erased`. From then on ingest drops their events (a replayed
   insert cannot bring them back) and silver drops their changes;
2. wait for the bronze writes that were in flight when the registry changed (they may
   have read it before);
3. sweep: every row of the customer and of their orders is deleted from bronze main, the
   delete ledgers, the change logs, the dead letters, silver and quarantine (upserts with
   `_hoodie_is_deleted`, so Hudi's own ordering rules apply); gold follows through its
   usual incremental cycle, which reads silver's change feed: customer_ltv loses the row,
   daily_revenue is recomputed for the days of their orders;
4. purge: what still holds the data in older versions goes. Savepoints that pin such
   versions are deleted (and re-created at the new latest commit); merge-on-read tables
   are compacted until no log file predates the sweep (a pending plan first); in copy-on-write
   tables with a change feed, the file groups the erasure's commits wrote are written once
   more, unchanged, because those commits' `.cdc` files hold the deleted rows' before-images
   in the newest slice (Hudi 1.0.2's clustering plans nothing for a non-partitioned table,
   so it cannot do this), and so are the file groups whose newest `.cdc` files hold the
   subject from an earlier commit (a row that left silver for quarantine before the
   erasure: change_feed_holders), those tables purged even where the sweep deleted nothing; an empty marker
   commit records from when on incremental reads stay possible (older checkpoints get a
   full read, hudi_timeline.READABLE_FROM_META); then every table is cleaned down to the
   newest versions, and metadata tables holding keys (record index) are rebuilt from the
   cleaned files;
5. Kafka: tombstones for the erased keys on the source topics, which are set to log
   compaction, so the broker drops the raw events too; the values Great Expectations kept
   of failed checks are redacted and the Data Docs rebuilt (pipelines.services.quality);
6. verify (pipelines.gdpr.scan and reads): snapshot, time travel to every retained
   instant, incremental and change-feed reads find nothing, and a scan of every file under
   the lake root, decoded, finds neither the ids nor the e-mail or name;
7. certificate (`_gdpr/certificates/<reference>.json`) and one line in `_gdpr/audit.jsonl`,
   with pseudonyms, counts, instants and timings, never the personal data.

Erasure is a writer of every table. Beside a running ingest stream it needs the stream in
multi-writer mode (LAKEHOUSE_TABLE_SERVICES=external, as in the Airflow deployment): its
writes then run under optimistic concurrency control and the tables' locks.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import ClassVar, TypeVar

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

import hudi_configs
from pipelines import contract, storage
from pipelines.gdpr.registry import (
    dead_letters_of_erased,
    read_registry,
    registry_path,
)
from pipelines.gdpr.request import ErasureRequest, erasure_key, subject_hash
from pipelines.gdpr.scan import ScanReport, Subject, scan_lake
from pipelines.hudi_timeline import (
    READABLE_FROM_META,
    earliest_checkpoint,
    earliest_retained,
    extra_meta_after,
    latest_completion,
    meta_client,
    pending_writes,
    repair_torn_timeline,
)
from pipelines.ingest.bronze import BATCH_ID_META, DELETED_FLAG, REGISTRY_META
from pipelines.services.quality import redact_subject
from pipelines.services.table_services import LakeTable, _Client, lake_tables
from pipelines.settings import (
    dead_letter_path,
    gdpr_path,
    gold_path,
    kafka_bootstrap,
    lake_root,
    silver_path,
)
from pipelines.table_stats import exists
from pipelines.transform import gold

log = logging.getLogger(__name__)

REGISTRY_OPTIONS = "registry"
# Tables whose rows hold a customer (key `id`) or an order (key `id`), by name in lake_tables().
CUSTOMER_TABLES = ("bronze/customers", "bronze/_deletes/customers", "bronze/_changelog/customers",
                   "silver/customers", "silver/_quarantine/customers")
ORDER_TABLES = ("bronze/orders", "bronze/_deletes/orders", "bronze/_changelog/orders",
                "silver/orders", "silver/_quarantine/orders")
GOLD_BY_CUSTOMER = (f"gold/{gold.STATE}", f"gold/{gold.LTV}")
# Texts shorter than this are not searched: they would be found everywhere.
MIN_TEXT = 4
T = TypeVar("T")
R = TypeVar("R")


def _each_table(items: Iterable[T], work: Callable[[T], R]) -> list[R]:
    """`work` of every item, `[erasure] tables_at_once` at a time (threads of this driver), in order.

    Tables are independent writes (each its own commits and lock), so their sweeps and
    purges may overlap; an error is raised once every table has been worked on.
    """
    workers = int(hudi_configs.section("gdpr", "erasure")["tables_at_once"])
    items = list(items)
    if workers <= 1 or len(items) <= 1:
        return [work(item) for item in items]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="erasure") as pool:
        return list(pool.map(work, items))


# ---------------------------------------------------------------- the registry


def _register(spark: SparkSession, root: str, requests: list[ErasureRequest], orders: list[int], key: str) -> int:
    """Add the requests' pseudonyms to the registry in one commit (an upsert: a repeated request adds nothing).

    Each customer is tagged with a pseudonym of its request's reference; orders with the
    run's (all its references), whose customer is not recorded anywhere.
    """
    def tag(references: str) -> str:
        return subject_hash("customer", 0, key + references)

    run_tag = tag(",".join(r.reference for r in requests))
    rows = ([(subject_hash("customer", c, key), "customer", tag(r.reference))
             for r in requests for c in r.customer_ids]
            + [(subject_hash("order", o, key), "order", run_tag) for o in orders])
    df = spark.createDataFrame(rows, "subject string, kind string, request string") \
        .dropDuplicates(["subject"]).withColumn("registered_at", F.current_timestamp())
    df.write.format("hudi").options(**hudi_configs.writer("gdpr", REGISTRY_OPTIONS)) \
        .mode("append").save(registry_path(root))
    return len(rows)


# ---------------------------------------------------------------- the ingest stream, beside the erasure


def _bronze_paths(root: str) -> list[str]:
    return [t.path for t in lake_tables(root) if t.name.startswith("bronze/") and exists(t.path)]


def wait_for_bronze_writes(spark: SparkSession, root: str, timeout: float = 180) -> list[str]:
    """Wait until the bronze writes in flight now have ended; returns those still pending at the timeout.

    A batch in flight may have read the registry before this erasure added to it. Writes
    whose writer is dead (pending_writes: a stale heartbeat) are not waited for; after the
    timeout the erasure goes on, and the stale-write check below still covers anything
    that commits later.
    """
    waiting = {path: set(pending_writes(spark, path)) for path in _bronze_paths(root)}
    deadline = time.monotonic() + timeout
    while True:
        waiting = {p: w & set(pending_writes(spark, p)) for p, w in waiting.items()}
        left = [f"{p}@{i}" for p, w in waiting.items() for i in sorted(w)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(1)


def stale_bronze_writes(spark: SparkSession, root: str, since: str, registered: str) -> int:
    """Ingest commits completed after `since` that filtered with a registry older than `registered`."""
    stale = 0
    for path in _bronze_paths(root):
        for meta in extra_meta_after(spark, path, since, (BATCH_ID_META, REGISTRY_META)):
            if BATCH_ID_META in meta and (meta.get(REGISTRY_META) or "") < registered:
                stale += 1
    return stale


def _now_instant() -> str:
    """Now as a Hudi instant time (local time, the timeline's default zone), comparable with completion times."""
    return datetime.now().strftime("%Y%m%d%H%M%S%f")[:17]


# ---------------------------------------------------------------- what the lake holds of the subject


@dataclass
class Found:
    customers: set[int]
    orders: set[int]  # the subjects' orders: their newest version names one of the customers
    texts: set[str]
    shared_texts: int  # e-mails/names also held by another customer: checked by ids only
    # Orders an older version of which names one of the customers, and whose newest names
    # another: that customer's now. Only the versions naming the subject go.
    moved: set[int] = field(default_factory=set)
    named: set[int] = field(default_factory=set)  # customers some version of an order names


def _read(spark: SparkSession, path: str) -> DataFrame:
    return spark.read.format("hudi").options(**hudi_configs.section("reads", "scan")).load(path)


def _customer_reads(spark: SparkSession, root: str) -> dict[str, DataFrame]:
    """Reads of the customer tables that exist, by name."""
    return {t.name: _read(spark, t.path) for t in lake_tables(root) if t.name in CUSTOMER_TABLES and exists(t.path)}


def find_subject(spark: SparkSession, root: str, customer_ids: tuple[int, ...]) -> Found:
    """The customers' rows and orders anywhere in bronze and silver, and their e-mails and names."""
    tables = {t.name: t for t in lake_tables(root)}
    ids = list(customer_ids)
    customers, texts = set(), set()
    reads = _customer_reads(spark, root)
    # One Spark job over every customer table (each job on a Hudi table pays its file listing).
    rows = [df.filter(F.col("id").isin(ids)).select(
        "id", *[F.col(c) if c in df.columns else F.lit(None).cast("string").alias(c) for c in ("email", "full_name")])
        for df in reads.values()]
    if rows:
        union = rows[0]
        for df in rows[1:]:
            union = union.unionByName(df)
        for r in union.distinct().collect():
            customers.add(r["id"])
            texts |= {v.strip() for v in (r["email"], r["full_name"]) if v and len(v.strip()) >= MIN_TEXT}
    orders, moved, named = _orders_of(spark, [tables[name].path for name in ORDER_TABLES], ids)
    shared = shared_texts(reads, ids, texts)
    return Found(customers, orders, texts - shared, len(shared), moved, named)


def _orders_of(spark: SparkSession, paths: list[str], ids: list[int]) -> tuple[set[int], set[int], set[int]]:
    """The orders any version of which names one of the customers: (theirs, moved to another customer, customers named).

    An order is the customers' when its newest version (by LSN, over every table that keeps
    versions of orders) names one of them; a later delete does not change whose it was.
    An order the source gave to someone else since is that customer's row now: it stays,
    and only its older versions naming the subject are erased.
    """
    versions = [df.select("id", "customer_id", F.col("_lsn").cast("long").alias("_lsn"))
                for path in paths if exists(path)
                and {"id", "customer_id", "_lsn"} <= set((df := _read(spark, path)).columns)]
    if not versions:
        return set(), set(), set()
    union = versions[0]
    for df in versions[1:]:
        union = union.unionByName(df)
    subject = F.col("customer_id").isin(ids)
    newest = union.filter(F.col("customer_id").isNotNull()).groupBy("id").agg(
        F.max_by("customer_id", "_lsn").alias("owner"),
        F.collect_set(F.when(subject, F.col("customer_id"))).alias("named")).filter(F.size("named") > 0).collect()
    theirs = {r["id"] for r in newest if r["owner"] in ids}
    return theirs, {r["id"] for r in newest} - theirs, {c for r in newest for c in r["named"]}


def shared_texts(reads: dict[str, DataFrame], customer_ids: list[int], texts: set[str]) -> set[str]:
    """Texts that occur in another customer's e-mail or name (in `reads`, _customer_reads): finding them proves nothing.

    Asked again at verification, not only when the subject is found: the source keeps
    creating customers, and a new one may carry the erased customer's name.
    """
    others = [df.filter(~F.col("id").isin(customer_ids)).select("email", "full_name")
              for df in reads.values() if "email" in df.columns]
    if not texts or not others:
        return set()
    union = others[0]
    for df in others[1:]:
        union = union.unionByName(df)
    values = F.lower(F.concat_ws("\n", "email", "full_name"))
    ordered = sorted(texts)
    hits = union.select(*[F.max(values.contains(t.lower()).cast("int")).alias(f"t{i}")
                          for i, t in enumerate(ordered)]).first()
    return {t for i, t in enumerate(ordered) if hits[f"t{i}"]}


# ---------------------------------------------------------------- sweep


def _predicate(name: str, columns: list[str], customers: list[int], orders: list[int]) -> Column | None:
    """The rows of table `name` that hold the subject: theirs, their orders, and any version naming them."""
    if name in CUSTOMER_TABLES:
        return F.col("id").isin(customers) if customers else None
    if name in ORDER_TABLES:
        # Versions of an order that moved to another customer name the subject too: they go,
        # and the current row of that order (another customer's) stays.
        checks = ([F.col("id").isin(orders)] if orders else []) \
            + ([F.col("customer_id").isin(customers)] if customers and "customer_id" in columns else [])
        return checks[0] | checks[1] if len(checks) == 2 else (checks[0] if checks else None)
    if name in GOLD_BY_CUSTOMER:
        return F.col("customer_id").isin(customers) if customers else None
    return None


def _delete_rows(spark: SparkSession, table: LakeTable, rows: DataFrame) -> None:
    """Delete the rows through the table's own writer options (key, partition, index, lock).

    Tables whose rows carry `_hoodie_is_deleted` get an upsert of the rows flagged, at their
    own ordering value, as every other delete of theirs; the others (change logs, ledgers,
    dead letters) a delete of their keys.
    """
    data = rows.drop(*[c for c in rows.columns if c.startswith("_hoodie_") and c != DELETED_FLAG])
    if DELETED_FLAG in data.columns:
        data, operation = data.withColumn(DELETED_FLAG, F.lit(True)), "upsert"
    else:
        operation = "delete"
    options = {**table.options, "hoodie.datasource.write.operation": operation}
    data.write.format("hudi").options(**options).mode("append").save(table.path)


def sweep(spark: SparkSession, root: str, customers: list[int], orders: list[int], key: str,
          registry: DataFrame) -> dict[str, dict[str, object]]:
    """Delete the subject's rows from every table that holds rows of it; then let gold follow silver."""

    def one(table: LakeTable) -> tuple[str, dict[str, object]] | None:
        if table.path == dead_letter_path(root):
            mine = dead_letters_of_erased(_read(spark, table.path), registry, key)
        else:
            df = _read(spark, table.path)
            predicate = _predicate(table.name, df.columns, customers, orders)
            if predicate is None:
                return None
            mine = df.filter(predicate)
        mine = mine.localCheckpoint()
        n = mine.count()
        if not n:
            return None
        _delete_rows(spark, table, mine)
        log.info("%s: %d rows deleted", table.name, n)
        return table.name, {"rows_removed": n, "instant": latest_completion(spark, table.path)}

    done = _each_table([t for t in lake_tables(root) if exists(t.path)], one)
    touched: dict[str, dict[str, object]] = dict(d for d in done if d is not None)
    if any(name.startswith("silver/") and not name.startswith("silver/_") for name in touched):
        before = {t: latest_completion(spark, gold_path(t, root)) for t in (gold.STATE, gold.LTV, gold.DAILY)}
        gold.gold_cycle(spark, root, silver_path("customers", root), silver_path("orders", root))
        for t, was in before.items():
            now = latest_completion(spark, gold_path(t, root))
            if now != was:
                touched[f"gold/{t}"] = {"recomputed": True, "instant": now}
    return touched


# ---------------------------------------------------------------- purge of older versions


class _Purger(_Client):
    """The services client with the settings of an erasure: keep only the newest version of everything."""

    OVERRIDES: ClassVar[dict[str, str]] = {
        "hoodie.clean.policy": "KEEP_LATEST_COMMITS",
        "hoodie.clean.commits.retained": "1",
        "hoodie.cleaner.commits.retained": "1",
    }

    def __init__(self, spark: SparkSession, table: LakeTable) -> None:
        super().__init__(spark, LakeTable(table.name, table.path, {**table.options, **self.OVERRIDES}))

    def savepoints(self) -> list[str]:
        found, it = [], self.meta.reloadActiveTimeline().getSavePointTimeline().filterCompletedInstants() \
            .getInstants().iterator()
        while it.hasNext():
            found.append(it.next().requestedTime())
        return found

    def compact_all(self, after: str) -> list[str]:
        """Compact until a compaction planned after `after` (the sweep) has run: no log file predates it."""
        done: list[str] = []
        for _ in range(4):
            report = self.compact()
            done += report["executed"]
            # Done once a plan made after the sweep ran, or when nothing had log files to compact.
            if any(instant > after for instant in done) or not (report["planned"] or report["executed"]):
                break
        return done

    def newest_slices(self) -> list[tuple[str, str, str]]:
        """(partition, file id, base instant) of the newest file slice of every file group."""
        hudi = self._jvm.org.apache.hudi
        view = hudi.common.table.view.HoodieTableFileSystemView.fileListingBasedFileSystemView(
            self._context, self.meta, self.meta.reloadActiveTimeline().getCommitsTimeline().filterCompletedInstants())
        found = []
        for partition in hudi.common.fs.FSUtils.getAllPartitionPaths(
                self._context, self.meta.getStorage(), self._table.path, False):
            slices = view.getLatestFileSlices(partition).iterator()
            while slices.hasNext():
                piece = slices.next()
                found.append((partition, piece.getFileId(), piece.getBaseInstantTime()))
        view.close()
        return found

    def slices_written_since(self, since: str) -> list[str]:
        """File ids whose newest file slice a commit started at or after `since` wrote."""
        return [file_id for _, file_id, base in self.newest_slices() if base >= since]

    def clean_up_to(self, marker: str, timeout: float = 300) -> list[dict[str, object]]:
        """Clean until the cleaner keeps nothing older than `marker`.

        The cleaner never goes past a write in flight: a concurrent writer's commit that
        started before the marker holds it back until it ends.
        """
        cleans, deadline = [], time.monotonic() + timeout
        while True:
            while [i for i in pending_writes(self._spark, self._table.path) if i < marker] \
                    and time.monotonic() < deadline:
                time.sleep(1)
            cleans.append(done := self.clean())
            # Hudi 1.0.2 records no clean when its plan is empty: then nothing older is left
            # (keeping one commit, the plan covers every slice the newest ones replaced).
            if "earliest_retained" not in done \
                    or (earliest_retained(self._spark, self._table.path) or "") >= marker \
                    or time.monotonic() > deadline:
                return cleans
            time.sleep(2)  # never hold the table's lock in a tight loop: writers need it to commit

    def metadata_partitions(self) -> set[str]:
        return set(self.meta.getTableConfig().getMetadataPartitions())

    def marker(self, readable_from: str) -> str:
        """An empty replace commit saying that no incremental read may start before `readable_from`."""
        jvm = self._jvm
        self.meta.reloadActiveTimeline()
        action = jvm.org.apache.hudi.common.table.timeline.HoodieTimeline.REPLACE_COMMIT_ACTION
        self.client.setOperationType(jvm.org.apache.hudi.common.model.WriteOperationType.CLUSTER)
        instant = self.client.startCommit(action, self.meta)
        requested = self.meta.createNewInstant(
            jvm.org.apache.hudi.common.table.timeline.HoodieInstant.State.REQUESTED, action, instant)
        self.meta.reloadActiveTimeline().transitionReplaceRequestedToInflight(
            requested, jvm.org.apache.hudi.common.util.Option.empty())
        extra = jvm.java.util.HashMap()
        extra.put(READABLE_FROM_META, readable_from)
        extra.put("_lakehouse.erasure", "purge")
        empty = self._spark.sparkContext._jsc.emptyRDD()
        self.client.commit(instant, empty, jvm.org.apache.hudi.common.util.Option.of(extra), action,
                           jvm.java.util.HashMap())
        return instant


def change_feed_holders(spark: SparkSession, root: str, subject: Subject) -> dict[str, set[str]]:
    """Per table with a change feed, the file groups whose newest slice has a `.cdc` file holding the subject.

    A commit that changed one of the subject's rows before the erasure (an update, a move to
    quarantine, a delete in the source) keeps the before-image in the `.cdc` file of the
    slice it wrote. While that slice is the newest of its file group no clean removes it,
    and the sweep, which found no live row there, did not write the file group: it must be
    written once more, like those the sweep wrote. Only those files are decoded.
    """
    # "<table>/<partition>/.<file id>_<instant>", what a `.cdc` file's path starts with -> (table, file id)
    newest: dict[str, tuple[str, str]] = {}
    for table in lake_tables(root):
        if table.options.get("hoodie.table.cdc.enabled") != "true" or not exists(table.path):
            continue
        with _Purger(spark, table) as client:
            for partition, file_id, base in client.newest_slices():
                stem = "/".join(p for p in (table.name, partition, f".{file_id}_{base}") if p)
                newest[stem] = (table.name, file_id)

    def in_newest_slice(rel: str) -> bool:
        return rel.endswith(".cdc") and rel.rsplit(".log.", 1)[0] in newest

    found: dict[str, set[str]] = {}
    for finding in scan_lake(spark, root, subject, only=in_newest_slice).findings:
        name, file_id = newest[finding.path.rsplit(".log.", 1)[0]]
        found.setdefault(name, set()).add(file_id)
    return found


def purge(spark: SparkSession, root: str, names: set[str], sweep_started: str,
          progress: Callable[[str], None], moved: list[int] | None = None,
          holders: dict[str, set[str]] | None = None) -> dict[str, dict[str, object]]:
    """Remove every older version of the named tables that may still hold the subject.

    `moved`: orders now of another customer whose older versions named the subject. The
    change-feed files of the commit that moved one hold that version as a before-image in
    the newest slice of its file group, which no clean removes: those file groups are
    written once more too. `holders`: file groups per table whose newest `.cdc` files hold
    the subject (change_feed_holders), written once more as well.
    """

    def one(table: LakeTable) -> dict[str, object]:
        progress(f"purging {table.name}")
        started = time.monotonic()
        done: dict[str, object] = {}
        with _Purger(spark, table) as client:
            if savepoints := client.savepoints():
                for instant in savepoints:
                    client.client.deleteSavepoint(instant)
                done["savepoints_deleted"] = savepoints
            if table.merge_on_read:
                done["compactions"] = client.compact_all(sweep_started)
            if table.options.get("hoodie.table.cdc.enabled") == "true":
                # The change-feed files of the erasure's own commits hold the deleted rows'
                # before-images, in the newest slice: write those file groups once more.
                file_ids = set(client.slices_written_since(sweep_started))
                if moved and table.name in ORDER_TABLES:
                    file_ids |= _file_groups_of(spark, table, moved)
                file_ids |= (holders or {}).get(table.name, set())
                done["rewritten_file_groups"] = _rewrite(spark, table, sorted(file_ids))
            readable_from = latest_completion(spark, table.path)
            done["marker"] = client.marker(readable_from)
            done["cleans"] = client.clean_up_to(done["marker"])
            if savepoints:
                client.client.savepoint("lakehouse-gdpr", "re-created after an erasure")
                done["savepoint_recreated"] = latest_completion(spark, table.path)
            # The record index (and column stats, on tables written before they were turned
            # off) keep deleted keys and values in the metadata table's logs and HFiles.
            rebuild = client.metadata_partitions() - {"files"}
        if rebuild:
            _rebuild_metadata(spark, table)
            done["metadata_table_rebuilt"] = sorted(rebuild)
        done["seconds"] = round(time.monotonic() - started, 1)
        return done

    tables = [t for t in lake_tables(root) if t.name in names and exists(t.path)]
    return {t.name: done for t, done in zip(tables, _each_table(tables, one), strict=True)}


def _file_groups_of(spark: SparkSession, table: LakeTable, ids: list[int]) -> set[str]:
    """File ids of the file groups holding these keys now."""
    rows = _read(spark, table.path).filter(F.col("id").isin(ids)).select("_hoodie_file_name").distinct().collect()
    return {r[0].split("_")[0] for r in rows}


def _rewrite(spark: SparkSession, table: LakeTable, file_ids: list[str]) -> int:
    """Upsert the rows of these file groups unchanged: each gets a new slice, the old one goes with the clean."""
    if not file_ids:
        return 0
    rows = _read(spark, table.path).filter(F.split("_hoodie_file_name", "_")[0].isin(file_ids))
    rows = rows.drop(*[c for c in rows.columns if c.startswith("_hoodie_") and c != DELETED_FLAG]).localCheckpoint()
    if rows.isEmpty():
        return 0
    rows.write.format("hudi").options(**{**table.options, "hoodie.datasource.write.operation": "upsert"}) \
        .mode("append").save(table.path)
    return len(file_ids)


def _rebuild_metadata(spark: SparkSession, table: LakeTable) -> None:
    """Drop the metadata table (its logs and HFiles keep deleted keys) and build it again from the files."""
    with _Purger(spark, table) as client:
        jvm = client._jvm
        util = jvm.org.apache.hudi.metadata.HoodieTableMetadataUtil
        util.deleteMetadataTable(client.meta, client._context, False)
        writer = jvm.org.apache.hudi.metadata.SparkHoodieBackedTableMetadataWriter.create(
            client.meta.getStorageConf(), client._config, client._context)
        writer.close()


# ---------------------------------------------------------------- Kafka


def kafka_tombstones(bootstrap: str, customers: list[int], orders: list[int]) -> dict[str, object]:
    """Tombstones for the erased keys, and log compaction on the source topics, so Kafka drops the raw events."""
    from kafka import KafkaProducer
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

    configs = hudi_configs.section("gdpr", "kafka_topics")
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="lakehouse-gdpr")
    try:
        admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, contract.topic(t), configs=configs)
                             for t in contract.TABLES])
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
    try:
        for table, ids in (("customers", customers), ("orders", orders)):
            for i in ids:
                producer.send(contract.topic(table), key=json.dumps({"id": i}).encode(), value=None)
        producer.flush(60)
    finally:
        producer.close()
    return {"tombstones": len(customers) + len(orders), "topics": [contract.topic(t) for t in contract.TABLES],
            "topic_config": configs}


# ---------------------------------------------------------------- verification


def _holds(name: str, df: DataFrame, customers: list[int], orders: list[int], texts: list[str], key: str,
           registry: DataFrame | None) -> Column | None:
    """Rows of `df` (a read of table `name`) that hold the subject."""
    checks = []
    if (p := _predicate(name, df.columns, customers, orders)) is not None:
        checks.append(p)
    if "customer_id" in df.columns and customers:
        checks.append(F.col("customer_id").isin(customers))
    strings = [c for c, t in df.dtypes if t == "string"]
    if texts and strings:
        blob = F.lower(F.concat_ws("\n", *strings))
        checks += [blob.contains(t.lower()) for t in texts]
    if not checks:
        return None
    out = checks[0]
    for c in checks[1:]:
        out = out | c
    return out


def verify(spark: SparkSession, root: str, customers: list[int], orders: list[int], texts: list[str], key: str,
           progress: Callable[[str], None]) -> dict[str, object]:
    """Every read the lake serves, and every file under its root, checked for the subject.

    The tables' reads (Spark jobs) run in a thread beside the file scan (the driver's Python
    and Hudi's readers): neither writes, and each checks everything it checks alone.
    """
    registry = read_registry(spark, root)
    # A customer created since the subject was found may share a name: it is theirs, not the subject's.
    shared = shared_texts(_customer_reads(spark, root), customers, set(texts)) if texts else set()
    texts = sorted(set(texts) - shared)
    tables = [t for t in lake_tables(root) if exists(t.path)]

    def read_all() -> list[tuple[str, list[str], int, int, float]]:
        return [_check_reads(spark, table, customers, orders, texts, key, registry, progress) for table in tables]

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="erasure-reads") as pool:
        checked = pool.submit(read_all)
        progress("scanning every file under the lake root")
        scan = scan_lake(spark, root, Subject(frozenset(customers), frozenset(orders), frozenset(texts)))
        done = checked.result()
    failures = [f for _, found, _, _, _ in done for f in found]
    failures += [f"{f.path} ({f.table}): {f.what}" for f in scan.findings]
    if failures:  # the reason for a further round, in the log too: a run cut short leaves no certificate
        log.warning("verification: %d failure(s), first: %s", len(failures), "; ".join(failures[:5]))
    return {"passed": not failures, "reads_checked": sum(d[2] for d in done), "failures": failures,
            "scan": _scan_summary(scan),
            "reads_seconds": {name: round(spent, 1) for name, *_, spent in sorted(done, key=lambda d: -d[4])},
            "time_travel_covered_by_a_later_read": sum(d[3] for d in done),
            "texts_now_shared_with_other_customers": len(shared)}


def _check_reads(spark: SparkSession, table: LakeTable, customers: list[int], orders: list[int], texts: list[str],
                 key: str, registry: DataFrame | None,
                 progress: Callable[[str], None]) -> tuple[str, list[str], int, int, float]:
    """Snapshot, time travel, incremental and change-feed reads of one table, checked for the subject.

    Returns (table, failures, reads checked, time-travel instants a later read covered, seconds).
    """
    progress(f"verifying {table.name}")
    started = time.monotonic()
    jobs: list[tuple[str, DataFrame]] = [("snapshot", _read(spark, table.path))]
    instants, covered = _time_travel_instants(spark, table)
    for instant in instants:
        jobs.append((f"time travel to {instant}", spark.read.format("hudi").options(
            **hudi_configs.section("reads", "scan")).option("as.of.instant", instant).load(table.path)))
    # Incremental and change-feed reads from the oldest checkpoint a consumer can still hold.
    since = earliest_checkpoint(spark, table.path) or "000"
    if since < (latest := latest_completion(spark, table.path) or ""):
        jobs.append(("incremental read of the retained timeline", spark.read.format("hudi")
                     .options(**hudi_configs.section("reads", "incremental"))
                     .option("hoodie.datasource.read.begin.instanttime", since)
                     .option("hoodie.datasource.read.end.instanttime", latest)
                     .load(table.path)))
        if table.options.get("hoodie.table.cdc.enabled") == "true":
            jobs.append(("change feed of the retained timeline", spark.read.format("hudi")
                         .options(**hudi_configs.section("reads", "incremental"))
                         .option("hoodie.datasource.query.incremental.format", "cdc")
                         .option("hoodie.datasource.read.begin.instanttime", since)
                         .option("hoodie.datasource.read.end.instanttime", latest)
                         .load(table.path)))
    # One Spark job per table: each read keeps the rows of the subject, tagged with the read.
    found = None
    for what, df in jobs:
        mine = _subject_rows(table.name, what, df, customers, orders, texts, key, registry)
        if mine is not None:
            tagged = mine.select(F.lit(what).alias("_read"))
            found = tagged if found is None else found.unionAll(tagged)
    failures = []
    if found is not None:
        for row in found.groupBy("_read").count().collect():
            failures.append(f"{table.name}: {row['_read']} returns {row['count']} row(s) of the subject")
    return table.name, failures, len(jobs), covered, time.monotonic() - started


def _subject_rows(name: str, what: str, df: DataFrame, customers: list[int], orders: list[int], texts: list[str],
                  key: str, registry: DataFrame | None) -> DataFrame | None:
    """The rows of one read of table `name` that hold the subject; None when the read cannot hold any."""
    if name == "bronze/_dead_letters":
        if registry is None:
            return None
        return dead_letters_of_erased(df, registry, key)
    if what.startswith("change feed"):
        blob = F.lower(F.concat_ws("\n", F.col("before"), F.col("after")))
        cond = F.lit(False)
        for pattern in _image_patterns(name, customers, orders):
            cond = cond | blob.rlike(pattern)
        for t in texts:
            cond = cond | blob.contains(t.lower())
        return df.filter(cond)
    cond = _holds(name, df, customers, orders, texts, key, registry)
    return df.filter(cond) if cond is not None else None


def _image_patterns(name: str, customers: list[int], orders: list[int]) -> list[str]:
    """Regexes for the subject's ids in a change-feed image (JSON) of table `name`.

    Which field means what depends on the table: `id` is a customer in the customers tables,
    an order in the orders tables and in the order list of gold's state rows.
    """
    def field(column: str, ids: list[int]) -> list[str]:
        return [rf'"{column}"\s*:\s*{i}\b' for i in ids]

    patterns = field("customer_id", customers)
    if name in CUSTOMER_TABLES:
        patterns += field("id", customers)
    if name in ORDER_TABLES or name == f"gold/{gold.STATE}":
        patterns += field("id", orders)
    return patterns


def _retained_instants(spark: SparkSession, path: str) -> list[str]:
    """Instants time travel can still answer: completed commits at or after the last clean's horizon."""
    from pipelines.hudi_timeline import _completed

    retain = earliest_retained(spark, path) or ""
    found, it = [], _completed(spark, path).getInstants().iterator()
    while it.hasNext():
        instant = it.next()
        if instant.requestedTime() >= retain:
            found.append(instant.requestedTime())
    return found


def _time_travel_instants(spark: SparkSession, table: LakeTable) -> tuple[list[str], int]:
    """The retained instants verification must time-travel to, and how many others they cover.

    On a copy-on-write table a time-travel read returns the rows of the newest base file
    of each file group as of the instant. When those files are a subset of the files
    of an instant already read, every row it can return was already checked: an
    insert-only change log, whose every commit adds files, needs one read instead of one
    per commit (which, beside a running stream, grows with the square of its commits).
    Merge-on-read tables are read at every instant: their log merging depends on it.
    """
    instants = _retained_instants(spark, table.path)
    if table.options.get("hoodie.datasource.write.table.type") != "COPY_ON_WRITE" or len(instants) < 2:
        return instants, 0
    hudi = spark.sparkContext._jvm.org.apache.hudi
    meta = meta_client(spark, table.path)
    context = hudi.common.engine.HoodieLocalEngineContext(meta.getStorageConf())
    view = hudi.common.table.view.HoodieTableFileSystemView.fileListingBasedFileSystemView(
        context, meta, meta.getActiveTimeline().getCommitsTimeline().filterCompletedInstants())
    try:
        partitions = list(hudi.common.fs.FSUtils.getAllPartitionPaths(context, meta.getStorage(), table.path, False))
        read: list[set[str]] = []
        chosen: list[str] = []
        for instant in reversed(instants):  # newest first: the largest sets
            files: set[str] = set()
            for partition in partitions:
                found = view.getLatestBaseFilesBeforeOrOn(partition, instant).iterator()
                while found.hasNext():
                    files.add(f"{partition}/{found.next().getFileName()}")
            if not any(files <= earlier for earlier in read):
                read.append(files)
                chosen.append(instant)
    finally:
        view.close()
    return sorted(chosen), len(instants) - len(chosen)


def _scan_summary(scan: ScanReport) -> dict[str, object]:
    def rounded(spent: dict[str, float]) -> dict[str, float]:
        return {k: round(v, 1) for k, v in sorted(spent.items(), key=lambda kv: -kv[1])}

    return {"files": scan.files, "decoded": scan.decoded, "vanished": scan.vanished, "records": scan.records,
            "findings": len(scan.findings), "seconds": round(scan.seconds, 1),
            "seconds_by_decoder": rounded(scan.seconds_by_decoder), "seconds_by_table": rounded(scan.seconds_by_table)}


# ---------------------------------------------------------------- the run


@dataclass
class _Clock:
    timings: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def step(self, name: str):
        started = time.monotonic()
        try:
            yield
        finally:
            self.timings[name] = round(time.monotonic() - started, 2)
        log.info("erasure: %s (%.1f s)", name, self.timings[name])


def erase(request: ErasureRequest, spark: SparkSession | None = None, root: str | None = None,
          bootstrap: str | None = None, progress: Callable[[str], None] = log.info) -> dict[str, object]:
    """Erase and verify one request; returns the certificate (also written under `_gdpr/`)."""
    return erase_all([request], spark, root, bootstrap, progress)[0]


def erase_all(requests: list[ErasureRequest], spark: SparkSession | None = None, root: str | None = None,
              bootstrap: str | None = None, progress: Callable[[str], None] = log.info) -> list[dict[str, object]]:
    """Erase the customers of every request in one run; returns one certificate per request, in order.

    The costly steps (sweep, purge, verification) are paid once for the whole batch, not
    once per request: a data-protection officer's week of requests is one purge. Each
    request keeps its own reference, certificate and audit line; all of them carry the
    same run's tables, purge and checks, and name the references erased with them.
    """
    from pipelines.spark import get_spark

    if not requests:
        raise ValueError("no erasure request given")
    references = [r.reference for r in requests]
    if len(set(references)) != len(references):
        raise ValueError(f"references must differ within one run, got {references}: each names its certificate")
    spark = spark or get_spark("lakehouse-gdpr")
    root = root or lake_root()
    key = erasure_key()
    clock = _Clock()
    started = datetime.now(UTC)
    customers = sorted({c for r in requests for c in r.customer_ids})
    for table in lake_tables(root):  # a crashed writer's cut timeline file fails every reader of it
        repair_torn_timeline(table.path)
    with clock.step("find"):
        found = find_subject(spark, root, tuple(customers))
    orders, moved = sorted(found.orders), sorted(found.moved)
    progress(f"found {len(found.customers)} of {len(customers)} customer(s) in {len(requests)} request(s), "
             f"{len(orders)} order(s) of theirs and {len(moved)} order(s) now of other customers")
    with clock.step("register"):
        _register(spark, root, requests, orders, key)
        registered = latest_completion(spark, registry_path(root)) or ""
        registry = read_registry(spark, root)
        sweep_started = _now_instant()
    with clock.step("wait for bronze writes"):
        wait_for_bronze_writes(spark, root)
    swept_from = sweep_started
    with clock.step("sweep"):
        touched = sweep(spark, root, customers, orders, key, registry)
        # An ingest batch that read the registry before this request may commit after the sweep
        # began: sweep again (cheap: only its rows) until none did, before the costly purge.
        for _ in range(3):
            wait_for_bronze_writes(spark, root)
            if not stale_bronze_writes(spark, root, swept_from, registered):
                break
            swept_from = _now_instant()
            _merge(touched, sweep(spark, root, customers, orders, key, registry))
    kafka: dict[str, object] = {}
    with clock.step("kafka"):
        try:  # moved orders keep their key: their newest record is another customer's row
            kafka = kafka_tombstones(bootstrap or kafka_bootstrap(), customers, orders)
        except Exception as exc:  # the lake is erased regardless; the certificate says what Kafka still holds
            kafka = {"error": f"{type(exc).__name__}: {exc}"}
    texts = sorted(found.texts)
    # What held the subject keeps older versions of it: purge those tables (gold included,
    # recomputed from silver), and the order tables whose older versions name the subject
    # under orders that moved; then verify.
    subject = Subject(frozenset(customers), frozenset(orders), frozenset(texts))
    purged: dict[str, dict[str, object]] = {}
    with clock.step("change feeds"):
        holders = change_feed_holders(spark, root, subject)
    to_purge = set(touched) | set(holders) | (set(ORDER_TABLES) if moved else set())
    if to_purge:
        with clock.step("purge"):
            purged = purge(spark, root, to_purge, sweep_started, progress, moved, holders)
    with clock.step("quality results"):
        quality = redact_subject(root, set(texts), set(customers), set(orders))
    with clock.step("verify"):
        result = verify(spark, root, customers, orders, texts, key, progress)
    # Anything found now (a run cut short earlier), or an ingest batch that filtered with the
    # registry as it was before this request and committed after the sweep began, gets another
    # sweep and a purge of every table.
    retries: list[dict[str, object]] = []  # why each further sweep ran: for the certificate
    for attempt in range(1, 4):
        with clock.step(f"wait for bronze writes {attempt}"):
            wait_for_bronze_writes(spark, root)
            stale = stale_bronze_writes(spark, root, swept_from, registered)
        if result["passed"] and not stale:
            break
        retries.append({"stale_ingest_commits": stale, "findings": result["failures"][:50]})
        log.warning("erasure: %s; sweeping and purging every table again",
                    f"{stale} ingest commit(s) raced the sweep" if stale else
                    "verification found the subject: " + "; ".join(result["failures"][:5]))
        swept_from = _now_instant()
        # A stale ingest batch wrote bronze only; anything else found may be anywhere.
        again = {t.name for t in lake_tables(root)
                 if not result["passed"] or t.name.startswith("bronze/")}
        with clock.step(f"sweep again {attempt}"):
            _merge(touched, sweep(spark, root, customers, orders, key, registry))
        with clock.step(f"purge again {attempt}"):
            purged |= purge(spark, root, again, sweep_started, progress, moved,
                            change_feed_holders(spark, root, subject))
        with clock.step(f"verify again {attempt}"):
            result = verify(spark, root, customers, orders, texts, key, progress)
    certificates = []
    for request in requests:
        mine = set(request.customer_ids)
        # Per request, what the lake held of its own customers; the run's tables are shared.
        nothing = not ((found.customers | found.named) & mine) and (not touched or len(requests) > 1)
        certificate = {
            "reference": request.reference,
            "requested_by": request.requested_by,
            "status": ("nothing left to erase" if nothing else "erased") if result["passed"] else "NOT VERIFIED",
            "verified": result["passed"],
            "started_at": started.isoformat(),
            "finished_at": datetime.now(UTC).isoformat(),
            "subjects": {"customers": [subject_hash("customer", c, key) for c in request.customer_ids],
                         "duplicates_in_request": request.duplicates, "found_in_lake": len(found.customers & mine)},
            # What the run did for all its requests together: tables, purge and checks are shared.
            "run": {"references": references, "customers": len(customers), "found_in_lake": len(found.customers),
                    "orders": len(orders), "orders_moved_to_other_customers": len(moved),
                    "texts_checked": len(found.texts), "texts_shared_with_other_customers": found.shared_texts},
            "tables": touched,
            "purge": purged,
            "kafka": kafka,
            "quality_results": quality,
            "verification": result,
            "further_sweeps": retries,
            "timings_s": clock.timings,
        }
        _write_certificate(root, certificate)
        certificates.append(certificate)
    return certificates


def _merge(touched: dict[str, dict[str, object]], more: dict[str, dict[str, object]]) -> None:
    """Add a further sweep's report to the first one's: rows removed add up, the newest instant wins."""
    for name, done in more.items():
        was = touched.get(name, {})
        removed = int(was.get("rows_removed", 0)) + int(done.get("rows_removed", 0))
        touched[name] = {**was, **done, "rows_removed": removed}


def certificate_path(root: str, reference: str) -> str:
    return f"{gdpr_path(root)}/certificates/{reference.replace('/', '_')}.json"


def _write_certificate(root: str, certificate: dict[str, object]) -> None:
    """The certificate, and one line of the audit log, beside the lake (on its object store too)."""
    path = certificate_path(root, str(certificate["reference"]))
    text = json.dumps(certificate, indent=2, sort_keys=True, default=str)
    if storage.exists(path):  # a repeated request keeps every run's certificate
        path = f"{path.removesuffix('.json')}.{datetime.now(UTC).strftime('%Y%m%dT%H%M%S')}.json"
    storage.write_text(path, text)
    audit = {k: certificate[k] for k in ("reference", "requested_by", "status", "verified", "started_at",
                                         "finished_at")}
    audit |= {"subjects": certificate["subjects"]["customers"], "certificate": path,
              "rows_removed": sum(int(t.get("rows_removed", 0)) for t in certificate["tables"].values()),
              "run_references": certificate["run"]["references"]}
    storage.append_text(f"{gdpr_path(root)}/audit.jsonl", json.dumps(audit, sort_keys=True, default=str) + "\n")
    certificate["certificate"] = path
