"""Hudi's write client on one lake table, for the work that is not a datasource write: compaction,
clustering, cleaning, archival, and the erasure's rewrites."""

from __future__ import annotations

from typing import Self, TypedDict

from pyspark.sql import SparkSession

import hudi_configs
from pipelines.lake.catalog import LakeTable
from pipelines.lake.hudi_timeline import meta_client
from pipelines.lake.jvm import jvm_of
from pipelines.lake.write_errors import check_commit, commit_of


class Plans(TypedDict):
    """What a compaction or a clustering did: the instant it planned (None: nothing to plan), the plans it ran."""

    planned: str | None
    executed: list[str]


class WriteClient:
    """A Hudi SparkRDDWriteClient on one table, with the services' options (`options`: others, as given).

    The table services, bronze's compactions beside the stream and the erasure's purge all act
    on a table through Hudi's own client, as one more writer of it; this is that client.
    """

    def __init__(self, spark: SparkSession, table: LakeTable, options: dict[str, str] | None = None) -> None:
        jvm = jvm_of(spark.sparkContext)
        self.jvm = jvm
        self.spark = spark
        self.table = table
        hudi = jvm.org.apache.hudi
        self.meta = meta_client(spark, table.path)
        props = jvm.java.util.Properties()
        for key, value in (hudi_configs.services(table.options) if options is None else options).items():
            props.setProperty(key, value)
        schema = hudi.common.table.TableSchemaResolver(self.meta).getTableAvroSchema(False).toString()
        self.config = (hudi.config.HoodieWriteConfig.newBuilder().withPath(table.path).withProperties(props)
                        .withSchema(schema).build())
        self.context = hudi.client.common.HoodieSparkEngineContext(spark.sparkContext._jsc)
        self.client = hudi.client.SparkRDDWriteClient(self.context, self.config)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()

    def _pending(self, kind: str) -> list[str]:
        timeline = self.meta.reloadActiveTimeline()
        pending = getattr(timeline, f"filterPending{kind}Timeline")().getInstants().iterator()
        found = []
        while pending.hasNext():
            found.append(pending.next().requestedTime())
        return found

    def _check(self, requested: str) -> None:
        """WriteFailed, the commit rolled back, when the service's commit `requested` failed some of its records: a
        compaction or clustering that left records out of the files it wrote would lose them from every read."""
        if (done := commit_of(self.table.path, requested)) is not None:
            check_commit(self.table.path, done[0], done[1], self.config.getTableName() or None, self.client.rollback)

    def compact(self) -> Plans:
        planned = self.client.scheduleCompaction(self.jvm.org.apache.hudi.common.util.Option.empty())
        return {"planned": planned.get() if planned.isPresent() else None, "executed": self.run_compactions()}

    def run_compactions(self) -> list[str]:
        """Execute every pending compaction plan, oldest first (one a crash cut short is rolled back and run again)."""
        done = []
        for instant in self._pending("Compaction"):
            self.client.compact(instant)
            self._check(instant)
            done.append(instant)
        return done

    def cluster(self) -> Plans:
        """Plan (days other than the newest, files under the small-file limit) and run every pending plan."""
        planned = self.client.scheduleClustering(self.jvm.org.apache.hudi.common.util.Option.empty())
        done = []
        for instant in self._pending("Clustering"):
            self.client.cluster(instant, True)
            self._check(instant)
            done.append(instant)
        return {"planned": planned.get() if planned.isPresent() else None, "executed": done}

    def clean(self) -> dict[str, object]:
        meta = self.client.clean()
        if meta is None:
            return {"files_deleted": 0}
        return {"files_deleted": meta.getTotalFilesDeleted(), "earliest_retained": meta.getEarliestCommitToRetain()}

    def archive(self) -> dict[str, object]:
        before = self.meta.reloadActiveTimeline().countInstants()
        self.client.archive()
        return {"instants_archived": before - self.meta.reloadActiveTimeline().countInstants()}
