"""What a piece of Spark work read, from Spark's own bookkeeping (its status stores).

Used to show that an incremental cycle reads in proportion to what changed, and by the
benchmarks: counts, not timings. `rows_read`/`bytes_read` are the stages' input metrics
(every record a scan handed to Spark, before any filter), `files_read` the scans' "number
of files read". Hudi's own reads inside a write (a copy-on-write merge re-reading the file
it rewrites, index lookups) do not go through Spark scans and are not in these figures.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from pyspark.sql import SparkSession

from pipelines.lake.jvm import driver_gateway, jvm_of


@dataclass
class Reads:
    rows_read: int = 0
    bytes_read: int = 0
    files_read: int = 0
    stages: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass
class ReadMeter:
    """`with ReadMeter(spark) as meter: ...`, then `meter.result`; the block must be the only Spark work."""

    spark: SparkSession
    result: Reads = field(default_factory=Reads)
    _stages: set[tuple[int, int]] = field(default_factory=set)
    _executions: set[int] = field(default_factory=set)

    def __enter__(self) -> ReadMeter:
        self._drain()
        self._stages = {key for key, _ in self._stage_items()}
        self._executions = {e.executionId() for e in self._seq(self._sql_store().executionsList())}
        self.result = Reads()
        return self

    def __exit__(self, *exc: object) -> None:
        self._drain()
        reads = Reads()
        for key, stage in self._stage_items():
            if key not in self._stages:
                reads.rows_read += stage.inputRecords()
                reads.bytes_read += stage.inputBytes()
                reads.stages += 1
        sql = self._sql_store()
        files: dict[int, int] = {}
        for execution in self._seq(sql.executionsList()):
            if execution.executionId() in self._executions:
                continue
            values = sql.executionMetrics(execution.executionId())
            for metric in self._seq(execution.metrics()):
                if metric.name() == "number of files read" and values.contains(metric.accumulatorId()):
                    # By accumulator: every execution over a cached plan shows that plan's scan again.
                    n = int(str(values.apply(metric.accumulatorId())).replace(",", ""))
                    files[metric.accumulatorId()] = max(n, files.get(metric.accumulatorId(), 0))
        reads.files_read = sum(files.values())
        self.result = reads

    def _drain(self) -> None:
        self.spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()

    def _stage_items(self) -> Iterator[tuple[tuple[int, int], Any]]:
        sc = self.spark.sparkContext
        jvm = jvm_of(sc)
        # AppStatusStore.stageList(statuses, details, withSummaries, quantiles, taskStatus): every stage.
        quantiles = driver_gateway().new_array(jvm.double, 0)
        stages = sc._jsc.sc().statusStore().stageList(
            jvm.java.util.ArrayList(), False, False, quantiles, jvm.java.util.ArrayList())
        for stage in self._seq(stages):
            yield (stage.stageId(), stage.attemptId()), stage

    def _sql_store(self) -> Any:
        return self.spark._jsparkSession.sharedState().statusStore()

    @staticmethod
    def _seq(seq: Any) -> Iterator[Any]:
        for i in range(seq.size()):
            yield seq.apply(i)
