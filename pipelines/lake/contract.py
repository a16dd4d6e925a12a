"""The contract's `shop` database (shared/contracts/cdc-source.md, sections 1 to 3), as the shop's generator, its
benchmarks and the tests' model know it, and Debezium's `op` codes.

The pipeline itself reads no table from here: it captures the declared tables (pipelines.lake.declaration),
and the shop is one declaration (pipelines/lake/shop_tables.toml) that tests/test_declaration.py holds to
these facts, so the two cannot drift apart.
"""

from __future__ import annotations

from pipelines.errors import UnknownTable

TOPIC_PREFIX = "shop"
SCHEMA = "public"
TABLES: tuple[str, ...] = ("customers", "orders")

# Source columns in table order, as the Debezium envelope's `after` carries them.
COLUMNS: dict[str, tuple[str, ...]] = {
    "customers": ("id", "email", "full_name", "country", "created_at", "updated_at"),
    "orders": ("id", "customer_id", "status", "amount", "currency", "created_at", "updated_at"),
}
# Columns that arrive as JSON numbers (bigint); every other column is a JSON string.
BIGINT_COLUMNS: dict[str, frozenset[str]] = {
    "customers": frozenset({"id"}),
    "orders": frozenset({"id", "customer_id"}),
}
PRIMARY_KEY = "id"

ORDER_STATUSES: tuple[str, ...] = ("placed", "paid", "shipped", "cancelled", "refunded")
CURRENCIES: tuple[str, ...] = ("EUR", "USD", "GBP", "JPY", "CHF", "SEK")
EMAIL_PATTERN = r"^[^@\s]+@[^@\s]+\.[^@\s]+$"
COUNTRY_PATTERN = r"^[A-Z]{2}$"

# Debezium `op` codes. Row changes carry a row image; the others must be tolerated.
ROW_OPS = frozenset({"r", "c", "u", "d"})
OTHER_OPS = frozenset({"t", "m"})


def topic(table: str) -> str:
    """Kafka topic of a source table (`topic.prefix=shop`)."""
    return f"{TOPIC_PREFIX}.{SCHEMA}.{table}"


def table_of_topic(name: str) -> str:
    """Inverse of :func:`topic`; raises UnknownTable for a topic the contract does not name."""
    for table in TABLES:
        if topic(table) == name:
            return table
    raise UnknownTable(f"topic {name!r} is not a source topic of the contract ({', '.join(map(topic, TABLES))})")
