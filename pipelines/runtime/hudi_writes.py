"""Every datasource write of the lake to a Hudi table, checked for the records Hudi failed to write.

Hudi's datasource can commit a write that failed some of its records (`pipelines.lake.write_errors`); `save` is
the one way the project writes a DataFrame to a Hudi table, so that no write goes unchecked. A commit with
errors is rolled back through Hudi's write client and `WriteFailed` raised: the caller fails as it would for
any other failed write (the stream's batch fails and is re-run from the positions in bronze's commits, an etl
cycle or a table service fails and runs again).
"""

from __future__ import annotations

import logging
import uuid

from pyspark.sql import DataFrame, SparkSession

from pipelines.lake.catalog import LakeTable
from pipelines.lake.jvm import jvm_of
from pipelines.lake.layout import lake_relative
from pipelines.lake.write_errors import WRITE_META, check_commit, own_commit
from pipelines.runtime.hudi_client import WriteClient

log = logging.getLogger(__name__)


def save(rows: DataFrame, path: str, options: dict[str, str]) -> None:
    """One Hudi commit of `rows` at `path` (mode append) with the writer `options`; WriteFailed, with the commit
    rolled back, when Hudi failed to write some of them.

    The check costs a listing of the table's timeline and a read of the commit's metadata file: the write marks
    its commit (WRITE_META), and only commits requested since the write began are looked at.
    """
    spark = rows.sparkSession
    token, since = uuid.uuid4().hex, _now(spark)
    rows.write.format("hudi").options(**options).option(WRITE_META, token).mode("append").save(path)
    if (done := own_commit(path, token, since)) is not None:
        instant, metadata = done
        check_commit(path, instant, metadata, options.get("hoodie.table.name"),
                     lambda requested: roll_back(spark, path, options, requested))


def _now(spark: SparkSession) -> str:
    """The instant time now, as Hudi's JVM spells it (its clock and the timeline's time zone, not this process's)."""
    jvm = jvm_of(spark.sparkContext)
    return str(jvm.org.apache.hudi.common.table.timeline.HoodieInstantTimeGenerator.formatDate(jvm.java.util.Date()))


def roll_back(spark: SparkSession, path: str, options: dict[str, str], requested: str) -> None:
    """Roll the completed commit `requested` of `path` back through Hudi's write client, with the writer's `options`
    (its lock, where writers share the table): its files go, the timeline gets a rollback, readers no longer see it."""
    log.warning("%s: rolling back commit %s, which failed some of its records", lake_relative(path), requested)
    with WriteClient(spark, LakeTable(lake_relative(path), path, options), options) as client:
        if not client.client.rollback(requested):
            raise RuntimeError(f"Hudi's write client did not roll back {requested}")
