"""Table services of the lake's Hudi tables: compaction, cleaning, archival.

Run by `lakehouse services` (and so by Airflow's `hudi_table_services`) beside the
writers, through Hudi's own write client with the table's writer options plus the
services and lock options of `hudi_configs/table_services.toml`: it is one more writer
of the table under optimistic concurrency control.

- compaction (merge-on-read tables): a plan is scheduled only when Hudi's planner finds
  file slices with log files; then every pending plan is executed, including a plan
  left by an earlier run that died;
- cleaning: removes file slices older than the table's retention (and rolls back failed
  writes whose heartbeat expired: lazy failed-write cleaning);
- archival: moves old instants out of the active timeline.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from pyspark.sql import SparkSession

import hudi_configs
from pipelines import contract, gold
from pipelines.bronze import hudi_options
from pipelines.etl import silver_options
from pipelines.settings import (
    changelog_path,
    dead_letter_path,
    gold_path,
    ledger_path,
    main_path,
    quarantine_path,
    silver_path,
)
from pipelines.table_stats import exists

log = logging.getLogger(__name__)

SERVICES = ("compact", "clean", "archive")


@dataclass(frozen=True)
class LakeTable:
    name: str  # as `lakehouse status` and the DAG's task ids spell it: bronze/customers, ...
    path: str
    options: dict[str, str] = field(repr=False)

    @property
    def merge_on_read(self) -> bool:
        return self.options.get("hoodie.datasource.write.table.type") == "MERGE_ON_READ"


def lake_tables(root: str) -> list[LakeTable]:
    """Every Hudi table the pipeline writes, with the options its writer uses."""
    tables = []
    for t in contract.TABLES:
        tables += [LakeTable(f"bronze/{t}", main_path(t, root), hudi_options("table", f"bronze_{t}")),
                   LakeTable(f"bronze/_deletes/{t}", ledger_path(t, root),
                             hudi_options("ledger", f"bronze_deletes_{t}")),
                   LakeTable(f"bronze/_changelog/{t}", changelog_path(t, root),
                             hudi_options("changelog", f"bronze_changelog_{t}"))]
    tables.append(LakeTable("bronze/_dead_letters", dead_letter_path(root),
                            hudi_options("dead_letters", "bronze_dead_letters")))
    for t in contract.TABLES:
        tables += [LakeTable(f"silver/{t}", silver_path(t, root), silver_options(f"silver_{t}")),
                   LakeTable(f"silver/_quarantine/{t}", quarantine_path(t, root),
                             silver_options(f"silver_quarantine_{t}"))]
    for t in (gold.STATE, gold.LTV, gold.DAILY):
        tables.append(LakeTable(f"gold/{t}", gold_path(t, root), gold.options(t)))
    return tables


class _Client:
    """A Hudi SparkRDDWriteClient on one table, with the services' options."""

    def __init__(self, spark: SparkSession, table: LakeTable) -> None:
        jvm = spark.sparkContext._jvm
        self._jvm = jvm
        hudi = jvm.org.apache.hudi
        conf = hudi.storage.hadoop.HadoopStorageConfiguration(spark.sparkContext._jsc.hadoopConfiguration())
        self.meta = hudi.common.table.HoodieTableMetaClient.builder().setConf(conf).setBasePath(table.path).build()
        props = jvm.java.util.Properties()
        for key, value in hudi_configs.services(table.options).items():
            props.setProperty(key, value)
        schema = hudi.common.table.TableSchemaResolver(self.meta).getTableAvroSchema(False).toString()
        config = (hudi.config.HoodieWriteConfig.newBuilder().withPath(table.path).withProperties(props)
                  .withSchema(schema).build())
        context = hudi.client.common.HoodieSparkEngineContext(spark.sparkContext._jsc)
        self.client = hudi.client.SparkRDDWriteClient(context, config)

    def __enter__(self) -> _Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()

    def pending_compactions(self) -> list[str]:
        self.meta.reloadActiveTimeline()
        pending = self.meta.getActiveTimeline().filterPendingCompactionTimeline().getInstants().iterator()
        found = []
        while pending.hasNext():
            found.append(pending.next().requestedTime())
        return found

    def compact(self) -> dict[str, object]:
        planned = self.client.scheduleCompaction(self._jvm.org.apache.hudi.common.util.Option.empty())
        done = []
        for instant in self.pending_compactions():
            self.client.compact(instant)
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


def run_services(spark: SparkSession, root: str, tables: Sequence[str] | None = None,
                 services: tuple[str, ...] = SERVICES) -> dict[str, dict[str, object]]:
    """Run `services` on the named tables (all by default); returns what each did, per table.

    A table that does not exist yet is skipped; compaction applies to merge-on-read tables only.
    """
    known = {t.name: t for t in lake_tables(root)}
    names = list(tables) if tables else list(known)
    if unknown := [n for n in names if n not in known]:
        raise ValueError(f"unknown table(s) {', '.join(unknown)}: expected some of {', '.join(known)}")
    report: dict[str, dict[str, object]] = {}
    for name in names:
        table = known[name]
        if not exists(table.path):
            report[name] = {"skipped": "no table yet"}
            continue
        done: dict[str, object] = {}
        with _Client(spark, table) as client:
            for service in services:
                if service == "compact" and not table.merge_on_read:
                    continue
                started = time.monotonic()
                done[service] = getattr(client, service)()
                log.info("%s %s: %s (%.1fs)", name, service, done[service], time.monotonic() - started)
        report[name] = done
    return report
