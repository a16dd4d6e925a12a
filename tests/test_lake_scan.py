"""The erasure proof (pipelines/gdpr/scan/) on real Hudi tables written by Spark, no mocks.

The lake holds the subject (customer 42, order 4200, e-mail and name) in every kind of
file Hudi writes: base files, log data blocks, log delete blocks, CDC logs, the metadata
table's record index and column stats, a change log with composite keys, dead letters with
raw Kafka bytes, gold's nested orders, and plain JSON/HTML files. The scan must find each,
must not find a subject that was never written (ids 2 and 4 beside 42, 420 and 4200), and
must never call clean a data file it could not decode.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from datetime import date, datetime
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

from pipelines.errors import StorageError
from pipelines.gdpr.scan import Finding, ScanReport, Subject, scan_lake
from pipelines.gdpr.scan.model import Chunk
from pipelines.lake.catalog import bronze_options, gold_options, keyed_options, silver_options
from pipelines.lake.declaration import load
from pipelines.runtime.declared import read_declaration
from pipelines.runtime.lake import Lake
from pipelines.transform import gold

SUBJECT = Subject(customer_ids=frozenset({42}), order_ids=frozenset({4200}),
                  texts=frozenset({"Erased.Person@Example.com", "erased person"}))
# Substrings and neighbours of what the lake holds: whole values only may match.
NEVER_WRITTEN = Subject(customer_ids=frozenset({2, 20}), order_ids=frozenset({4, 42}),
                        texts=frozenset({"nobody@example.com", "Person Erased"}))
CUSTOMERS = "id long, email string, full_name string, country string, _op string, _lsn long, _hoodie_is_deleted boolean"


def _customers(spark: SparkSession, rows: list[tuple]) -> DataFrame:
    return spark.createDataFrame(rows, CUSTOMERS)


# The pipeline turns column stats off; a lake written before that (or by someone else) has
# them, and the scanner must see into them.
# Bronze runs without a metadata table; a lake written before that has one, and a metadata table's
# column stats are the one place min/max values of a column are kept, so the scan must read them.
BRONZE_WITH_COLUMN_STATS = {**bronze_options("table", "bronze_customers", **keyed_options(("id",))),
                            "hoodie.metadata.enable": "true",
                            "hoodie.metadata.index.column.stats.enable": "true"}


def _write(df: DataFrame, path: Path, options: dict[str, str]) -> None:
    df.write.format("hudi").options(**options).mode("append").save(str(path))


@pytest.fixture(scope="module")
def lake(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A lake root with the subject in every kind of file (about 40 s of Hudi writes)."""
    root = tmp_path_factory.mktemp("lake_scan") / "lake"
    people = [(4, "four@example.com", "Four Person", "DE", "r", 10, False),
              (7, "seven@example.com", "Seven Person", "DE", "r", 11, False),
              (42, "erased.person@example.com", "Erased Person", "FR", "r", 12, False),
              (420, "other@example.com", "Other Person", "DE", "r", 13, False)]
    moved = [(42, "erased.person@example.com", "Erased Person", "ES", "u", 20, False)]
    deleted = [(42, None, None, None, "d", 30, True)]
    # bronze/customers, merge-on-read with the bucket index: an update and a delete append
    # a log data block and a log delete block.
    for rows in (people, moved, deleted):
        _write(_customers(spark, rows), root / "bronze/customers", BRONZE_WITH_COLUMN_STATS)
    # silver/customers, copy-on-write with CDC and the record-level index.
    for rows in (people, moved, deleted):
        _write(_customers(spark, rows), root / "silver/customers", silver_options("silver_customers"))
    # The change log's keys are composite: id:42,_lsn:12. Customer 420's `_lsn` is 2.
    changes = spark.createDataFrame(
        [(42, "erased.person@example.com", "c", 12, "2024-05-01"), (420, "other@example.com", "c", 2, "2024-05-01")],
        "id long, email string, _op string, _lsn long, _ingest_date string")
    _write(changes, root / "bronze/_changelog/customers", bronze_options("changelog", "bronze_changelog_customers"))
    # Dead letters: raw Kafka bytes, not always JSON; the subject only as ids, no text.
    letters = spark.createDataFrame([
        ("shop.public.customers/0/1", "shop.public.customers", 0, 1, b'{"id":42}', b"\xff not JSON at all"),
        ("shop.public.orders/0/2", "shop.public.orders", 0, 2, b'{ "id" : 4200 }',
         b'{"op": "c", "after": {"id": 4200, "customer_id" :\n 42, "status": "pla'),
        ("shop.public.orders/0/3", "shop.public.orders", 0, 3, b'{"id": 420}',
         b'{"op": "c", "after": {"id": 420, "customer_id": 4}}'),
    ], "position string, kafka_topic string, kafka_partition int, kafka_offset long, key binary, value binary")
    _write(letters.selectExpr("*", "'rejected' AS reason"), root / "bronze/_dead_letters",
           bronze_options("dead_letters", "bronze_dead_letters"))
    # Gold's state: the subject's orders as structs in an array.
    created = datetime(2024, 5, 1, 12, 0)
    state = spark.createDataFrame([
        (42, "FR", [(4200, date(2024, 5, 1), "EUR", 1999, created), (4201, date(2024, 5, 1), "EUR", 500, created)]),
        (420, "DE", [(420, date(2024, 5, 2), "EUR", 100, created)]),
    ], f"customer_id long, country string, orders array<{gold.ORDER_FACT}>")
    _write(state, root / "gold/_customer_orders", gold_options(gold.STATE))
    # Plain files: Data Docs and a streaming checkpoint.
    docs = root / "_quality/data_docs/local_site/index.html"
    docs.parent.mkdir(parents=True)
    docs.write_text("<html><body><table><tr><td>ERASED PERSON</td></tr></table></body></html>")
    offsets = root / "_checkpoints/ingest/offsets/0"
    offsets.parent.mkdir(parents=True)
    offsets.write_text('v1\n{"batchWatermarkMs":0}\n{"note":"erased.person@example.com"}\n')
    return root


def _has(report: ScanReport, table: str, what: str, path: str = "") -> bool:
    return any(f.table == table and f.what == what and re.search(path, f.path) for f in report.findings)


def _assert_no_personal_data(findings: list[Finding], subject: Subject) -> None:
    ids = subject.customer_ids | subject.order_ids
    for f in findings:
        text = f"{f.path} {f.table} {f.what}"
        assert not any(t.casefold() in text.casefold() for t in subject.texts), f
        assert not any(int(n) in ids for n in re.findall(r"(?<![\w-])\d+(?![\w-])", f.what)), f


@pytest.mark.integration
def test_scan_finds_the_subject_in_every_kind_of_file(spark: SparkSession, lake: Path) -> None:
    calls: list[tuple[int, int]] = []
    report = scan_lake(Lake.at(str(lake), spark), SUBJECT, progress=lambda done, total: calls.append((done, total)))

    on_disk = sum(len(files) for _, _, files in os.walk(lake))
    assert report.files == on_disk  # .crc files and dot-files included
    assert calls[-1] == (on_disk, on_disk)
    assert all(report.decoded[d] > 0 for d in ("parquet", "hudi-log", "hfile", "raw")), report.decoded
    assert sum(report.decoded.values()) == report.files
    assert report.records > 0
    assert not report.clean
    assert not [f for f in report.findings if f.what.startswith("could not decode")]
    _assert_no_personal_data(report.findings, SUBJECT)

    log_file, cdc_file = r"/\.[^/]+\.log\.\d+_[^/]+$", r"/\.[^/]+\.log\.\d+_[^/]+\.cdc$"
    bronze, silver = "bronze/customers", "silver/customers"
    # Base files, log data blocks, log delete blocks of the merge-on-read table.
    assert _has(report, bronze, "customer id in column id", r"\.parquet$")
    assert _has(report, bronze, "customer id in column _hoodie_record_key", r"\.parquet$")
    assert _has(report, bronze, "e-mail/name text in column email", log_file)
    assert _has(report, bronze, "customer id in column id", log_file)
    assert _has(report, bronze, "customer id in a delete block's record keys", log_file)
    # The metadata table: column stats keep min/max values, the record index keeps keys.
    assert _has(report, f"{bronze} (metadata table)", "e-mail/name text in column ColumnStatsMetadata.minValue.value",
                "/column_stats/")
    assert _has(report, f"{silver} (metadata table)", "customer id in column key (a record_index entry's key)",
                "/record_index/")
    assert _has(report, f"{silver} (metadata table)", "customer id in a delete block's record keys",
                "/record_index/")
    # Copy-on-write: older file slices, and the CDC logs' before/after images.
    assert _has(report, silver, "e-mail/name text in column full_name", r"\.parquet$")
    assert _has(report, silver, "customer id in column before.id", cdc_file)
    assert _has(report, silver, "e-mail/name text in column after.email", cdc_file)
    # Composite keys (id:42,_lsn:12) of the change log.
    assert _has(report, "bronze/_changelog/customers", "customer id in column _hoodie_record_key")
    # Dead letters: ids in raw Kafka keys and values, by topic, JSON or not.
    assert _has(report, "bronze/_dead_letters", "customer id in column key")
    assert _has(report, "bronze/_dead_letters", "customer id in column value")
    assert _has(report, "bronze/_dead_letters", "order id in column key")
    assert _has(report, "bronze/_dead_letters", "order id in column value")
    # Gold: the customer key and the order structs.
    assert _has(report, "gold/_customer_orders", "customer id in column customer_id", r"\.parquet$")
    assert _has(report, "gold/_customer_orders", "order id in column orders[].id", r"\.parquet$")
    # Plain files outside tables: a byte scan only.
    assert _has(report, "", "e-mail/name text in the raw bytes", r"^_quality/.*\.html$")
    assert _has(report, "", "e-mail/name text in the raw bytes", r"^_checkpoints/ingest/offsets/0$")


@pytest.mark.integration
def test_scan_for_a_subject_never_written_is_clean(spark: SparkSession, lake: Path) -> None:
    report = scan_lake(Lake.at(str(lake), spark), NEVER_WRITTEN)
    assert report.clean, report.findings
    assert report.records > 0


@pytest.mark.integration
def test_data_files_that_do_not_decode_are_findings(spark: SparkSession, lake: Path, tmp_path: Path) -> None:
    root = tmp_path / "lake"
    stray = root / "gold/daily_revenue/order_date=2024-05-01"
    stray.mkdir(parents=True)
    (stray / "broken.parquet").write_bytes(b"PAR1 this is not a parquet file PAR1")
    metadata = root / "gold/daily_revenue/.hoodie/metadata/files"
    metadata.mkdir(parents=True)
    (metadata / "files-0000-0_0-1-1_00000000000000000.hfile").write_bytes(b"not an hfile" * 10)
    # Half of a real log file: its block is cut off.
    real_log = max((p for p in (lake / "bronze/customers").glob(".*.log.*") if not p.name.endswith(".crc")),
                   key=lambda p: p.stat().st_size)
    data = real_log.read_bytes()
    (stray / f".{real_log.name[1:]}").write_bytes(data[: len(data) // 2])
    (root / "notes.json").write_text('{"who": "Erased.Person@example.com"}')
    report = scan_lake(Lake.at(str(root), spark), SUBJECT)

    undecodable = {f.path for f in report.findings if f.what.startswith("could not decode")}
    assert undecodable == {
        "gold/daily_revenue/order_date=2024-05-01/broken.parquet",
        "gold/daily_revenue/.hoodie/metadata/files/files-0000-0_0-1-1_00000000000000000.hfile",
        f"gold/daily_revenue/order_date=2024-05-01/.{real_log.name[1:]}",
    }, report.findings
    assert {f.table for f in report.findings if f.path.startswith("gold/daily_revenue/.hoodie/metadata/")} == {
        "gold/daily_revenue (metadata table)"}
    assert Finding("notes.json", "", "e-mail/name text in the raw bytes") in report.findings
    # The cut log is read, up to a corrupt block: decoded, and a finding.
    assert report.decoded == {"parquet": 0, "hudi-log": 1, "hfile": 0, "raw": 3}
    _assert_no_personal_data(report.findings, SUBJECT)


@pytest.mark.integration
def test_a_missing_root_is_an_error_not_a_clean_lake(spark: SparkSession, tmp_path: Path) -> None:
    with pytest.raises(StorageError, match="does not exist"):
        scan_lake(Lake.at(str(tmp_path / "no-such-lake"), spark), SUBJECT)



@pytest.mark.integration
def test_a_file_deleted_during_the_scan_holds_nothing(spark: SparkSession, tmp_path: Path) -> None:
    """A writer deletes its heartbeat, a clean its slices, while the scan runs: gone is not undecodable."""
    root = tmp_path / "lake"
    (root / "a").mkdir(parents=True)
    for name in ("1.parquet", "2.parquet", "3.json"):
        (root / "a" / name).write_bytes(b"PAR1 not parquet PAR1" if name.endswith(".parquet") else b"{}")

    def delete_the_next(done: int, total: int) -> None:
        if done == 1:
            (root / "a" / "2.parquet").unlink()

    report = scan_lake(Lake.at(str(root), spark), SUBJECT, progress=delete_the_next)
    assert report.vanished == 1
    # Still there and not Parquet: a finding, as before.
    assert [f.path for f in report.findings] == ["a/1.parquet"], report.findings


@pytest.mark.unit
def test_chunks_that_cannot_hold_the_subject_are_skipped_and_no_other() -> None:
    """The scan's shortcut (FileScan._values) on JSON texts as Avro renders them; no Spark.

    A skipped chunk must be one no rule could hit on: anything that may hide a text (an
    escape, Avro bytes) or holds a subject id where a rule reads ids is parsed.
    """
    from pipelines.gdpr.scan.files import FileScan
    from pipelines.gdpr.scan.model import Chunk
    from pipelines.gdpr.scan.tables import Table

    scan = FileScan(None, SUBJECT, read_declaration())  # type: ignore[arg-type]  # no JVM for JSON texts

    def parsed(text: str, table: Table, keys: bool = False) -> bool:
        scan._table = table
        return scan._values(Chunk(1, text), keys) != []

    data = Table("silver/customers", ("id",))
    index = Table("silver/customers", ("id",), mdt_partition="record_index")
    files = Table("silver/customers", ("id",), mdt_partition="files")
    assert not parsed('[{"id": 7, "email": "seven@example.com", "_lsn": 42, "amount": "42.00"}]', data)
    assert parsed('[{"before": {"id": 7, "customer_id": 42}, "after": null}]', data)  # a change-feed image
    assert parsed('[{"id": 7, "orders": [{"id": 4200, "amount": 1}]}]', data)  # gold's order structs
    assert parsed('[{"id": [7, 42]}]', data)  # an array where ids are read: parsed
    assert parsed('[{"kafka_topic": "t", "note": 42}]', Table("bronze/_dead_letters", ("position",)))
    assert parsed('[{"id": 7, "email": "ERASED.person@example.com"}]', data)  # a text, any case
    assert parsed('[{"id": 7, "note": "erased\\u0020person"}]', data)  # escaped: parsed, whatever it holds
    assert parsed('[{"id": 7, "raw": {"bytes": "\u00c3\u00a9"}}]', data)  # Avro bytes: decoded before matching
    assert parsed('[{"id": "0042", "_lsn": 1}]', data)  # as _as_int reads it
    assert parsed('[{"_hoodie_record_key": "id:42,_lsn:7"}]', data)
    # The record index: ids are only in the keys, not in positions or instant times.
    assert not parsed('[{"key": "7", "recordIndexMetadata": {"position": 42, "fileIndex": 4200}}]', index)
    assert parsed('[{"key": "42", "recordIndexMetadata": {"position": 7}}]', index)
    assert parsed('["420", "42"]', index, keys=True)  # a delete block's record keys
    assert not parsed('["420", "7"]', index, keys=True)
    assert not parsed('[{"key": "42"}]', files)  # the files partition holds no ids
    assert scan.report.findings == [] and not scan._hits  # a check, not a finding


@pytest.mark.unit
def test_rows_of_a_declared_table_are_found_by_their_own_key(tmp_path: Path) -> None:
    """A declared table's rows (composite key, string and bigint) as the erasure names them (Subject.rows): in key
    columns, record keys, change-feed images, a dead letter's Kafka key; its subject column names customers. Another
    table's rows with the same key values, and this table's rows that share one key column, are not theirs. No Spark.
    """
    import pyarrow as pa

    from pipelines.gdpr.scan.files import FileScan
    from pipelines.gdpr.scan.tables import Table

    declaration = tmp_path / "tables.toml"
    declaration.write_text('[source]\ntopic_prefix = "shop"\n[tables.payments]\nsource = "public.payments"\n'
                           'key = ["region", "payment_no"]\nsubject = "customer_id"\npii = ["card_holder"]\n'
                           '[tables.refunds]\nsource = "public.refunds"\nkey = ["region", "payment_no"]\n')
    subject = Subject(frozenset({42}), frozenset(), frozenset(), {"payments": frozenset({("eu", "7")})})
    scan = FileScan(None, subject, load(declaration))  # type: ignore[arg-type]  # no JVM for decoded values
    main = Table("bronze/payments", ("region", "payment_no"), source="payments", subject="customer_id",
                 row_key=("region", "payment_no"))
    log = Table("bronze/_changelog/payments", ("region", "payment_no", "_lsn"), source="payments",
                subject="customer_id", row_key=("region", "payment_no"))
    refunds = Table("bronze/refunds", ("region", "payment_no"), source="refunds", row_key=("region", "payment_no"))

    def hits(table: Table, work: Callable[[FileScan], None]) -> set[str]:
        scan._start(table)
        work(scan)
        return set(scan._hits)

    batch = pa.record_batch({"region": ["eu", "us", "eu"], "payment_no": pa.array([7, 7, 8], pa.int64()),
                             "customer_id": pa.array([5, 6, 5], pa.int64())})
    assert hits(main, lambda s: s._arrow_rows(batch)) == {"erased row's key in columns region,payment_no"}
    assert hits(refunds, lambda s: s._arrow_rows(batch)) == set()  # the same key values, another table
    other = pa.record_batch({"region": ["us", "eu"], "payment_no": pa.array([7, 8], pa.int64())})
    assert hits(main, lambda s: s._arrow_rows(other)) == set()
    keys = pa.array(["region:us,payment_no:7", "region:eu,payment_no:7"])
    assert hits(main, lambda s: s._arrow_column("_hoodie_record_key", keys)) == {
        "erased row's key in column _hoodie_record_key"}
    assert hits(log, lambda s: s._record_key("region:eu,payment_no:7,_lsn:3", "a delete block's record keys")) == {
        "erased row's key in a delete block's record keys"}
    assert hits(log, lambda s: s._record_key("region:eu,payment_no:70,_lsn:3", "x")) == set()
    image = {"op": "u", "before": {"region": "eu", "payment_no": 7, "customer_id": 5}, "after": None}
    assert hits(main, lambda s: s._record(image, cdc=True)) == {"erased row's key in columns before.region,payment_no"}
    named = {"region": "us", "payment_no": 9, "customer_id": 42}
    assert hits(main, lambda s: s._record(named)) == {"customer id in column customer_id"}
    assert hits(refunds, lambda s: s._record({**named, "region": "eu", "payment_no": 7})) == set()  # no subject there
    # The chunk shortcut parses a chunk that may hold the row, and only such.
    scan._start(main)
    assert scan._values(Chunk(1, '[{"region": "eu", "payment_no": 7, "_lsn": 1}]')) != []
    assert scan._values(Chunk(1, '[{"region": "us", "payment_no": 8, "_lsn": 1}]')) == []
    letters = Table("bronze/_dead_letters", ("position",))
    letter = {"kafka_topic": "shop.public.payments", "key": b'{"region":"eu","payment_no":7}', "value": b"{cut"}
    assert hits(letters, lambda s: s._record(letter)) == {"erased row's key in column key"}
    assert hits(letters, lambda s: s._record({**letter, "key": b'{"region":"us","payment_no":7}'})) == set()
    assert hits(letters, lambda s: s._record({**letter, "value": b'{"after": {"customer_id": 42'})) >= {
        "customer id in column value"}
