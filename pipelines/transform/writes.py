"""The ETL's writes: one Hudi commit of a table's output that also records what it consumed.

Silver and gold keep their progress in their own commits (`_lakehouse.checkpoint`), so a crash between
writing the output and recording the checkpoint cannot happen: the two are one commit.
"""

from __future__ import annotations

import json

from pyspark.sql import DataFrame

from pipelines.lake.hudi_timeline import CHECKPOINT_META
from pipelines.lake.layout import lake_relative
from pipelines.metastore import catalog_sync
from pipelines.monitoring.lineage import named_for_lineage
from pipelines.runtime.hudi_writes import save


def write_with_checkpoint(df: DataFrame, path: str, options: dict[str, str], marks: dict[str, str]) -> None:
    """One Hudi commit of `df` that also records what it consumed: output and checkpoint move together.

    `marks` maps the paths of the tables read to what was read of them; they are stored
    relative to the lake root, so the lake can move (a local lake copied to an object store).
    """
    keyed = {lake_relative(source): mark for source, mark in marks.items()}
    save(df, path, {**named_for_lineage(path, options), CHECKPOINT_META: json.dumps(keyed, sort_keys=True)})
    catalog_sync.committed(df.sparkSession, path, options)
