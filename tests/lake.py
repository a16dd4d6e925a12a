"""Reading the lake back, twice: with Spark and with hudi-rs (no JVM), and comparing to the model."""

from __future__ import annotations

from collections import Counter
from typing import Any

from pyspark.sql import SparkSession

from pipelines.bronze import dead_letter_path, ledger_path, main_path
from pipelines.contract import COLUMNS, TABLES
from pipelines.table_stats import exists, read_table
from tests.model import Rows


def _keyed(rows: list[dict[str, Any]], table: str) -> dict[int, dict[str, Any]]:
    ids = Counter(r["id"] for r in rows)
    dup = [k for k, n in ids.items() if n > 1]
    assert not dup, f"bronze/{table}: record keys appear more than once: {dup[:10]}"
    return {r["id"]: r for r in rows}


def bronze_spark(spark: SparkSession, root: str, table: str) -> dict[int, dict[str, Any]]:
    if not exists(main_path(table, root)):
        return {}
    df = spark.read.format("hudi").load(main_path(table, root)).select(*COLUMNS[table], "_lsn", "_op")
    return _keyed([r.asDict() for r in df.collect()], table)


def bronze_hudi_rs(root: str, table: str) -> dict[int, dict[str, Any]]:
    if not exists(main_path(table, root)):
        return {}
    return _keyed(read_table(main_path(table, root), [*COLUMNS[table], "_lsn", "_op"]).to_pylist(), table)


def assert_bronze_equals_model(spark: SparkSession, root: str, expected: Rows,
                               lsns: dict[str, dict[int, int]]) -> None:
    """Both readers see exactly the model's live rows, each at the LSN of the event that made it."""
    for table in TABLES:
        for reader, got in (("spark", bronze_spark(spark, root, table)), ("hudi-rs", bronze_hudi_rs(root, table))):
            data = {k: {c: v[c] for c in COLUMNS[table]} for k, v in got.items()}
            missing = expected[table].keys() - data.keys()
            extra = data.keys() - expected[table].keys()
            wrong = [k for k in expected[table].keys() & data.keys() if data[k] != expected[table][k]]
            assert not (missing or extra or wrong), (
                f"{reader} bronze/{table} differs from the model: missing={sorted(missing)[:10]} "
                f"resurrected/extra={sorted(extra)[:10]} wrong={sorted(wrong)[:5]} "
                f"e.g. {[(data[k], expected[table][k]) for k in sorted(wrong)[:2]]}")
            assert {k: v["_lsn"] for k, v in got.items()} == lsns[table], f"{reader} bronze/{table}: _lsn differs"
            assert {v["_op"] for v in got.values()} <= {"r", "c", "u"}
        # The delete ledger never claims a live key is deleted after its live version.
        if exists(ledger_path(table, root)):
            ledger = {r["id"]: r["_lsn"] for r in read_table(ledger_path(table, root), ["id", "_lsn"]).to_pylist()}
            live = lsns[table]
            assert all(ledger[k] < live[k] for k in ledger.keys() & live.keys()), f"ledger ahead of bronze/{table}"


def dead_letters(root: str) -> list[dict[str, Any]]:
    if not exists(dead_letter_path(root)):
        return []
    return read_table(dead_letter_path(root), ["position", "kafka_topic", "value", "reason"]).to_pylist()
