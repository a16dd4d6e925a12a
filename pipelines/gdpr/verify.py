"""The proof: snapshot, time travel to every retained instant, incremental and change-feed reads,
and a scan of every file under the lake root (pipelines.gdpr.scan) find none of the subjects.
Step 6 of pipelines.gdpr.erase; what it reports goes into the certificate.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import reduce

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

import hudi_configs
from pipelines.gdpr.certificate import Verification
from pipelines.gdpr.find import Target, read_rows, shared_texts, source_of, subject_reads
from pipelines.gdpr.scan import ScanReport, scan_lake
from pipelines.lake.catalog import LakeTable, lake_tables
from pipelines.lake.erasure_registry import dead_letters_of_erased, read_registry
from pipelines.lake.hudi_timeline import (
    earliest_checkpoint,
    latest_completion,
    meta_client,
    retained_instants,
)
from pipelines.lake.jvm import jvm_of
from pipelines.lake.table_stats import has_completed_commit
from pipelines.runtime.lake import Lake
from pipelines.transform import gold

log = logging.getLogger(__name__)


# ---------------------------------------------------------------- verification


def _holds(name: str, df: DataFrame, target: Target, texts: list[str]) -> Column | None:
    """Rows of `df` (a read of table `name`) that hold the subject: theirs, a version naming them, a text of theirs."""
    checks = []
    if (p := target.predicate(name, df)) is not None:
        checks.append(p)
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


@dataclass(frozen=True)
class _Sought:
    """What every read is checked for: the subject's rows (`target`), pii `texts`, and, in the dead letters,
    the records the registry (pseudonyms under `key`) names. Built once per verification, passed to each table's
    reads."""

    target: Target
    texts: list[str]
    key: str
    registry: DataFrame | None


def verify(lake: Lake, target: Target, texts: list[str], progress: Callable[[str], None]) -> Verification:
    """Every read the lake serves, and every file under its root, checked for the subject.

    The tables' reads (Spark jobs) run in a thread beside the file scan (the driver's Python
    and Hudi's readers): neither writes, and each checks everything it checks alone.
    """
    spark = lake.spark
    registry = read_registry(spark, lake.root)
    # A customer created since the subject was found may share a name: it is theirs, not the subject's.
    shared = shared_texts(subject_reads(lake), target, set(texts)) if texts else set()
    texts = sorted(set(texts) - shared)
    sought = _Sought(target, texts, lake.erasure_key, registry)
    tables = [t for t in lake_tables(lake.root, lake.declaration) if has_completed_commit(t.path)]

    def read_all() -> list[tuple[str, list[str], int, int, float]]:
        return [_check_reads(spark, table, sought, progress) for table in tables]

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="erasure-reads") as pool:
        checked = pool.submit(read_all)
        progress("scanning every file under the lake root")
        scan = scan_lake(lake, target.subject(texts))
        done = checked.result()
    failures = [f for _, found, _, _, _ in done for f in found]
    failures += [f"{f.path} ({f.table}): {f.what}" for f in scan.findings]
    if failures:  # the reason for a further round, in the log too: a run cut short leaves no certificate
        log.warning("verification: %d failure(s), first: %s", len(failures), "; ".join(failures[:5]))
    return Verification(
        passed=not failures, reads_checked=sum(d[2] for d in done), failures=failures, scan=_scan_summary(scan),
        reads_seconds={name: round(spent, 1) for name, *_, spent in sorted(done, key=lambda d: -d[4])},
        time_travel_covered_by_a_later_read=sum(d[3] for d in done),
        texts_now_shared_with_other_customers=len(shared))


def _check_reads(spark: SparkSession, table: LakeTable, sought: _Sought,
                 progress: Callable[[str], None]) -> tuple[str, list[str], int, int, float]:
    """Snapshot, time travel, incremental and change-feed reads of one table, checked for the subject.

    Returns (table, failures, reads checked, time-travel instants a later read covered, seconds).
    """
    progress(f"verifying {table.name}")
    started = time.monotonic()
    jobs: list[tuple[str, DataFrame]] = [("snapshot", read_rows(spark, table.path))]
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
        mine = _subject_rows(table.name, what, df, sought)
        if mine is not None:
            tagged = mine.select(F.lit(what).alias("read_rows"))
            found = tagged if found is None else found.unionAll(tagged)
    failures = []
    if found is not None:
        for row in found.groupBy("read_rows").count().collect():
            failures.append(f"{table.name}: {row['read_rows']} returns {row['count']} row(s) of the subject")
    return table.name, failures, len(jobs), covered, time.monotonic() - started


def _subject_rows(name: str, what: str, df: DataFrame, sought: _Sought) -> DataFrame | None:
    """The rows of one read of table `name` that hold the subject; None when the read cannot hold any."""
    target, texts = sought.target, sought.texts
    if name == "bronze/_dead_letters":
        if sought.registry is None:
            return None
        return dead_letters_of_erased(df, sought.registry, sought.key, target.decl)
    if what.startswith("change feed"):
        blob = F.lower(F.concat_ws("\n", F.col("before"), F.col("after")))
        cond = F.lit(False)
        for pattern in _image_patterns(name, target):
            cond = cond | blob.rlike(pattern)
        for t in texts:
            cond = cond | blob.contains(t.lower())
        for image in ("before", "after"):
            if (mine := _image_of_subject(name, F.col(image), target)) is not None:
                cond = cond | F.coalesce(mine, F.lit(False))
        return df.filter(cond)
    matching = _holds(name, df, target, texts)
    return df.filter(matching) if matching is not None else None


def _image_patterns(name: str, target: Target) -> list[str]:
    """Regexes for the subject's ids in a change-feed image (JSON) of gold's tables, which name customers in
    `customer_id` and the shop's orders in the `id` of gold's state rows."""
    def field(column: str, ids: list[int]) -> list[str]:
        return [rf'"{column}"\s*:\s*{i}\b' for i in ids]

    if not name.startswith("gold/"):
        return []
    patterns = field("customer_id", list(target.customers))
    if name == f"gold/{gold.STATE}":
        patterns += field("id", target.orders)
    return patterns


def _image_of_subject(name: str, image: Column, target: Target) -> Column | None:
    """Whether a change-feed image (a row of declared table's lake table `name`, as JSON) holds the subject:
    its subject field names a customer, or its key fields are one of their rows' (`key_text`)."""
    decl = source_of(name, target.decl)
    if decl is None or decl.subject is None:
        return None
    checks = []
    if target.customers:
        checks.append(F.trim(F.get_json_object(image, f"$.{decl.subject}")).isin([str(c) for c in target.customers]))
    if rows := target.rows.get(decl.name):
        checks.append(F.to_json(F.array(*[F.get_json_object(image, f"$.{c}") for c in decl.key])).isin(sorted(rows)))
    return reduce(lambda a, b: a | b, checks) if checks else None


def _time_travel_instants(spark: SparkSession, table: LakeTable) -> tuple[list[str], int]:
    """The retained instants verification must time-travel to, and how many others they cover.

    On a copy-on-write table a time-travel read returns the rows of the newest base file
    of each file group as of the instant. When those files are a subset of the files
    of an instant already read, every row it can return was already checked: an
    insert-only change log, whose every commit adds files, needs one read instead of one
    per commit (which, beside a running stream, grows with the square of its commits).
    Merge-on-read tables are read at every instant: their log merging depends on it.
    """
    instants = retained_instants(spark, table.path)
    if table.options.get("hoodie.datasource.write.table.type") != "COPY_ON_WRITE" or len(instants) < 2:
        return instants, 0
    hudi = jvm_of(spark.sparkContext).org.apache.hudi
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
