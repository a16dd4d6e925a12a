"""The SQL sink's reading of the generator's records (no database: the statements are applied to
dicts): only database changes become statements, and applied in order they rebuild the
simulated database exactly, across a resumed run whose replays reach into the previous one."""

from __future__ import annotations

from typing import Any

import pytest

from lakehouse_dev.generator import ShopSource, WorkloadConfig
from lakehouse_dev.sql_sink import Statement, statements
from pipelines.lake.contract import COLUMNS, TABLES

pytestmark = pytest.mark.unit

CFG = WorkloadConfig(seed=23, customers=30, orders=60, changes=400, replay_runs=3, malformed_fraction=0.05,
                     delete_fraction=0.1)


def _apply(rows: dict[str, dict[int, dict[str, Any]]], statement: Statement) -> None:
    table, key, columns = statement.table, statement.key, COLUMNS[statement.table]
    if statement.op == "t":
        rows[table].clear()
    elif statement.op == "c":
        assert key not in rows[table], f"insert of live {table} {key}: a replay was played"
        rows[table][key] = dict(zip(columns, statement.params, strict=True))
    elif statement.op == "u":
        assert key in rows[table], f"update of missing {table} {key}"
        rows[table][key] = dict(zip(columns, (statement.params[-1], *statement.params[:-1]), strict=True))
    else:
        assert rows[table].pop(key, None) is not None, f"delete of missing {table} {key}"


def _fitted(state: dict[str, dict[int, dict[str, Any]]]) -> dict[str, dict[int, dict[str, Any]]]:
    """The simulation as char(2) stores it: a padded spelling longer than the column loses its blanks."""
    return {t: {k: r | ({"country": r["country"].strip()} if len(r.get("country", "")) > 2 else {})
                for k, r in rows.items()} for t, rows in state.items()}


def test_statements_rebuild_the_simulated_database() -> None:
    sim = ShopSource(CFG.seed)
    rows: dict[str, dict[int, dict[str, Any]]] = {t: {} for t in TABLES}
    played: list[Statement] = []
    for run in (lambda: sim.snapshot(CFG) + sim.changes(CFG), lambda: sim.changes(CFG) + sim.truncate("orders", CFG),
                lambda: sim.changes(CFG)):
        before = sim.stats.copy()
        batch = list(statements(run()))
        made = sim.stats - before
        assert made["replayed"] and (made["malformed"] or made["tombstone"])  # noise that must not be played
        counts = {op: sum(s.op == op for s in batch) for op in "cudt"}
        assert counts == {"c": made["r"] + made["c"], "u": made["u"], "d": made["d"], "t": made["t"]}
        for statement in batch:
            _apply(rows, statement)
        played += batch
        assert rows == _fitted(sim.state)
    assert {s.table for s in played if s.op == "t"} == {"orders"}
    assert all(s.key is not None and s.params[0 if s.op != "u" else -1] == s.key for s in played if s.op != "t")
