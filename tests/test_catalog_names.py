"""The catalog's names, the options its sync is given on each target, and `lakehouse sql`'s rewriting (no JVM).

The EMR target's Glue sync cannot run here (no AWS, and Maven Central has no hudi-aws 1.0.x): what it
is given is checked as rendered, as the EMR steps are.
"""

from __future__ import annotations

import pytest

from pipelines.deploy.jobs import SparkJob
from pipelines.errors import QueryError, SettingError, UnknownTable
from pipelines.lake.catalog import lake_catalog, table_name, writer_options
from pipelines.metastore.catalog_sync import catalog_kind, catalog_name, catalog_session_conf, in_lake, sync_properties
from pipelines.metastore.query import as_of_instant, referenced_tables, with_as_of
from pipelines.runtime.declared import read_declaration

pytestmark = pytest.mark.unit

URI = "thrift://127.0.0.1:9083"


def test_every_lake_table_has_one_name_in_its_layer_database() -> None:
    decl = read_declaration()
    names = {catalog_name(t.name) for t in lake_catalog(decl)}
    assert len(names) == len(lake_catalog(decl))
    assert {"bronze.customers", "bronze._changelog_orders", "bronze._deletes_orders", "bronze._dead_letters",
            "silver.orders", "silver._quarantine_customers", "gold.customer_ltv"} <= names
    for table in lake_catalog(decl):
        assert table_name(catalog_name(table.name), decl) == table.name
    assert table_name("bronze.orders_rt", decl) == table_name("BRONZE.ORDERS_RO", decl) == "bronze/orders"
    with pytest.raises(UnknownTable, match=r"no lake table is registered as 'silver\.nope'"):
        table_name("silver.nope", decl)


def test_sync_is_off_without_a_metastore_and_refuses_a_wrong_uri(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LAKEHOUSE_METASTORE_URI", raising=False)
    monkeypatch.setenv("LAKEHOUSE_TARGET", "local")
    assert catalog_kind() is None
    monkeypatch.setenv("LAKEHOUSE_METASTORE_URI", "http://127.0.0.1:9083")
    with pytest.raises(SettingError, match="expected a Hive Metastore's thrift://host:port"):
        catalog_kind()
    assert in_lake("/x/lake/silver/orders") and in_lake("s3://b/p/bronze/_changelog/orders")
    assert not in_lake("/x/lake/_gdpr/registry")


def test_local_tables_sync_to_the_metastore_with_their_writer_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAKEHOUSE_METASTORE_URI", URI)
    monkeypatch.setenv("LAKEHOUSE_TARGET", "local")
    table = next(t for t in lake_catalog(read_declaration()) if t.name == "bronze/_changelog/orders")
    props = sync_properties("/lake/bronze/_changelog/orders", writer_options(table))
    assert props["hoodie.meta.sync.client.tool.class"] == "org.apache.hudi.hive.HiveSyncTool"
    assert props["hoodie.datasource.hive_sync.mode"] == "hms"
    assert props["hoodie.datasource.hive_sync.metastore.uris"] == URI
    assert (props["hoodie.datasource.hive_sync.database"], props["hoodie.datasource.hive_sync.table"]) == \
        ("bronze", "_changelog_orders")
    assert props["hoodie.datasource.write.partitionpath.field"] == "_ingest_date"  # the partitions it registers
    assert props["hoodie.datasource.meta_sync.condition.sync"] == "false"
    assert catalog_session_conf() == {"spark.sql.catalogImplementation": "hive",
                                      "spark.hadoop.hive.metastore.uris": URI}


def test_emr_tables_sync_to_glue(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LAKEHOUSE_TARGET", "emr")
    monkeypatch.setenv("LAKEHOUSE_METASTORE_URI", URI)  # a local setting: ignored on EMR
    assert catalog_kind() == "glue"
    table = next(t for t in lake_catalog(read_declaration()) if t.name == "silver/orders")
    props = sync_properties("s3://lake/prod/silver/orders", writer_options(table))
    assert props["hoodie.meta.sync.client.tool.class"] == "org.apache.hudi.aws.sync.AwsGlueCatalogSyncTool"
    assert (props["hoodie.datasource.hive_sync.database"], props["hoodie.datasource.hive_sync.table"]) == \
        ("silver", "orders")
    assert props["hoodie.datasource.meta.sync.base.path"] == "s3://lake/prod/silver/orders"
    assert "hoodie.datasource.hive_sync.metastore.uris" not in props
    # Glue keeps a version per table update: only schema and partition changes are synced there.
    assert props["hoodie.datasource.meta_sync.condition.sync"] == "true"
    assert catalog_session_conf()["spark.hadoop.hive.metastore.client.factory.class"] == \
        "com.amazonaws.glue.catalog.metastore.AWSGlueDataCatalogHiveClientFactory"
    # The local metastore's URI never reaches an EMR step.
    step = SparkJob("etl", ("etl",), {"LAKEHOUSE_METASTORE_URI": URI}).emr_step("s3://code/x")
    assert URI not in " ".join(step["HadoopJarStep"]["Args"])


def test_as_of_takes_instants_times_and_dates() -> None:
    assert as_of_instant("20261128183000123") == "20261128183000123"
    assert as_of_instant("2026-11-28 18:30:00.1") == "20261128183000100"
    assert as_of_instant("2026-11-28T18:30") == "20261128183000000"
    assert as_of_instant("2026-11-28") == "20261128000000000"
    with pytest.raises(QueryError, match="--as-of 'yesterday': expected an instant"):
        as_of_instant("yesterday")


def test_time_travel_goes_on_every_table_read_and_not_on_ctes() -> None:
    sql = ("WITH big AS (SELECT * FROM gold.customer_ltv WHERE ltv > 100) "
           "SELECT o.id FROM silver.orders o JOIN big ON o.customer_id = big.customer_id")
    assert sorted(referenced_tables(sql)) == ["gold.customer_ltv", "silver.orders"]
    rewritten = with_as_of(sql, "20261128183000123")
    assert rewritten.count("TIMESTAMP AS OF '20261128183000123'") == 2
    assert "big TIMESTAMP AS OF" not in rewritten
    with pytest.raises(QueryError, match="cannot parse the statement"):
        referenced_tables("SELECT * FROM")
