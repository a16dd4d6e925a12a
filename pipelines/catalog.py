"""The table catalog: what the project does with each source table beyond what the contract fixes.

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
