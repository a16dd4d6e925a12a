"""`lakehouse changes` from the command line: a consumer's checkpoint kept in a file.

What a consumer of `read_changes` sees across etl cycles (replicas equal to the tables,
deletes, each key once per read) is checked in tests/test_etl.py.
"""

from __future__ import annotations

import json

import pytest

from tests.lake import LakeCopy, run_cli

pytestmark = pytest.mark.integration


def test_cli_changes_with_a_checkpoint_file(spark, lake: LakeCopy, tmp_path) -> None:
    ckpt = tmp_path / "ckpt"
    args = ("changes", "bronze/customers", "--checkpoint-file", str(ckpt))
    first = run_cli(*args, env={"LAKEHOUSE_ROOT": lake.root})
    assert first.exit_code == 0, first.stderr[-2000:]
    lines = [json.loads(line) for line in first.stdout.splitlines()]
    upserts = {r["id"] for r in lines if r["_change"] == "upsert"}
    deletes = {r["id"] for r in lines if r["_change"] == "delete"}
    # From the start: every live customer once, and keys deleted so far as deletions.
    assert upserts == set(lake.source.state["customers"])
    assert len(upserts) == sum(r["_change"] == "upsert" for r in lines)
    assert deletes and not deletes & upserts
    assert "snapshot:" in first.stderr and ckpt.read_text().strip() in first.stderr
    # The same table by its catalog name (a merge-on-read table's snapshot view too), from the checkpoint.
    second = run_cli("changes", "bronze.customers_rt", *args[2:], env={"LAKEHOUSE_ROOT": lake.root})
    assert second.exit_code == 0 and second.stdout == "", second.stderr[-2000:]
    assert "snapshot:" not in second.stderr
    unknown = run_cli("changes", "silver.custmers", env={"LAKEHOUSE_ROOT": lake.root})
    assert unknown.exit_code == 2 and "no lake table is registered as 'silver.custmers'" in unknown.stderr
