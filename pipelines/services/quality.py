"""Data quality of the lake: Great Expectations 1.x suites for bronze, silver and gold.

Each lake table (and each cross-table relation, as a DataFrame of its violations) gets a
suite, validated on a Spark DataFrame through a GE checkpoint whose action writes the Data
Docs (HTML) under `<lake root>/_quality/data_docs/`. GE writes local files only: on an object
store, its project folder (`_quality/`) is copied to a local folder for the run and back after
it (`storage.local_copy`), so results and docs live with the lake, not on a driver's disk.
`run_quality` returns one outcome per suite; a failed expectation is reported with the
column, the rule and a few of the values that broke it, so that the Airflow task log says
what is wrong without opening the docs.

Each declared table (`pipelines.lake.declaration`, contract section 7) gets a bronze and a silver suite
from its declaration, not from code: the key, and silver's declared rules (`silver_expectations`).
Gold's suites are the shop's business checks, code like gold itself, and run when gold does.

Row counts against bronze are exact, not approximate: silver + quarantine must hold as
many keys as bronze did at the very batch that silver consumed last (time travel to it),
not as bronze holds now, which the running ingest keeps moving.

A suite that passes records the newest change of each table it read, as of before it read them
(`pipelines.services.quality_due`): the `data_quality` DAG then runs only the suites whose tables changed since.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import great_expectations as gx
import great_expectations.expectations as gxe
from great_expectations.checkpoint import UpdateDataDocsAction
from great_expectations.data_context.types.base import ProgressBarsConfig
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

import hudi_configs
from pipelines.lake import contract, storage
from pipelines.lake.catalog import gold_missing
from pipelines.lake.declaration import RuleKind, TableDecl
from pipelines.lake.hudi_timeline import bronze_instant_consumed, earliest_retained
from pipelines.lake.layout import gold_path, main_path, quarantine_path, silver_path
from pipelines.lake.table_stats import has_completed_commit
from pipelines.runtime import console
from pipelines.runtime.lake import Lake
from pipelines.services.quality_due import quality_root, quality_suites, record_checked, suite_versions
from pipelines.transform.gold import DAILY, DAILY_KEY, LTV
from pipelines.transform.silver import cast_type

if TYPE_CHECKING:
    from great_expectations.data_context.store.store import DataDocsSiteConfigTypedDict

log = logging.getLogger(__name__)

LAYERS = ("bronze", "silver", "gold")


@dataclass(frozen=True)
class Suite:
    name: str  # "silver/orders", "gold/customer_ltv -> silver/customers", ...
    layer: str
    data: Callable[[], DataFrame]
    expectations: Callable[[], list]


@dataclass(frozen=True)
class Outcome:
    suite: str
    success: bool
    failures: list[str]

    def line(self) -> str:
        return f"{'ok    ' if self.success else 'FAILED'} {self.suite}" + "".join(f"\n    - {f}" for f in self.failures)


def _read(lake: Lake, path: str) -> DataFrame:
    """The table at `path` without Hudi's meta columns, through the lake's session: started by the first suite that
    reads, not when the suites are built (the DAG's decision builds them without Spark)."""
    df = lake.spark.read.format("hudi").options(**hudi_configs.section("reads", "scan")).load(path)
    return df.drop(*[c for c in df.columns if c.startswith("_hoodie")])


def _key_checks(*columns: str) -> list:
    if len(columns) > 1:
        return [*(gxe.ExpectColumnValuesToNotBeNull(column=c) for c in columns),
                gxe.ExpectCompoundColumnsToBeUnique(column_list=list(columns))]
    return [gxe.ExpectColumnValuesToNotBeNull(column=columns[0]), gxe.ExpectColumnValuesToBeUnique(column=columns[0])]


def _bronze_at_silver_checkpoint(spark: SparkSession, root: str, table: str) -> int | None:
    """Rows of bronze/<table> as of the batch whose change log silver consumed last; None if unknown."""
    instant = bronze_instant_consumed(spark, root, table, silver_path(table, root))
    if instant is None:
        return None
    if (retained := earliest_retained(spark, main_path(table, root))) and instant < retained:
        log.warning("silver/%s is further behind bronze than bronze's retention (the version of bronze it consumed, "
                    "%s, is cleaned): row count against bronze not checked", table, instant)
        return None
    return spark.read.format("hudi").options(**hudi_configs.section("reads", "scan")) \
        .option("as.of.instant", instant).load(main_path(table, root)).count()


def silver_expectations(table: TableDecl) -> list:
    """A declared table's silver checks, from its declaration: what silver promises its readers.

    Its key is unique (as a whole, for a composite key) and never null; each rule holds on every row
    (`one_of`: in the set, `pattern`: matches, as `rlike` finds it, `min`/`max`: between; GE skips
    NULLs in these, as the rules do); a column whose rule refuses NULLs (`not_null`, alone or beside
    another check) has none; a `cast` column holds the type it was cast to; a derived column is there
    wherever its source value is.
    """
    checks = _key_checks(*table.key)
    types: dict[str, str] = {}
    present: list[str] = []
    for rule in table.rules:
        if rule.kind == RuleKind.ONE_OF:
            checks.append(gxe.ExpectColumnValuesToBeInSet(column=rule.column, value_set=list(rule.value)))
        elif rule.kind == RuleKind.PATTERN:
            checks.append(gxe.ExpectColumnValuesToMatchRegex(column=rule.column, regex=rule.value))
        elif rule.kind in (RuleKind.MIN, RuleKind.MAX):
            checks.append(gxe.ExpectColumnValuesToBeBetween(column=rule.column, **{f"{rule.kind}_value": rule.value}))
        elif rule.kind == RuleKind.CAST:  # the column's last cast is its type in silver
            types[rule.column] = type(cast_type(rule.value)).__name__
        if rule.not_null and rule.column not in present:  # a `not_null` rule, or one beside another check
            present.append(rule.column)
    checks += [gxe.ExpectColumnValuesToNotBeNull(column=c) for c in present if c not in table.key]
    checks += [gxe.ExpectColumnValuesToBeOfType(column=c, type_=t) for c, t in types.items()]
    for d in table.derive:
        checks += [gxe.ExpectColumnValuesToBeOfType(column=d.column, type_="DateType"),
                   gxe.ExpectColumnValuesToNotBeNull(column=d.column, row_condition=f"`{d.date_of}` IS NOT NULL",
                                                     condition_parser="spark")]
    return checks


def suites(lake: Lake, max_age: timedelta) -> list[Suite]:
    """Every suite of the lake: each table of its declaration's, gold's when the declaration has its inputs; each
    reads its data only when validated."""
    fresh_since = datetime.now(UTC).replace(tzinfo=None) - max_age
    root, decl = lake.root, lake.declaration
    out: list[Suite] = []
    for name, table in decl.tables.items():
        def bronze_checks(table: TableDecl = table) -> list:
            return [*_key_checks(*table.key), gxe.ExpectColumnValuesToNotBeNull(column="_lsn"),
                    gxe.ExpectColumnValuesToBeInSet(column="_op", value_set=["r", "c", "u"]),
                    gxe.ExpectTableRowCountToBeBetween(min_value=1),
                    # Freshness: the newest row arrived within max_age.
                    gxe.ExpectColumnMaxToBeBetween(column="_ingested_at", min_value=fresh_since)]
        out.append(Suite(f"bronze/{name}", "bronze", functools.partial(_read, lake, main_path(name, root)),
                         bronze_checks))

    def silver_counts(table: str) -> list:
        bronze = _bronze_at_silver_checkpoint(lake.spark, root, table)
        quarantine = quarantine_path(table, root)
        quarantined = _read(lake, quarantine).count() if has_completed_commit(quarantine) else 0
        return [] if bronze is None else [gxe.ExpectTableRowCountToEqual(value=bronze - quarantined)]

    def silver_checks(table: TableDecl) -> list:
        return [*silver_expectations(table), *silver_counts(table.name)]

    for name, table in decl.tables.items():
        out.append(Suite(f"silver/{name}", "silver", functools.partial(_read, lake, silver_path(name, root)),
                         functools.partial(silver_checks, table)))
    if gold_missing(decl):  # gold does not run (pipelines.transform.etl says why): nothing of it to check
        return out

    def ltv() -> DataFrame:
        return _read(lake, gold_path(LTV, root))

    def silver_customers() -> DataFrame:
        return _read(lake, silver_path("customers", root))

    out.append(Suite("gold/customer_ltv", "gold", ltv, lambda: [
        *_key_checks("customer_id"),
        gxe.ExpectColumnValuesToBeBetween(column="orders_count", min_value=0),
        gxe.ExpectColumnValuesToBeBetween(column="total_amount", min_value=0),
        gxe.ExpectTableRowCountToEqual(value=silver_customers().count())]))
    # Referential checks: the rows that break the relation, which must be none.
    out.append(Suite("gold/customer_ltv -> silver/customers", "gold",
                     lambda: ltv().join(silver_customers().withColumnRenamed("id", "customer_id"), "customer_id",
                                        "left_anti"),
                     lambda: [gxe.ExpectTableRowCountToEqual(value=0)]))
    out.append(Suite(f"gold/{DAILY}", "gold", lambda: _read(lake, gold_path(DAILY, root)), lambda: [
        *_key_checks(*DAILY_KEY),
        gxe.ExpectColumnValuesToBeBetween(column="orders_count", min_value=1),
        gxe.ExpectColumnValuesToBeInSet(column="currency", value_set=list(contract.CURRENCIES)),
        gxe.ExpectColumnValuesToMatchRegex(column="country", regex=f"{contract.COUNTRY_PATTERN}|^\\?\\?$"),
        gxe.ExpectColumnValuesToBeBetween(column="revenue", min_value=0)]))
    out.append(Suite(f"gold/{DAILY} -> silver/orders", "gold",
                     lambda: _daily_vs_silver(lake), lambda: [gxe.ExpectTableRowCountToEqual(value=0)]))
    return out


def _daily_vs_silver(lake: Lake) -> DataFrame:
    """Days whose order count in daily_revenue differs from silver's counted orders of that day."""
    root = lake.root
    orders = _read(lake, silver_path("orders", root)).filter(~F.col("status").isin("cancelled", "refunded"))
    silver = orders.groupBy("order_date").agg(F.count("*").alias("silver_orders"))
    daily = _read(lake, gold_path(DAILY, root)).groupBy("order_date").agg(F.sum("orders_count").alias("gold_orders"))
    return silver.join(daily, "order_date", "full_outer").filter(
        ~F.coalesce("silver_orders", F.lit(0)).eqNullSafe(F.coalesce("gold_orders", F.lit(0))))


def _describe(result) -> str:
    config = result.expectation_config
    kwargs = {k: v for k, v in config.kwargs.items() if k not in ("batch_id", "result_format")}
    detail = result.result or {}
    seen = detail.get("partial_unexpected_list") or detail.get("observed_value")
    count = detail.get("unexpected_count")
    what = f"{count} unexpected, e.g. {seen[:5]}" if count and isinstance(seen, list) else f"observed {seen!r}"
    return f"{config.type}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())}): {what}"


def run_quality(lake: Lake, layers: tuple[str, ...] = LAYERS, max_age: timedelta = timedelta(hours=24),
                names: tuple[str, ...] = ()) -> list[Outcome]:
    """Validate the lake's suites of `layers` (only those named in `names`, when given); writes the Data Docs under
    its root; returns one outcome per suite."""
    # The lake's session first: Great Expectations' Spark data source would otherwise start one without its settings.
    _ = lake.spark
    with storage.local_copy(quality_root(lake.root)) as base:
        return _run_quality(lake, base, layers, max_age, names)


_SITE = "lake"


def _context(base: Path):  # -> FileDataContext
    """GE's file context in `base` (a lake's `_quality/` or its local copy), its Data Docs in `base`/data_docs."""
    context = gx.get_context(mode="file", project_root_dir=str(base))
    # GE draws a `Calculating Metrics` bar per validation, into task logs and pipes too; a
    # person at a terminal gets one bar over the suites instead (`_run_quality`).
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    config: DataDocsSiteConfigTypedDict = {
        "class_name": "SiteBuilder",
        "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(base / "data_docs")},
        "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"}}
    # Set on every run: the folder of a local copy differs from one run to the next.
    if _SITE in context.get_site_names():
        context.update_data_docs_site(_SITE, config)
    else:
        context.add_data_docs_site(site_name=_SITE, site_config=config)
    return context


def _run_quality(lake: Lake, base: Path, layers: tuple[str, ...], max_age: timedelta,
                 names: tuple[str, ...]) -> list[Outcome]:
    """Validate the chosen suites in the quality folder `base` (the lake's, or its local copy); record those that
    passed."""
    context = _context(base)
    # persist=False: GE would cache every frame it validates, and cached plans are what
    # Hudi's data-skipping lookups deadlock against (reads.toml [scan]).
    source = context.data_sources.add_or_update_spark(name="lake", persist=False)
    outcomes = []
    specs = {spec.name: spec for spec in quality_suites(lake.declaration)}
    chosen = [suite for suite in suites(lake, max_age)
              if suite.layer in layers and (not names or suite.name in names)]
    for suite in console.progress(chosen, "quality suites"):
        started = time.monotonic()
        spec = specs[suite.name]
        asset_name = spec.file_name
        # Before reading: a commit meanwhile leaves the suite due.
        versions = suite_versions(spec, lake.root, lake.declaration)
        try:
            data = suite.data()
            expectations = suite.expectations()
        except Exception as exc:  # a table that cannot be read is a failed check, not a crash of the others
            outcomes.append(Outcome(suite.name, False, [f"cannot read: {str(exc).splitlines()[0]}"]))
            log.info("%s", outcomes[-1].line())
            continue
        asset = source.add_dataframe_asset(name=asset_name) if asset_name not in source.get_asset_names() \
            else source.get_asset(asset_name)
        batch = asset.add_batch_definition_whole_dataframe("all") if not asset.batch_definitions \
            else asset.get_batch_definition("all")
        gx_suite = context.suites.add_or_update(gx.ExpectationSuite(name=asset_name, expectations=expectations))
        validation = context.validation_definitions.add_or_update(
            gx.ValidationDefinition(name=asset_name, data=batch, suite=gx_suite))
        run = context.checkpoints.add_or_update(gx.Checkpoint(
            name=asset_name, validation_definitions=[validation],
            actions=[UpdateDataDocsAction(name="docs", site_names=[_SITE])],
            result_format={"result_format": "SUMMARY", "partial_unexpected_count": 5})
        ).run(batch_parameters={"dataframe": data})
        failures = [_describe(r) for v in run.run_results.values() for r in v.results if not r.success]
        outcomes.append(Outcome(suite.name, run.success, failures))
        if run.success:
            record_checked(str(base), spec, versions)
        log.info("%s (%.1f s)", outcomes[-1].line(), time.monotonic() - started)
    return outcomes


def data_docs_index(root: str) -> str:
    return f"{quality_root(root)}/data_docs/index.html"


# ---------------------------------------------------------------- erasure (pipelines.gdpr.erase)

ERASED = "[erased]"
# Where a result keeps the values that broke an expectation.
_UNEXPECTED = ("partial_unexpected_list", "partial_unexpected_counts", "partial_unexpected_index_list",
               "unexpected_list", "unexpected_index_list")


def redact_subject(root: str, texts: set[str], customers: set[int], orders: set[int]) -> dict[str, int]:
    """Replace an erased customer's values in the stored validation results, then build the Data Docs again.

    A failed expectation keeps a few of the values that broke it: an e-mail that did not
    match, a duplicated id. The results stay (they are the history of the checks), with those
    values replaced by a marker; the Data Docs are HTML rendered from them, so they are
    rebuilt rather than edited. Ids are replaced only in the values of an id column (`id`
    of the suite's customers or orders, `customer_id`): elsewhere a number is not an id.
    """
    with storage.local_copy(quality_root(root)) as base:
        return _redact(base, texts, customers, orders)


def _redact(base: Path, texts: set[str], customers: set[int], orders: set[int]) -> dict[str, int]:
    store = base / "gx" / "uncommitted" / "validations"
    lowered = [t.lower() for t in texts]
    redacted = 0
    for path in sorted(store.rglob("*.json")) if store.is_dir() else []:
        original = json.loads(path.read_text())
        result = _scrub(original, lowered, set())  # a copy: `original` stays as read
        suite = str(result.get("suite_name", "")).split("__")[0]
        for check in result.get("results", []):
            column = (check.get("expectation_config") or {}).get("kwargs", {}).get("column")
            ids = (customers if column == "customer_id" or (column == "id" and "customers" in suite)
                   else orders if column == "id" and "orders" in suite else set())
            detail = check.get("result") or {}
            for key in _UNEXPECTED:
                if key in detail:
                    detail[key] = _scrub(detail[key], lowered, ids)
        if result != original:
            path.write_text(json.dumps(result, indent=2))
            redacted += 1
    if redacted:
        storage.remove_tree(str(base / "data_docs"))
        _context(base).build_data_docs()
    return {"validation_results_redacted": redacted, "data_docs_rebuilt": int(bool(redacted))}


def _scrub(value: Any, texts: list[str], ids: set[int]) -> Any:
    """`value` with every string holding one of `texts`, and every number in `ids`, replaced by ERASED."""
    if isinstance(value, str):
        return ERASED if any(t in value.lower() for t in texts) else value
    if isinstance(value, int) and not isinstance(value, bool):
        return ERASED if value in ids else value
    if isinstance(value, dict):
        return {k: _scrub(v, texts, ids) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub(v, texts, ids) for v in value]
    return value
