"""What `hudi_configs.writer` adds for where the lake is (storage.toml): no Spark, no files."""

from __future__ import annotations

import pytest

import hudi_configs

pytestmark = pytest.mark.unit

WRITERS = [("bronze", "table"), ("bronze", "changelog"), ("silver", "table"), ("gold", "common")]


@pytest.mark.parametrize("root", ["", "/data/lake", "file:///data/lake"])
def test_a_lake_on_a_local_disk_gets_direct_markers(monkeypatch: pytest.MonkeyPatch, root: str) -> None:
    """A timeline server's MARKERS file is rewritten whole at each flush: a kill can cut it on a local disk."""
    monkeypatch.setenv("LAKEHOUSE_ROOT", root)
    assert {hudi_configs.writer(*w)["hoodie.write.markers.type"] for w in WRITERS} == {"DIRECT"}


def test_a_lake_on_an_object_store_keeps_the_timeline_servers_markers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAKEHOUSE_ROOT", "s3://lake/prod")
    assert hudi_configs.writer("bronze", "table")["hoodie.write.markers.type"] == "TIMELINE_SERVER_BASED"
    assert not [w for w in WRITERS if hudi_configs.writer(*w).get("hoodie.write.markers.type") == "DIRECT"]
