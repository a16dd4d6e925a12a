"""Proof of a GDPR erasure: scan every file under a lake root for data of the erased subject.

Erasure rewrites tables through Hudi, but Hudi keeps old data in many places that a
table read does not show: older file slices kept for time travel, log files (data and
delete blocks) until compaction and cleaning, the CDC log files of silver and gold, the
metadata table (record index keys, column statistics with min/max values), the timeline,
dead letters, checkpoints, Data Docs. A read of the tables can therefore not prove that
the subject is gone; only decoding every file can. This module does that:

- `*.parquet` (base files, timeline history): pyarrow, every column, nested values
  included, plus the footer's min/max record key;
- Hudi log files (`.<fileId>_<instant>.log.<n>_<token>`, CDC logs with a `.cdc` suffix,
  the metadata table's logs with HFile data blocks): Hudi's own `HoodieLogFormat` reader
  through py4j, every block: data blocks (Avro, Parquet, HFile, CDC) by their records,
  delete blocks by their record keys; a corrupt block is a finding;
- `*.hfile` (metadata-table base files): Hudi's `HoodieNativeAvroHFileReader`;
- every file, decoded or not: a case-insensitive byte scan for the subject's texts, which
  covers timeline instants (uncompressed Avro), JSON, HTML, checkpoints.

What holds the subject depends on the table, which the path names (`<layer>/<table>`: the
tables of `lake_tables`, and any other directory with a `.hoodie/hoodie.properties`):
texts in any string value (nested, inside JSON text, in bytes); customer ids in
`customer_id` anywhere and in `id` and the record keys (`42`, `id:42,_lsn:7`) of customers
tables, order ids likewise in orders tables and in gold's `orders[].id`; in dead letters,
`"id"`/`"customer_id"` in the raw Kafka key and value, by the row's topic; in the metadata
table, the record index's keys (the data table's record keys), and text only elsewhere.
Numbers match as whole values: 42 is not 420.

A file that looks like Hudi data but cannot be decoded is a finding: the scan never calls
clean what it could not read. Findings name the file, its table and what was found there,
never the personal data itself, because they go into the erasure's audit certificate.

Hudi's readers open log files and HFiles through Hudi's storage API in the driver's JVM;
files are listed and read (for the byte scan and pyarrow) through pyarrow.fs
(`pipelines.lake.storage`), on a local root or an object store alike: Hadoop's local listing
forks a process per file to read its permissions (about 5 ms a file) and hides `.crc`
files, which are scanned too. py4j calls are batched per block or file: records are
collected in the JVM (method handles stand in for lambdas) and rendered as one JSON text
by Avro's `GenericData.toString`, which Python parses.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from pipelines.gdpr.scan.files import FileScan
from pipelines.gdpr.scan.jvm import Jvm
from pipelines.gdpr.scan.model import Finding, ScanReport, Subject
from pipelines.gdpr.scan.tables import find_tables, table_of
from pipelines.runtime.lake import Lake

__all__ = ["Finding", "ScanReport", "Subject", "scan_lake"]

log = logging.getLogger(__name__)


def scan_lake(lake: Lake, subject: Subject, progress: Callable[[int, int], None] | None = None,
              only: Callable[[str], bool] | None = None) -> ScanReport:
    """Decode every file under the lake's root and report each one that still holds data of `subject`.

    The lake's declaration names its tables (their keys and subject columns) and the topics of its dead letters;
    its Spark session's JVM runs Hudi's readers.

    `progress(done, total)` is called after each file. `only(rel)` narrows the scan to the
    files it accepts (paths relative to the root; the tables are still found from every
    file). Raises FileNotFoundError when the root does not exist: a typo must not produce a
    clean certificate.
    """
    started = time.monotonic()
    jvm = Jvm(lake.spark, lake.root)
    every = jvm.list_files()
    tables = find_tables(jvm, every, lake.declaration)
    files = [rel for rel in every if only(rel)] if only else every
    scan = FileScan(jvm, subject, lake.declaration)
    for done, rel in enumerate(files, 1):
        scan.file(rel, table_of(rel, tables))
        if progress:
            progress(done, len(files))
    report = scan.report
    report.files = len(files)
    report.findings.sort(key=lambda f: (f.path, f.what))
    report.seconds = time.monotonic() - started
    log.info("scanned %d files (%s, %d vanished meanwhile), %d records in %.1f s: %d findings", report.files,
             report.decoded, report.vanished, report.records, report.seconds, len(report.findings))
    return report
