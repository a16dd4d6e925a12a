"""The table catalog: every table of the lake, where it lives, its key and how it is written, and what
the project does with each source table beyond what the contract fixes. `lakehouse status` and
`changes`, the DAGs' Assets and task lists, the table services and the erasure all read it, so a
lake table is added here and nowhere else. A new source table also needs what is specific to its
columns: its silver rules (`transform/silver.py`) and its quality suite (`services/quality.py`).

One line per source table. The contract (`pipelines.contract`) fixes the columns every layer
must hold; this is where a deployment chooses the rest.

`silver_extra_columns`: bronze columns beyond the contract's (added in the source since,
contract section 6) that `silver/<table>` and its quarantine carry, with bronze's name and type
(widened when bronze widens; null once dropped in the source, as in bronze). Off by default:
silver is the contract's validated shape, which its readers (gold, incremental-ETL consumers)
rely on, and an added column is whatever a product team put there, unvalidated and perhaps
personal data. A column named here that bronze does not hold (yet) is left out, with a warning,
until the source adds it; naming a column here later carries it from the next change of each
row on (rows that do not change keep it null until a rebuild: `lakehouse etl` after deleting the
silver tables).

Every bronze column, added ones included, is always in bronze itself and in `lakehouse changes
bronze/<table>`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import hudi_configs
from pipelines import contract
from pipelines.settings import quarantine_path, silver_path, table_path


@dataclass(frozen=True)
class SourceTable:
    name: str
    silver_extra_columns: tuple[str, ...] = ()


CATALOG: dict[str, SourceTable] = {
    "customers": SourceTable("customers", silver_extra_columns=()),
    "orders": SourceTable("orders", silver_extra_columns=()),
}
assert tuple(CATALOG) == contract.TABLES, "the catalog lists the contract's tables, in its order"


# Columns silver makes itself: an extra bronze column of one of these names cannot be carried.
SILVER_OWN_COLUMNS = frozenset({"order_date", "failed_rule", "_quarantined_at"})


def silver_extra_columns(table: str) -> tuple[str, ...]:
    """The catalog's extra bronze columns for silver/<table>, minus any the contract already has."""
    named = CATALOG[table].silver_extra_columns
    wrong = [c for c in named if c.startswith("_") or c in SILVER_OWN_COLUMNS]
    if wrong:
        raise ValueError(f"pipelines/catalog.py, {table}: silver_extra_columns {wrong} collide with the columns "
                         f"silver and Hudi add themselves (names starting with '_', {sorted(SILVER_OWN_COLUMNS)})")
    return tuple(dict.fromkeys(c for c in named if c not in contract.COLUMNS[table]))


# --------------------------------------------------------------------------- the lake's tables

@dataclass(frozen=True)
class Table:
    """One Hudi table of the lake: where it lives, its key, whose rows it holds, how it is written.

    `name` is its path under the lake root and the name every command, DAG task and report uses.
    `writer` names its writer's options (`hudi_configs/<layer>.toml`): bronze's sections (`table`,
    `changelog`, `ledger`, `dead_letters`), silver's one, gold's table. `holds` says whose data its
    rows are (`customer`: keyed by a customer id, `order`: by an order id, `customer_id`: a column
    naming the customer) for the erasure; `change_feed` that `lakehouse changes` offers it.
    """

    name: str
    key: tuple[str, ...]
    writer: str
    source: str | None = None  # the source table it follows
    holds: str | None = None
    change_feed: bool = False

    @property
    def layer(self) -> str:
        return self.name.split("/", 1)[0]

    def path(self, root: str | None = None) -> str:
        return table_path(self.layer, self.name.split("/", 1)[1], root)


def _lake_tables() -> tuple[Table, ...]:
    holds = {"customers": "customer", "orders": "order"}
    bronze = [t for s in CATALOG for t in (
        Table(f"bronze/{s}", (contract.PRIMARY_KEY,), "table", s, holds[s], change_feed=True),
        Table(f"bronze/_deletes/{s}", (contract.PRIMARY_KEY,), "ledger", s, holds[s]),
        Table(f"bronze/_changelog/{s}", (contract.PRIMARY_KEY,), "changelog", s, holds[s]))]
    bronze.append(Table("bronze/_dead_letters", ("position",), "dead_letters"))
    silver = [t for s in CATALOG for t in (
        Table(f"silver/{s}", (contract.PRIMARY_KEY,), "table", s, holds[s], change_feed=True),
        Table(f"silver/_quarantine/{s}", (contract.PRIMARY_KEY,), "table", s, holds[s]))]
    gold = [Table("gold/_customer_orders", ("customer_id",), "customer_orders", holds="customer_id"),
            Table("gold/customer_ltv", ("customer_id",), "customer_ltv", holds="customer_id", change_feed=True),
            Table("gold/daily_revenue", ("order_date", "country", "currency"), "daily_revenue", change_feed=True)]
    return (*bronze, *silver, *gold)


# Every table the pipeline writes, bronze first, in the order the services and the erasure work.
# A new source table is a line in CATALOG above; a new kind of table is a line here.
LAKE_TABLES: tuple[Table, ...] = _lake_tables()


def lake_table(name: str) -> Table:
    """The catalog's table of that name (e.g. `silver/orders`); KeyError naming the known ones."""
    for table in LAKE_TABLES:
        if table.name == name:
            return table
    raise KeyError(f"no lake table {name!r}; the catalog has {', '.join(t.name for t in LAKE_TABLES)}")


def names(layer: str | None = None, *, holds: str | None = None, writer: str | None = None) -> list[str]:
    """Names of the catalog's tables, in its order: of one layer, holding one kind of subject, of one writer."""
    return [t.name for t in LAKE_TABLES if (layer is None or t.layer == layer)
            and (holds is None or t.holds == holds) and (writer is None or t.writer == writer)]


# Lake tables whose changes `lakehouse changes` serves, with their key columns (pure Python:
# the CLI lists them without Spark).
CHANGE_FEED_TABLES: dict[str, tuple[str, ...]] = {t.name: t.key for t in LAKE_TABLES if t.change_feed}


# --------------------------------------------------------------------------- how each table is written

def hudi_table_name(name: str) -> str:
    """`hoodie.table.name` of a lake table: its name with `_` for `/` (`bronze/_deletes/orders` ->
    `bronze_deletes_orders`)."""
    return name.replace("/_", "_").replace("/", "_")


def bronze_options(part: str, name: str, **extra: str) -> dict[str, str]:
    """Writer options of a bronze table of `[part]` in bronze.toml, named `name` (hoodie.table.name)."""
    opts = hudi_configs.writer("bronze", part)
    opts["hoodie.table.name"] = name
    opts.setdefault("hoodie.datasource.write.recordkey.field", contract.PRIMARY_KEY)
    opts.update(extra)
    return opts


def silver_options(name: str) -> dict[str, str]:
    """Writer options of a silver or quarantine table named `name` (hoodie.table.name)."""
    return {**hudi_configs.writer("silver", "table"), "hoodie.table.name": name}


def gold_options(table: str) -> dict[str, str]:
    """Writer options of gold table `table` (`customer_ltv`, `_customer_orders`, ...)."""
    name = table.lstrip("_")
    return {**hudi_configs.writer("gold", "common"), **hudi_configs.section("gold", name),
            "hoodie.table.name": f"gold_{name}"}


def writer_options(table: Table) -> dict[str, str]:
    """The options the writer of a catalog table uses."""
    if table.layer == "bronze":
        return bronze_options(table.writer, hudi_table_name(table.name))
    if table.layer == "silver":
        return silver_options(hudi_table_name(table.name))
    return gold_options(table.name.split("/", 1)[1])


@dataclass(frozen=True)
class LakeTable:
    """A catalog table at one lake root, with its writer's options: what the services and the erasure act on."""

    name: str  # as `lakehouse status` and the DAG's task ids spell it: bronze/customers, ...
    path: str
    options: dict[str, str] = field(repr=False)
    readers: tuple[str, ...] = ()  # tables that checkpoint their reads of this one: expiry waits for them
    # A change log's delete ledger (name, path, options): expiry moves the deletes of the days it drops there.
    ledger: tuple[str, str, dict[str, str]] | None = field(default=None, repr=False)

    @property
    def merge_on_read(self) -> bool:
        return self.options.get("hoodie.datasource.write.table.type") == "MERGE_ON_READ"

    @property
    def append_only(self) -> bool:
        return self.options.get("hoodie.datasource.write.operation") in ("insert", "bulk_insert")


def lake_tables(root: str) -> list[LakeTable]:
    """Every Hudi table the pipeline writes, at `root`, with the options its writer uses."""
    tables = []
    for t in LAKE_TABLES:
        path, options = t.path(root), writer_options(t)
        if t.writer == "changelog":  # silver reads it; expiry moves its deletes to the source's ledger
            ledger = lake_table(f"bronze/_deletes/{t.source}")
            tables.append(LakeTable(t.name, path, options,
                                    readers=(silver_path(t.source, root), quarantine_path(t.source, root)),
                                    ledger=(ledger.name, ledger.path(root), writer_options(ledger))))
        else:
            tables.append(LakeTable(t.name, path, options))
    return tables
