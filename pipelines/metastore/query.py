"""The lake's tables by name: Spark SQL on the catalog, time travel, and whether the catalog is in step.

The catalog is the one the writers sync to (pipelines/metastore/catalog_sync.py): the Hive Metastore of
`LAKEHOUSE_METASTORE_URI`, or Glue on EMR. Reading `silver.orders` there is a Hudi read of the
table's path (its provider and schema are in the catalog's entry), so a read by name sees every
commit, synced or not; the catalog only has to know the table, its columns and its partitions.

Time travel (`--as-of`) is Spark's `TIMESTAMP AS OF`, which Hudi answers from the timeline for each
table of a statement. What Hudi does not say is that the instant is too old: for a time before a
table's oldest retained commit (the cleaner deleted the files of older versions; older commits
may be archived) it returns no rows, or rows of files that survived, without an error. So each
table's retained commits are looked up first, and such a read is refused naming them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import sqlglot
from sqlglot import exp

from pipelines.errors import QueryError
from pipelines.lake.catalog import lake_catalog
from pipelines.metastore.catalog_sync import catalog_name

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from pipelines.lake.declaration import Declaration

DIALECT = "spark"
# Hudi's instant format: yyyyMMddHHmmssSSS (the timeline's own zone, UTC on this project's machines).
_INSTANT = re.compile(r"^\d{17}$")
_TIME = re.compile(r"^(\d{4})-(\d{2})-(\d{2})(?:[ T](\d{2}):(\d{2})(?::(\d{2})(?:\.(\d{1,3}))?)?)?$")
# A table against its catalog entry, as `lakehouse catalog status` prints it.
CatalogState = Literal["no table yet", "not registered", "in step", "behind"]


def as_of_instant(value: str) -> str:
    """`--as-of` as a Hudi instant: `20261128183000123` as it is, `2026-11-28 18:30[:00[.123]]` or a date
    made into one the way Hudi's `TIMESTAMP AS OF` reads them (the timeline's wall clock, no zone)."""
    value = value.strip()
    if _INSTANT.match(value):
        return value
    if m := _TIME.match(value):
        year, month, day, hour, minute, second, millis = m.groups()
        return f"{year}{month}{day}{hour or '00'}{minute or '00'}{second or '00'}{(millis or '').ljust(3, '0')}"
    raise QueryError(f"--as-of {value!r}: expected an instant (20261128183000123) or a time "
                     "(2026-11-28 18:30:00[.123], or a date)")


def _parse(sql: str) -> exp.Expr:
    try:
        return sqlglot.parse_one(sql, dialect=DIALECT)
    except sqlglot.errors.ParseError as exc:
        first = exc.errors[0] if exc.errors else {}
        where = f" (line {first['line']}, column {first['col']})" if "line" in first else ""
        raise QueryError(f"cannot parse the statement: {first.get('description', exc)}{where}") from exc


def _read_tables(tree: exp.Expr) -> list[exp.Table]:
    """The table references of a parsed statement, without those that name one of its CTEs."""
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    return [t for t in tree.find_all(exp.Table) if t.name and (t.db or t.name.lower() not in ctes)]


def referenced_tables(sql: str) -> list[str]:
    """The tables a statement reads, as written (`silver.orders`), without its CTEs' names."""
    names = [f"{t.db}.{t.name}".lower() if t.db else t.name.lower() for t in _read_tables(_parse(sql))]
    return list(dict.fromkeys(names))


def with_as_of(sql: str, instant: str) -> str:
    """The statement with `TIMESTAMP AS OF '<instant>'` on every table it reads (not on its CTEs)."""
    tree = _parse(sql)
    for table in _read_tables(tree):
        table.set("version", exp.Version(this="TIMESTAMP", kind="AS OF", expression=exp.Literal.string(instant)))
    return tree.sql(dialect=DIALECT)


def _catalog_tables(spark: SparkSession, database: str) -> list[str]:
    if not spark.catalog.databaseExists(database):
        return []
    return sorted(t.name for t in spark.catalog.listTables(database))


def require_tables(spark: SparkSession, names: list[str]) -> None:
    """QueryError naming a table the catalog does not have, and what its database has."""
    for name in names:
        if spark.catalog.tableExists(name):
            continue
        database = name.split(".", 1)[0] if "." in name else "default"
        have = _catalog_tables(spark, database)
        known = f"{database} has: {', '.join(have)}" if have else \
            f"no database {database!r} holds lake tables; the lake's are bronze, silver, gold"
        raise QueryError(f"no table {name} in the catalog ({known}). A table is registered at its "
                         "first commit with LAKEHOUSE_METASTORE_URI set; `lakehouse catalog sync` "
                         "registers a lake written before")


def locations(spark: SparkSession, names: list[str]) -> dict[str, str]:
    """Each named table's path, from its catalog entry."""
    return {name: next(r.data_type for r in spark.sql(f"DESCRIBE TABLE EXTENDED {name}").collect()
                       if r.col_name == "Location") for name in names}


def check_retained(spark: SparkSession, tables: dict[str, str], instant: str) -> None:
    """QueryError when a table holds no version as of `instant`: before its oldest retained commit."""
    from pipelines.lake.hudi_timeline import retained_instants

    for name, path in tables.items():
        retained = retained_instants(spark, path)
        if not retained:
            raise QueryError(f"{name} has no completed commit to read as of {instant}")
        if instant < retained[0]:
            raise QueryError(f"{name} holds no version as of {instant}: its oldest retained commit is "
                             f"{retained[0]} (retained: {len(retained)} commits, {retained[0]} to {retained[-1]}; "
                             "older versions were cleaned or archived)")


def run_sql(spark: SparkSession, sql: str, as_of: str | None = None) -> DataFrame:
    """Run a statement on the catalog's tables, every table as of `as_of` when given (see `as_of_instant`)."""
    names = referenced_tables(sql)
    require_tables(spark, names)
    if as_of is None:
        return spark.sql(sql)
    instant = as_of_instant(as_of)
    check_retained(spark, locations(spark, names), instant)
    return spark.sql(with_as_of(sql, instant))


@dataclass(frozen=True)
class SyncState:
    """One lake table against its catalog entry."""

    table: str  # lake name: bronze/orders
    name: str  # catalog name: bronze.orders
    newest: str | None  # the timeline's newest completed commit (None: no table yet)
    synced: str | None  # the catalog's `last_commit_time_sync` (None: not registered)

    @property
    def state(self) -> CatalogState:
        if self.newest is None:
            return "no table yet"
        if self.synced is None:
            return "not registered"
        return "in step" if self.synced >= self.newest else "behind"


def sync_states(spark: SparkSession, root: str, decl: Declaration) -> list[SyncState]:
    """Every table of `decl`'s lake at `root`: its newest commit against what the catalog last synced of it.

    `spark` is a session on the catalog (`catalog_sync.catalog_session_conf`), which a lake's own may not be.
    """
    from pipelines.lake.hudi_timeline import latest_instant
    from pipelines.lake.table_stats import has_completed_commit

    states = []
    for table in lake_catalog(decl):
        path = table.path(root)
        newest = latest_instant(spark, path) if has_completed_commit(path) else None
        name = catalog_name(table.name)
        synced = None
        if newest is not None and spark.catalog.tableExists(name):
            props = {r.key: r.value for r in spark.sql(f"SHOW TBLPROPERTIES {name}").collect()}
            synced = props.get("last_commit_time_sync")
        states.append(SyncState(table.name, name, newest, synced))
    return states
