"""Spark frames as every layer keeps them between jobs: computed once as plan leaves, freed on time."""

from __future__ import annotations

import functools

from pyspark.sql import DataFrame

from pipelines.lake.jvm import jvm_of


def materialized(frame: DataFrame) -> DataFrame:
    """`frame` computed now, as a leaf of every plan built on it; `release` frees it.

    A cached frame keeps its whole plan (the parse's JSON schemas, the plan's joins), and each
    Dataset built on it has that plan analyzed again, Hudi's analyzer rules walking every node.
    A leaf is not analyzed again, which saves the analyzer's walk of every node per Dataset (most
    of a second per stream batch).

    In one JVM (local mode) the leaf is a local checkpoint, blocks in the block manager. On a
    cluster those blocks live in an executor, and when it is lost no later job can compute the
    frame again: an executor SIGKILLed under a batch would fail that batch and every later one
    ("Checkpoint block ... not found"; tests/test_cluster.py kills one), the stream's known rows
    being such frames. There the session has a checkpoint folder (pipelines/runtime/spark.py) and the
    leaf is a reliable checkpoint: files that any executor reads.
    """
    if frame.sparkSession.sparkContext.getCheckpointDir() is None:
        return frame.localCheckpoint()
    return frame.checkpoint()


def release(frame: DataFrame) -> None:
    """Free a `materialized` frame's blocks (or checkpoint files) now: unreferenced, they would wait for
    the JVM's garbage collector (Spark's ContextCleaner, up to 30 minutes), a parsed batch each."""
    rdd = frame._jdf.queryExecution().logical().rdd()
    rdd.unpersist(False)
    context = frame.sparkSession.sparkContext
    if (folder := context.getCheckpointDir()) is not None:
        path = jvm_of(context).org.apache.hadoop.fs.Path(f"{folder}/rdd-{rdd.id()}")
        path.getFileSystem(context._jsc.hadoopConfiguration()).delete(path, True)


def union_all(frames: list[DataFrame]) -> DataFrame:
    """The rows of all `frames`, matched by column name."""
    return functools.reduce(DataFrame.unionByName, frames)
