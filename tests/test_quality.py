"""Great Expectations suites on a lake built by the real pipeline: green when right, red naming a planted fault."""

from __future__ import annotations

from datetime import timedelta

from pipelines.bronze import run_ingest
from pipelines.etl import run_etl
from pipelines.generator import ShopSource, WorkloadConfig, ensure_topics, produce
from pipelines.quality import data_docs_index, run_quality
from tests.plant import BAD_STATUS, plant_bad_status


def test_suites_pass_on_the_pipeline_and_name_a_planted_violation(spark, broker, tmp_path) -> None:
    root = str(tmp_path / "lake")
    source = ShopSource(71)
    cfg = WorkloadConfig(seed=71, customers=80, orders=240, changes=500, invalid_fraction=0.1)
    ensure_topics(broker.bootstrap)
    produce(source.snapshot(cfg) + source.changes(cfg), broker.bootstrap)
    run_ingest(once=True, root=root, bootstrap=broker.bootstrap, spark=spark)
    run_etl(spark, root)
    # Ingest runs ahead of the etl: the count check must compare with what silver consumed.
    produce(source.changes(cfg), broker.bootstrap)
    run_ingest(once=True, root=root, bootstrap=broker.bootstrap, spark=spark)

    outcomes = run_quality(spark, root)
    assert [o.line() for o in outcomes if not o.success] == []
    assert {o.suite for o in outcomes} >= {"bronze/customers", "bronze/orders", "silver/customers", "silver/orders",
                                           "gold/customer_ltv", "gold/daily_revenue",
                                           "gold/customer_ltv -> silver/customers"}
    assert data_docs_index(root).is_file()

    plant_bad_status(spark, root)

    outcomes = {o.suite: o for o in run_quality(spark, root, ("silver", "gold"), timedelta(hours=1))}
    failed = {name for name, o in outcomes.items() if not o.success}
    assert failed == {"silver/orders"}, [outcomes[n].line() for n in failed]
    (status_failure,) = [f for f in outcomes["silver/orders"].failures if "status" in f]
    assert "expect_column_values_to_be_in_set" in status_failure and BAD_STATUS in status_failure
    pages = [p.read_text(errors="replace") for p in data_docs_index(root).parent.rglob("*.html")]
    assert any("silver.orders" in page and BAD_STATUS in page for page in pages), "Data Docs do not name it"
