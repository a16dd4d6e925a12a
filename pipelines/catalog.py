"""The table catalog: every table of the lake, and what the project does with each source table beyond
what the contract fixes. The one place a table is added: the CLI, the DAGs, table services and the
erasure read it.

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

from dataclasses import dataclass

from pipelines import contract


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
        from pipelines.settings import table_path  # settings reads this module at import

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
