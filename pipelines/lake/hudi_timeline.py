"""A Hudi table's timeline, through Hudi's own Java API (works for local paths and s3:// alike): what was committed,
what a reader consumed, and from where an incremental reader can still read (the repair of timeline files a crash
cut short is pipelines.lake.timeline_repair's)."""

from __future__ import annotations

import json

from pyspark.sql import SparkSession

from pipelines.lake.jvm import jvm_of
from pipelines.lake.layout import BATCH_ID_META, changelog_path, lake_relative, main_path
from pipelines.lake.table_stats import has_completed_commit
from pipelines.lake.timeline_files import HEARTBEAT_EXPIRY_MS


# Commit metadata keys are stored under this prefix (see bronze.BATCH_ID_META).
CHECKPOINT_META = "_lakehouse.checkpoint"
# On a commit that dropped partitions (table_services expiry): no checkpoint older than this
# completion time can be read incrementally any more, the files it would need are gone.
READABLE_FROM_META = "_lakehouse.readable_from"


def meta_client(spark: SparkSession, path: str):  # -> JavaObject (HoodieTableMetaClient)
    """Hudi's handle on the table at `path`, with the session's Hadoop configuration."""
    hudi = jvm_of(spark.sparkContext).org.apache.hudi
    conf = hudi.storage.hadoop.HadoopStorageConfiguration(spark.sparkContext._jsc.hadoopConfiguration())
    return hudi.common.table.HoodieTableMetaClient.builder().setConf(conf).setBasePath(path).build()


def _active(spark: SparkSession, path: str):  # -> JavaObject (HoodieActiveTimeline)
    return meta_client(spark, path).getActiveTimeline()


def _completed(spark: SparkSession, path: str):  # -> JavaObject (HoodieTimeline)
    return _active(spark, path).getCommitsTimeline().filterCompletedInstants()


def latest_completion(spark: SparkSession, path: str) -> str | None:
    """Completion time of the newest completed commit: the inclusive end of an incremental read."""
    last = _completed(spark, path).lastInstant()
    return last.get().getCompletionTime() if last.isPresent() else None


def latest_instant(spark: SparkSession, path: str) -> str | None:
    """Instant (requested) time of the newest completed commit: what a catalog sync records as synced."""
    last = _completed(spark, path).lastInstant()
    return last.get().requestedTime() if last.isPresent() else None


def retained_instants(spark: SparkSession, path: str) -> list[str]:
    """Instants time travel can still answer: completed commits at or after the last clean's horizon."""
    retain = earliest_retained(spark, path) or ""
    found, it = [], _completed(spark, path).getInstants().iterator()
    while it.hasNext():
        instant = it.next()
        if instant.requestedTime() >= retain:
            found.append(instant.requestedTime())
    return found


# On an erasure's purge marker (pipelines.gdpr.purge): the completion of the table's newest commit that changed rows
# (newest_change); every later one up to the marker was an erasure's own (compactions, unchanged rewrites, earlier
# purges' markers): a reader that had read up to it has nothing to read before the marker, though the clean made
# those commits unreadable.
PURGE_FROM_META = "_lakehouse.purge_from"
ERASURE_META = "_lakehouse.erasure"


def earliest_checkpoint(spark: SparkSession, path: str) -> str | None:
    """The oldest checkpoint an incremental read of `path` can still start from; None if any can.

    A read from checkpoint C needs every commit completed after C, on the active timeline
    (older ones are archived) and with its files (the cleaner may have deleted the files
    of commits older than the last clean's "earliest commit to retain"; expiry drops whole
    partitions). Hence the latest of: the completion time of the first active commit, of
    the newest commit older than that earliest commit to retain, and the newest expiry's
    READABLE_FROM_META.
    """
    active = _active(spark, path)
    commits = active.getCommitsTimeline().filterCompletedInstants()
    floor = _floor_without_cleaning(commits)
    if floor is None:
        return None
    retain = _earliest_retained(active)
    instants = commits.getInstants().iterator()
    while retain and instants.hasNext():
        instant = instants.next()
        if instant.requestedTime() < retain:
            floor = max(floor, instant.getCompletionTime())
    return floor


def _floor_without_cleaning(commits, *, expiries_only: bool = False) -> str | None:  # commits: completed commits
    """The latest of the first active commit's completion and the newest READABLE_FROM_META (an expiry's or a
    purge's; `expiries_only`: an expiry's); None without commits."""
    first = commits.firstInstant()
    if not first.isPresent():
        return None
    floor = first.get().getCompletionTime()
    if (marker := _newest_marker(commits, expiries_only=expiries_only)) is not None:
        floor = max(floor, marker[1][READABLE_FROM_META])
    return floor


def _newest_marker(commits, *, expiries_only: bool = False) -> tuple[str, dict[str, str]] | None:
    """(completion time, extra metadata) of the newest replace commit with READABLE_FROM_META (an expiry, a purge;
    `expiries_only`: not a purge's, which carries ERASURE_META)."""
    replaces = commits.getCompletedReplaceTimeline().getReverseOrderedInstants().iterator()
    while replaces.hasNext():
        instant = replaces.next()
        extra = commits.readCommitMetadata(instant).getExtraMetadata()
        if extra.get(READABLE_FROM_META) and not (expiries_only and extra.get(ERASURE_META)):
            return instant.getCompletionTime(), dict(extra)
    return None


def earliest_by_commit_time(spark: SparkSession, path: str) -> str | None:
    """The oldest checkpoint from which the rows of later commits can still be found by their `_hoodie_commit_time`.

    For an insert-only table (bronze's change logs), whose rows keep the commit time they were written at through
    every rewrite (a clean, an erasure's delete, a clustering): such a read needs those commits on the active timeline
    and their partitions not expired, not their original files. A purge's marker does not count: it removed no row
    that the erasure had not deleted before.
    """
    return _floor_without_cleaning(_completed(spark, path), expiries_only=True)


def read_on_after_purge(spark: SparkSession, path: str, since: str, earliest: str) -> str | None:
    """Where a read from checkpoint `since`, older than the table's `earliest` checkpoint (earliest_checkpoint), can
    go on from (the purge's marker), when the commits in between were all an erasure's purge's own (PURGE_FROM_META
    at most `since`); None otherwise.

    The purge deleted no row: the erasure's sweep had, before it began (and a reader at `since` has read those
    deletes). A clean after the purge's, which makes later commits unreadable as well, rules it out.
    """
    marker = _newest_marker(_completed(spark, path))
    if marker is None or not (start := marker[1].get(PURGE_FROM_META)) or since < start:
        return None
    # From the marker itself (it holds no row): time travel to it still works, the clean kept it.
    completed, readable_from = marker[0], marker[1][READABLE_FROM_META]
    return completed if earliest <= readable_from else None


def newest_change(spark: SparkSession, path: str, until: str) -> str | None:
    """Completion time of the newest commit completed at or before `until` that may have changed rows: one without
    ERASURE_META that is no compaction or clustering (those rewrite the same rows); None if there is none."""
    timeline = _completed(spark, path)
    for instant in reversed(_between(timeline, None, until)):
        metadata = timeline.readCommitMetadata(instant)
        if metadata.getExtraMetadata().get(ERASURE_META) is None \
                and str(metadata.getOperationType()) not in ("COMPACT", "CLUSTER"):
            return instant.getCompletionTime()
    return None


def _between(timeline, since: str | None, until: str) -> list:  # HoodieTimeline -> [HoodieInstant]
    found, instants = [], timeline.getInstants().iterator()
    while instants.hasNext():
        instant = instants.next()
        if (since is None or instant.getCompletionTime() > since) and instant.getCompletionTime() <= until:
            found.append(instant)
    return found


def _earliest_retained(active) -> str | None:  # active: JavaObject (HoodieActiveTimeline)
    clean = active.getCleanerTimeline().filterCompletedInstants().lastInstant()
    return active.readCleanMetadata(clean.get()).getEarliestCommitToRetain() or None if clean.isPresent() else None


def earliest_retained(spark: SparkSession, path: str) -> str | None:
    """The last clean's "earliest commit to retain": time travel to an older instant fails; None if never cleaned."""
    return _earliest_retained(_active(spark, path))


def instants_between(spark: SparkSession, path: str, since: str | None, until: str) -> list[str]:
    """Instant times of the commits that completed in (since, until]: the `_hoodie_commit_time`s of a window."""
    return [instant.requestedTime() for instant in _between(_completed(spark, path), since, until)]


def partitions_written(spark: SparkSession, path: str, since: str, until: str) -> set[str]:
    """Partition paths that the commits completed in (since, until] wrote to (from their commit metadata)."""
    timeline = _completed(spark, path)
    return {str(p) for instant in _between(timeline, since, until)
            for p in timeline.readCommitMetadata(instant).getPartitionToWriteStats().keySet()}


def instant_as_of(spark: SparkSession, path: str, completion: str) -> str | None:
    """Instant time of the newest commit completed at or before `completion` (time travel to a checkpoint)."""
    return max((i.requestedTime() for i in _between(_completed(spark, path), None, completion)), default=None)


def bronze_instant_consumed(spark: SparkSession, root: str, table: str, consumer: str) -> str | None:
    """Instant of bronze/<table>'s main table as of the batch whose change log the table at `consumer` (silver/<table>
    or its quarantine) consumed last, by that table's checkpoint: what bronze held when it was written. None when
    unknown (no checkpoint, or a batch whose commits are archived).

    The ETL reads bronze's change log, whose timeline is not main's: both carry the stream's batch id, which maps a
    point of one onto the other.
    """
    read = consumed(checkpoint(spark, consumer), changelog_path(table, root)) if has_completed_commit(consumer) \
        else None
    batch = meta_at(spark, changelog_path(table, root), read, BATCH_ID_META) if read else None
    return instant_of_batch(spark, main_path(table, root), BATCH_ID_META, int(batch)) if batch else None


def meta_at(spark: SparkSession, path: str, completion: str, key: str) -> str | None:
    """Commit metadata `key` of the newest commit completed at or before `completion`."""
    timeline = _completed(spark, path)
    done = _between(timeline, None, completion)
    return timeline.readCommitMetadata(done[-1]).getExtraMetadata().get(key) if done else None


def latest_extra(spark: SparkSession, path: str, key: str) -> dict[str, str] | None:
    """All commit metadata of the newest completed commit that has `key` (commits of other writers lack it)."""
    timeline = _completed(spark, path)
    instants = timeline.getReverseOrderedInstants().iterator()
    while instants.hasNext():
        extra = timeline.readCommitMetadata(instants.next()).getExtraMetadata()
        if extra.get(key) is not None:
            return dict(extra)
    return None


def latest_meta(spark: SparkSession, path: str, key: str) -> str | None:
    """Commit metadata `key` of the newest completed commit that has it (commits of other writers lack it)."""
    return (latest_extra(spark, path, key) or {}).get(key)


def instant_of_batch(spark: SparkSession, path: str, key: str, batch: int) -> str | None:
    """Instant time of the newest commit whose numeric metadata `key` is at most `batch` (time travel to it)."""
    timeline = _completed(spark, path)
    found, instants = None, timeline.getInstants().iterator()
    while instants.hasNext():
        instant = instants.next()
        value = timeline.readCommitMetadata(instant).getExtraMetadata().get(key)
        if value is not None and int(value) <= batch:
            found = instant.requestedTime()
    return found


def pending_writes(spark: SparkSession, path: str) -> list[str]:
    """Requested times of the writes in flight whose writer is alive (compaction plans excluded).

    A write is alive while its heartbeat file is fresh. A failed attempt (a conflict that Hudi
    retried under a new instant, a killed job) stays pending on the timeline, its heartbeat
    gone or stale, until a clean rolls it back: waiting for it would wait for nothing. (This
    is Hudi's own test for rolling back failed writes lazily, which multi-writer mode uses.)
    """
    meta = meta_client(spark, path)
    pending = meta.getActiveTimeline().getCommitsTimeline().filterPendingExcludingCompaction().getInstants().iterator()
    jvm = jvm_of(spark.sparkContext)
    storage, now = meta.getStorage(), jvm.System.currentTimeMillis()
    folder = jvm.org.apache.hudi.common.table.HoodieTableMetaClient.getHeartbeatFolderPath(path)
    found = []
    while pending.hasNext():
        instant = pending.next().requestedTime()
        beat = jvm.org.apache.hudi.storage.StoragePath(f"{folder}/{instant}")
        if storage.exists(beat) and now - storage.getPathInfo(beat).getModificationTime() < HEARTBEAT_EXPIRY_MS:
            found.append(instant)
    return found


def extra_meta_after(spark: SparkSession, path: str, completion: str, keys: tuple[str, ...]) -> list[dict[str, str]]:
    """Commit metadata `keys` of every commit completed after `completion` (absent keys left out)."""
    timeline = _completed(spark, path)
    found = []
    for instant in _between(timeline, completion, "9" * 17):
        extra = timeline.readCommitMetadata(instant).getExtraMetadata()
        found.append({k: extra.get(k) for k in keys if extra.containsKey(k)})
    return found


def checkpoint(spark: SparkSession, path: str) -> dict[str, str]:
    """The `_lakehouse.checkpoint` of the newest commit that has one, {} if none (read it with `consumed`).

    Looked up backwards: table services (compaction, clean, clustering) also commit, and
    their commits carry no checkpoint.
    """
    timeline = _completed(spark, path)
    instants = timeline.getReverseOrderedInstants().iterator()
    while instants.hasNext():
        extra = timeline.readCommitMetadata(instants.next()).getExtraMetadata()
        if extra.containsKey(CHECKPOINT_META):
            return json.loads(extra.get(CHECKPOINT_META))
    return {}


def consumed(marks: dict[str, str], source: str) -> str | None:
    """What a checkpoint (`checkpoint`'s marks) says was consumed of the table at `source`.

    Marks name tables relative to the lake root; commits written before held absolute
    paths, which name the same table once made relative, so an existing lake keeps its
    checkpoints (and one copied elsewhere too).
    """
    key = lake_relative(source)
    return next((mark for table, mark in marks.items() if lake_relative(table) == key), None)
