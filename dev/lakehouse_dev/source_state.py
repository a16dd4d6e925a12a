"""The real source's own state, read with SQL: the oracle that the lake is checked against.

The lake must equal the database once the pipeline has caught up (contract section 3). Reading
PostgreSQL itself, not the topics nor the generator's simulation, makes the check independent of
everything between them: Debezium, Kafka and the stream. Values are rendered by PostgreSQL the way
Debezium's envelope carries them, so that a row compares equal to bronze's copy of the envelope.
Used by the real-source tests and by `lakehouse dev bench soak`.
"""

from __future__ import annotations

from typing import Any

from lakehouse_dev.pg_source import PostgresCluster
from pipelines.lake.contract import COLUMNS, TABLES

# Debezium's rendering of timestamptz (ZonedTimestamp: UTC, always six decimals) and numeric
# (decimal.handling.mode=string: the column's scale), computed by PostgreSQL from its own values.
RENDER = {
    "created_at": """to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')""",
    "updated_at": """to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')""",
    "amount": "amount::text",
}

Rows = dict[str, dict[int, dict[str, Any]]]


def database_state(postgres: PostgresCluster, extra: dict[str, tuple[str, ...]] | None = None) -> Rows:
    """The contract's columns (and `extra` ones) of every row in `shop`, as the envelope carries them: the oracle."""
    state = {}
    with postgres.connect() as conn:
        for table in TABLES:
            columns = (*COLUMNS[table], *(extra or {}).get(table, ()))
            select = ", ".join(RENDER.get(c, c) for c in columns)
            rows = conn.execute(f"SELECT {select} FROM {table}").fetchall()
            state[table] = {row[0]: dict(zip(columns, row, strict=True)) for row in rows}
    return state
