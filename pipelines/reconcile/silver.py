"""`lakehouse reconcile --layer silver`: each declared table's silver and quarantine against bronze and the rules.

What silver/<table> and its quarantine hold is a pure function of bronze's live rows and the declaration: the
rows `pipelines.transform.silver.clean` finds valid, with the columns `silver_columns` names (the kept metadata
`_lsn` and `_source_ts` among them) and the derived ones; in quarantine the others, as bronze holds them, with
the rule each failed (`pipelines.transform.silver.split`, the ETL's own split). Rows of erased customers are in
neither (the erasure registry, as the ETL filters with it); deleted keys are in neither. That expectation is
computed here from a snapshot of bronze and compared with what the ETL wrote, key by key.

The ETL runs on a schedule, so silver is behind bronze between its cycles. Each output is compared with bronze
as of the version it consumed last (its checkpoint names a point of bronze's change log, whose batch id names
main's commit: `bronze_instant_consumed`), read by Hudi's time travel: an output that is merely behind is not
drift. When that version is unknown or cleaned, bronze's newest is used and the report says so (`as_of` None).

Both sides are tables of the lake, read by one Spark session: they are compared by a full outer join, on the
key's canonical text, of each row's hash (md5 of the canonical texts of `pipelines.reconcile.canonical`, per
Spark type), in the cluster. No row crosses a network to a database, so the bucketed digests of bronze's
reconcile (which spare moving the source's rows) would spare nothing here. One aggregation of the join gives
every count; only when something differs are the first `listed` keys of each kind collected.
"""

from __future__ import annotations

import time
from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from pipelines.errors import ReconcileError
from pipelines.lake.declaration import TableDecl
from pipelines.lake.erasure_registry import read_registry, without_erased
from pipelines.lake.hudi_timeline import bronze_instant_consumed, earliest_retained
from pipelines.lake.layout import main_path, quarantine_path, silver_path
from pipelines.lake.table_stats import has_completed_commit
from pipelines.reconcile.canonical import SourceColumn, row_text, spark_text
from pipelines.reconcile.compare import TableReport
from pipelines.runtime.lake import Lake
from pipelines.transform.silver import SILVER_OWN, clean, is_metadata, silver_columns, split

# The PostgreSQL type whose canonical text a Spark type shares (decimals and arrays by their prefix).
_TYPENAME = {"tinyint": "int8", "smallint": "int8", "int": "int8", "bigint": "int8", "float": "float8",
             "double": "float8", "boolean": "bool", "date": "date", "timestamp": "timestamp",
             "timestamp_ntz": "timestamp", "binary": "bytea", "string": "text"}
KINDS = ("missing", "extra", "differ")


def comparable(name: str, dtype: str) -> SourceColumn | None:
    """A Spark column of type `dtype` (its simple string) as the source column whose canonical text it shares;
    None for a type without one (a struct, a map)."""
    if dtype.startswith("array<"):
        return SourceColumn(name, "_array", "A")
    if dtype.startswith("decimal("):
        return SourceColumn(name, "numeric", "N")
    typname = _TYPENAME.get(dtype)
    return None if typname is None else SourceColumn(name, typname, "X")


def expected_outputs(lake: Lake, decl: TableDecl, bronze: DataFrame) -> tuple[DataFrame, DataFrame]:
    """(silver, quarantine) as the ETL makes them of `bronze`'s live rows: the valid rows cleaned, and the invalid
    ones as bronze holds them (silver's source columns and `_lsn`) with `failed_rule`."""
    if decl.subject and (registry := read_registry(lake.spark, lake.root)) is not None:
        bronze = without_erased(bronze, decl.name, registry, lake.erasure_key, lake.declaration)
    columns = silver_columns(decl, bronze.columns)
    raw = bronze.select(*[c for c in columns if c != "_source_ts"])  # the ETL's quarantine drops _source_ts
    return split(clean(bronze, decl, columns), raw, decl.key)


def bronze_as_of(lake: Lake, table: str, output: str) -> tuple[DataFrame, str | None]:
    """bronze/<table>'s live rows as of the version the output at `output` consumed last, and that version's
    instant (None: unknown or cleaned, bronze's newest read instead)."""
    main = main_path(table, lake.root)
    instant = bronze_instant_consumed(lake.spark, lake.root, table, output)
    if instant is not None and (retained := earliest_retained(lake.spark, main)) and instant < retained:
        instant = None
    reader = lake.spark.read.format("hudi")
    return (reader.option("as.of.instant", instant) if instant else reader).load(main), instant


def reconcile_silver(lake: Lake, name: str, listed: int = 20) -> list[TableReport]:
    """The reports of silver/<name> and of its quarantine against what the declaration makes of bronze, each
    naming the first `listed` keys of each kind."""
    decl = lake.declaration.tables[name]
    if not has_completed_commit(main_path(name, lake.root)):
        raise ReconcileError(f"bronze/{name} has no commit yet: nothing to reconcile (has the stream run?)")
    if not has_completed_commit(silver_path(name, lake.root)):
        raise ReconcileError(f"silver/{name} has no commit yet: nothing to reconcile (has `lakehouse etl` run?)")
    expected: dict[str | None, tuple[DataFrame, DataFrame]] = {}
    reports = []
    for i, (layer, path) in enumerate((("silver", silver_path(name, lake.root)),
                                       ("silver_quarantine", quarantine_path(name, lake.root)))):
        started = time.monotonic()
        bronze, instant = bronze_as_of(lake, name, path)
        if instant not in expected:  # silver's and its quarantine's versions are one but after a crash
            expected[instant] = expected_outputs(lake, decl, bronze)
        want = expected[instant][i]
        held = lake.spark.read.format("hudi").load(path) if has_completed_commit(path) else \
            lake.spark.createDataFrame([], want.schema)
        report = TableReport(name, f"bronze/{name}", layer=layer, as_of=instant)
        compare(want, held, decl.key, listed, report)
        report.seconds = round(time.monotonic() - started, 3)
        reports.append(report)
    return reports


def compared_columns(expected: DataFrame, held: DataFrame, key: tuple[str, ...],
                     report: TableReport) -> list[str]:
    """The columns compared, the key first: those both sides hold with a canonical form. The report names the
    others: expected ones the table lacks (`source_only`), and those of no canonical form or that only the
    table holds (`not_compared`); the table's own metadata (Hudi's, the quarantine's CDC metadata besides
    `_lsn`, `_quarantined_at`) is left out unnamed: it says how a row arrived, not what it is."""
    want, have = dict(expected.dtypes), dict(held.dtypes)
    ordered = [*key, *(c for c in want if c not in key)]
    report.source_only = [c for c in ordered if c not in have]
    report.not_compared = [f"{c} ({t})" for c, t in want.items() if c in have and comparable(c, t) is None] + \
        [f"{c} (only in {report.layer})" for c in have
         if c not in want and not is_metadata(c) and c not in SILVER_OWN]
    columns = [c for c in ordered if c in have and comparable(c, want[c]) and comparable(c, have[c])]
    if lacking := [k for k in key if k not in columns]:
        raise ReconcileError(f"{report.layer}/{report.table}: key column(s) {', '.join(lacking)} cannot be compared")
    return columns


def _canonical(df: DataFrame, columns: list[str], key: tuple[str, ...], side: str) -> DataFrame:
    """`df` as (`_k` its key's text, `_h<side>` its row's hash, `_<side><i>` each column's text)."""
    dtypes = dict(df.dtypes)
    texts = [spark_text(comparable(c, dtypes[c]) or SourceColumn(c, "text", "S"), dtypes[c]) for c in columns]
    return df.select(row_text(texts[:len(key)]).alias("_k"), F.md5(row_text(texts)).alias(f"_h{side}"),
                     *[t.alias(f"_{side}{i}") for i, t in enumerate(texts)])


def _kind() -> Column:
    return (F.when(F.col("_hl").isNull(), "missing").when(F.col("_hs").isNull(), "extra")
            .when(F.col("_hs") != F.col("_hl"), "differ"))


def compare(expected: DataFrame, held: DataFrame, key: tuple[str, ...], listed: int, report: TableReport) -> None:
    """Fill `report` with `held` against `expected`, by key: the rows of each, the keys `held` lacks (missing),
    those only it holds (extra), those whose values differ (with the columns), the first `listed` of each."""
    columns = compared_columns(expected, held, key, report)
    joined = _canonical(expected, columns, key, "s").join(_canonical(held, columns, key, "l"), "_k", "full_outer") \
        .withColumn("_kind", _kind())
    sums = joined.agg(F.count("_hs").alias("s"), F.count("_hl").alias("l"),
                      *[F.count(F.when(F.col("_kind") == k, 1)).alias(k) for k in KINDS]).first()
    assert sums is not None  # an aggregation without grouping has one row
    report.source_rows, report.lake_rows = int(sums["s"]), int(sums["l"])
    report.counts = {k: int(sums[k]) for k in KINDS} | {"unsettled": 0}
    found: dict[str, list[Any]] = {k: joined.where(F.col("_kind") == k).orderBy("_k").limit(listed).collect()
                                   if report.counts[k] else [] for k in KINDS}
    report.rows_read = {side: sum(1 for rows in found.values() for r in rows if r[f"_h{c}"] is not None)
                        for side, c in (("source", "s"), ("lake", "l"))}

    def key_of(row: Any, side: str) -> dict[str, Any]:
        return {k: row[f"_{side}{i}"] for i, k in enumerate(key)}

    report.missing = [key_of(r, "s") for r in found["missing"]]
    report.extra = [key_of(r, "l") for r in found["extra"]]
    report.differ = [{"key": key_of(r, "s"), "columns": {
        c: {"source": r[f"_s{i}"], "lake": r[f"_l{i}"]} for i, c in enumerate(columns) if r[f"_s{i}"] != r[f"_l{i}"]}}
        for r in found["differ"]]
