"""Great Expectations suites on a lake built by the real pipeline: green when right, red naming a planted fault."""

from __future__ import annotations

from datetime import timedelta

import pytest

from pipelines.ingest.bronze import run_ingest
from pipelines.lake import storage
from pipelines.runtime.lake import Lake
from pipelines.services.quality import ERASED, data_docs_index, quality_root, redact_subject, run_quality
from pipelines.services.quality_due import quality_due
from tests.lake import LakeCopy
from tests.plant import BAD_STATUS, plant_bad_emails, plant_bad_status

pytestmark = pytest.mark.integration


def test_suites_pass_on_the_pipeline_and_name_a_planted_violation(spark, lake: LakeCopy,
                                                                  capfd: pytest.CaptureFixture) -> None:
    root = lake.root
    decl = Lake.at(root).declaration
    # Ingest runs ahead of the etl: the count check must compare with what silver consumed.
    lake.produce(lake.source.changes(lake.cfg))
    run_ingest(Lake.at(root, spark), once=True, bootstrap=lake.bootstrap)

    capfd.readouterr()
    outcomes = run_quality(Lake.at(root, spark))
    assert [o.line() for o in outcomes if not o.success] == []
    # Not a terminal: no progress bar (GE draws one per validation unless told not to).
    assert "Calculating Metrics" not in capfd.readouterr().err
    assert {o.suite for o in outcomes} >= {"bronze/customers", "bronze/orders", "silver/customers", "silver/orders",
                                           "gold/customer_ltv", "gold/daily_revenue",
                                           "gold/customer_ltv -> silver/customers"}
    assert storage.exists(data_docs_index(root))
    # Each passed suite recorded what it checked: the data_quality DAG has nothing to check again.
    assert [d.spec.name for d in quality_due(root, decl) if d.due] == []

    plant_bad_status(spark, root)
    # A write to silver/orders: its suite and the gold relation that reads it are due, nothing else.
    assert [d.spec.name for d in quality_due(root, decl) if d.due] == ["silver/orders",
                                                                         "gold/daily_revenue -> silver/orders"]

    outcomes = {o.suite: o for o in run_quality(Lake.at(root, spark), ("silver", "gold"), timedelta(hours=1))}
    failed = {name for name, o in outcomes.items() if not o.success}
    assert failed == {"silver/orders"}, [outcomes[n].line() for n in failed]
    assert [d.spec.name for d in quality_due(root, decl) if d.due] == ["silver/orders"]  # a failed suite stays due
    (status_failure,) = [f for f in outcomes["silver/orders"].failures if "status" in f]
    assert "expect_column_values_to_be_in_set" in status_failure and BAD_STATUS in status_failure
    docs = data_docs_index(root).rsplit("/", 1)[0]
    pages = [storage.read_bytes(f"{docs}/{p}").decode(errors="replace") for p in storage.list_files(docs)
             if p.endswith(".html")]
    assert any("silver.orders" in page and BAD_STATUS in page for page in pages), "Data Docs do not name it"


def _files_holding(root: str, text: str) -> list[str]:
    base = quality_root(root)
    return [p for p in storage.list_files(base) if text.lower().encode() in storage.read_bytes(f"{base}/{p}").lower()]


def test_an_erasure_redacts_the_values_failed_expectations_keep(spark, lake: LakeCopy) -> None:
    """Validation results and Data Docs keep the values that broke a rule: after an erasure, only the others'."""
    root = lake.root
    (victim, victim_email), (_, other_email) = plant_bad_emails(spark, root, 2)
    outcomes = {o.suite: o for o in run_quality(Lake.at(root, spark), ("silver",), timedelta(hours=1))}
    assert victim_email in outcomes["silver/customers"].line() and other_email in outcomes["silver/customers"].line()
    assert _files_holding(root, victim_email), "the planted failure is not in the results: nothing to redact"

    done = redact_subject(root, {victim_email}, {victim}, set())

    assert done == {"validation_results_redacted": 1, "data_docs_rebuilt": 1}
    assert _files_holding(root, victim_email) == []
    assert _files_holding(root, ERASED), "the redacted value leaves no marker"
    assert any(p.endswith(".html") for p in _files_holding(root, other_email)), "the docs lost the other failure"
    assert storage.exists(data_docs_index(root))
    assert redact_subject(root, {victim_email}, {victim}, set())["validation_results_redacted"] == 0
