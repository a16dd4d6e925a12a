"""The table catalog: every table of the lake, where it lives, its key and how it is written. `lakehouse status`
and `changes`, the DAGs' Assets and task lists, the table services and the erasure all read it.

Its source tables are the declared ones (`pipelines.lake.declaration`, contract section 7): each gives a
bronze table, its change log and delete ledger, a silver table and its quarantine, keyed by the
declared key. Gold's tables are the project's business job over the shop's customers and orders:
they are in the catalog when those two are declared (`gold_declared`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

import hudi_configs
from pipelines.errors import UnknownTable
from pipelines.lake.declaration import Declaration, TableDecl
from pipelines.lake.layout import quarantine_path, silver_path, table_path


class Holds(StrEnum):
    """Whose data a table's rows are, for the erasure (`Table.holds`)."""

    CUSTOMER = "customer"  # keyed by the subject column alone: a row is the customer's own
    ROW = "row"  # rows of their own key naming a customer in the declared `subject` column
    CUSTOMER_ID = "customer_id"  # gold's: a `customer_id` column names the customer


class WriterKind(StrEnum):
    """The section of `hudi_configs/<layer>.toml` whose options write a table (`Table.writer`)."""

    TABLE = "table"  # a bronze main table, silver's tables and quarantines
    CHANGELOG = "changelog"
    LEDGER = "ledger"
    DEAD_LETTERS = "dead_letters"
    CUSTOMER_ORDERS = "customer_orders"  # gold's tables, each its own section
    CUSTOMER_LTV = "customer_ltv"
    DAILY_REVENUE = "daily_revenue"


# What gold reads: the declared tables (and their columns) its aggregates need.
GOLD_INPUTS = {"customers": ("id", "country"),
               "orders": ("id", "customer_id", "status", "amount", "currency", "created_at", "order_date")}


def gold_missing(decl: Declaration) -> list[str]:
    """What gold's inputs lack in a declaration (empty: gold runs): a table, its key `id`, a column.

    A table declared without `columns` carries whatever bronze has, which only a run can tell:
    it is taken at its word here.
    """
    missing = []
    for name, needed in GOLD_INPUTS.items():
        table = decl.tables.get(name)
        if table is None:
            missing.append(f"table {name}")
        elif table.key != ("id",):
            missing.append(f"{name} keyed by id (it is keyed by {', '.join(table.key)})")
        elif table.columns:
            have = {*table.columns, *table.silver_extra, *(d.column for d in table.derive)}
            missing += [f"{name}.{c}" for c in needed if c not in have]
    return missing


def gold_declared(decl: Declaration) -> bool:
    """Whether gold's input tables are declared with what it reads: gold runs, and is in the catalog, only then."""
    return not gold_missing(decl)


def erasure_kind(table: TableDecl) -> Holds | None:
    """What the erasure knows a declared table's rows as (`Table.holds`): `customer` when the table is keyed by its
    subject column alone (a row is the customer's own, as the shop's customers), `row` when its rows have their own
    key and name a customer in the subject column (as the shop's orders, or any composite key); None without a
    `subject`.

    Both are erased the same way (pipelines.gdpr.find): a row goes, every version of it, when its newest
    version names the customer; a `row` whose newest version names another customer stays, and only its
    older versions naming the subject go. The kinds differ in what can move: a `customer` row's key is
    the customer, so it never names anyone else.
    """
    if table.subject is None:
        return None
    return Holds.CUSTOMER if table.key == (table.subject,) else Holds.ROW


def erasure_uncovered(decl: Declaration) -> list[str]:
    """Declared tables with a `subject` whose rows the erasure cannot find: none, whatever the layout.

    Every such table's rows are found by its own key and subject column, and kept apart per table (two
    tables may share key values), so no layout is left out. Kept for the callers that refuse to certify
    an erasure it did not do, should a kind of table ever be.
    """
    return [n for n, t in decl.tables.items() if t.subject and erasure_kind(t) is None]


# --------------------------------------------------------------------------- the lake's tables

@dataclass(frozen=True)
class Table:
    """One Hudi table of the lake: where it lives, its key, whose rows it holds, how it is written.

    `name` is its path under the lake root and the name every command, DAG task and report uses.
    `writer` names its writer's options (`hudi_configs/<layer>.toml`): bronze's sections (`table`,
    `changelog`, `ledger`, `dead_letters`), silver's one, gold's table. `holds` says whose data its
    rows are, for the erasure; `change_feed` that `lakehouse changes` offers it.
    """

    name: str
    key: tuple[str, ...]
    writer: WriterKind
    source: str | None = None  # the source table it follows
    holds: Holds | None = None
    change_feed: bool = False
    # Writer options its declaration sets (`table_options`), as pairs: a bronze main table's bucket count, ...
    options: tuple[tuple[str, str], ...] = ()

    @property
    def layer(self) -> str:
        return self.name.split("/", 1)[0]

    def path(self, root: str) -> str:
        return table_path(self.layer, self.name.split("/", 1)[1], root)


_GOLD = (Table("gold/_customer_orders", ("customer_id",), WriterKind.CUSTOMER_ORDERS, holds=Holds.CUSTOMER_ID),
         Table("gold/customer_ltv", ("customer_id",), WriterKind.CUSTOMER_LTV, holds=Holds.CUSTOMER_ID, change_feed=True),
         Table("gold/daily_revenue", ("order_date", "country", "currency"), WriterKind.DAILY_REVENUE, change_feed=True))


def lake_catalog(decl: Declaration) -> tuple[Table, ...]:
    """Every table the pipeline writes for `decl`, bronze first, in the order the services and the erasure
    work. A new source table is a declaration; a new kind of table is a line here."""
    bronze: list[Table] = []
    silver: list[Table] = []
    for s, t in decl.tables.items():
        holds = erasure_kind(t)
        bronze += [Table(f"bronze/{s}", t.key, WriterKind.TABLE, s, holds, change_feed=True,
                         options=tuple(table_options(t).items())),
                   Table(f"bronze/_deletes/{s}", t.key, WriterKind.LEDGER, s, holds),
                   Table(f"bronze/_changelog/{s}", t.key, WriterKind.CHANGELOG, s, holds)]
        silver += [Table(f"silver/{s}", t.key, WriterKind.TABLE, s, holds, change_feed=True),
                   Table(f"silver/_quarantine/{s}", t.key, WriterKind.TABLE, s, holds)]
    bronze.append(Table("bronze/_dead_letters", ("position",), WriterKind.DEAD_LETTERS))
    return (*bronze, *silver, *(_GOLD if gold_declared(decl) else ()))


def lake_table(name: str, decl: Declaration) -> Table:
    """The catalog's table of that name (e.g. `silver/orders`); UnknownTable naming the known ones."""
    catalog = lake_catalog(decl)
    for table in catalog:
        if table.name == name:
            return table
    raise UnknownTable(f"no lake table {name!r}; the catalog has {', '.join(t.name for t in catalog)}")


def dotted_name(name: str) -> str:
    """A lake table's name with a dot after its layer and `_` for the rest's slashes (`bronze/_changelog/orders` ->
    `bronze._changelog_orders`): the name the catalog registers it under, which every command accepts too."""
    layer, rest = name.split("/", 1)
    return f"{layer}.{rest.replace('/', '_')}"


def table_name(value: str, decl: Declaration) -> str:
    """The lake table a command's argument names, in either spelling: its lake name (`silver/orders`) or its dotted
    name (`silver.orders`; `_rt` and `_ro` too, the views a merge-on-read table is registered as), in any case.

    The one parser of table names on the command line: UnknownTable names the value and every table there is.
    """
    wanted = value.lower()
    tables = [t.name for t in lake_catalog(decl)]
    for name in tables:
        dotted = dotted_name(name).lower()
        if wanted in (name.lower(), dotted, f"{dotted}_rt", f"{dotted}_ro"):
            return name
    raise UnknownTable(f"no lake table is registered as {value!r}; the tables: {', '.join(tables)}")


def names(decl: Declaration, layer: str | None = None, *, holds: Holds | None = None,
          writer: WriterKind | None = None) -> list[str]:
    """Names of the catalog's tables, in its order: of one layer, holding one kind of subject, of one writer."""
    return [t.name for t in lake_catalog(decl) if (layer is None or t.layer == layer)
            and (holds is None or t.holds == holds) and (writer is None or t.writer == writer)]


def change_feed_tables(decl: Declaration) -> dict[str, tuple[str, ...]]:
    """Lake tables whose changes `lakehouse changes` serves, with their key columns (pure Python: the CLI lists
    them without Spark)."""
    return {t.name: t.key for t in lake_catalog(decl) if t.change_feed}


# --------------------------------------------------------------------------- how each table is written

def hudi_table_name(name: str) -> str:
    """`hoodie.table.name` of a lake table: its name with `_` for `/` (`bronze/_deletes/orders` ->
    `bronze_deletes_orders`)."""
    return name.replace("/_", "_").replace("/", "_")


def keyed_options(key: tuple[str, ...], part: str = "table") -> dict[str, str]:
    """The options that name a bronze table's key: its record key and, where the bucket index hashes it, the
    hash's fields. The change log's record is a change, so its key is the row's key and the change's LSN.

    A composite key is a record key of several fields (Hudi stores `c1:v1,c2:v2`), which the
    non-partitioned key generator handles as well as a single one.
    """
    if part == "changelog":
        return {"hoodie.datasource.write.recordkey.field": ",".join((*key, "_lsn"))}
    return {"hoodie.datasource.write.recordkey.field": ",".join(key),
            "hoodie.bucket.index.hash.field": ",".join(key)}


def table_options(t: TableDecl) -> dict[str, str]:
    """The writer options bronze main of `t` takes from its declaration (`buckets`, `compact_every`), over
    bronze.toml's [table]: every writer of the table (the stream, its compactions, the services, the erasure)
    passes them, so that all of them hash a key into the same bucket."""
    opts = {}
    if t.buckets is not None:
        opts["hoodie.bucket.index.num.buckets"] = str(t.buckets)
    if t.compact_every is not None:
        opts["hoodie.compact.inline.max.delta.commits"] = str(t.compact_every)
    return opts


def main_options(t: TableDecl) -> dict[str, str]:
    """The options a batch's write to bronze main of `t` adds to bronze.toml's [table]: its key and its own."""
    return keyed_options(t.key) | table_options(t)


def main_writer_options(decl: Declaration, table: str) -> dict[str, str]:
    """Every option of a writer of bronze main of declared `table`: bronze.toml's [table] with its name, key and
    own options (the stream's batches, its compactions and its bucket check all pass these)."""
    return bronze_options("table", f"bronze_{table}", **main_options(decl.table(table)))


def bronze_options(part: str, name: str, **extra: str) -> dict[str, str]:
    """Writer options of a bronze table of `[part]` in bronze.toml, named `name` (hoodie.table.name); `extra`
    names its key (`keyed_options`) unless the part's section does."""
    opts = hudi_configs.writer("bronze", part)
    opts["hoodie.table.name"] = name
    opts.update(extra)
    return opts


def silver_options(name: str, key: tuple[str, ...] = ("id",)) -> dict[str, str]:
    """Writer options of a silver or quarantine table named `name` (hoodie.table.name), keyed by `key`."""
    return {**hudi_configs.writer("silver", "table"), "hoodie.table.name": name,
            "hoodie.datasource.write.recordkey.field": ",".join(key)}


def gold_options(table: str) -> dict[str, str]:
    """Writer options of gold table `table` (`customer_ltv`, `_customer_orders`, ...)."""
    name = table.lstrip("_")
    return {**hudi_configs.writer("gold", "common"), **hudi_configs.section("gold", name),
            "hoodie.table.name": f"gold_{name}"}


def writer_options(table: Table) -> dict[str, str]:
    """The options the writer of a catalog table uses."""
    if table.layer == "bronze":
        keyed = {} if table.writer == WriterKind.DEAD_LETTERS else keyed_options(table.key, table.writer)
        return bronze_options(table.writer, hudi_table_name(table.name), **keyed, **dict(table.options))
    if table.layer == "silver":
        return silver_options(hudi_table_name(table.name), table.key)
    return gold_options(table.name.split("/", 1)[1])


@dataclass(frozen=True)
class LakeTable:
    """A catalog table at one lake root, with its writer's options: what the services and the erasure act on."""

    name: str  # as `lakehouse status` and the DAG's task ids spell it: bronze/customers, ...
    path: str
    options: dict[str, str] = field(repr=False)
    key: tuple[str, ...] = ()
    readers: tuple[str, ...] = ()  # tables that checkpoint their reads of this one: expiry waits for them
    # A change log's delete ledger (name, path, options): expiry moves the deletes of the days it drops there.
    ledger: tuple[str, str, dict[str, str]] | None = field(default=None, repr=False)

    @property
    def merge_on_read(self) -> bool:
        return self.options.get("hoodie.datasource.write.table.type") == "MERGE_ON_READ"

    @property
    def append_only(self) -> bool:
        return self.options.get("hoodie.datasource.write.operation") in ("insert", "bulk_insert")


def lake_tables(root: str, decl: Declaration) -> list[LakeTable]:
    """Every Hudi table the pipeline writes for `decl`, at `root`, with the options its writer uses."""
    tables = []
    for t in lake_catalog(decl):
        path, options = t.path(root), writer_options(t)
        if t.writer == WriterKind.CHANGELOG:  # silver reads it; expiry moves its deletes to the source's ledger
            source = t.source
            assert source is not None, f"{t.name} follows a source table"
            ledger = lake_table(f"bronze/_deletes/{source}", decl)
            tables.append(LakeTable(t.name, path, options, t.key,
                                    readers=(silver_path(source, root), quarantine_path(source, root)),
                                    ledger=(ledger.name, ledger.path(root), writer_options(ledger))))
        else:
            tables.append(LakeTable(t.name, path, options, t.key))
    return tables
