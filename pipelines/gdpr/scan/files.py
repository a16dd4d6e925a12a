"""Decoding one file (Parquet, Hudi log, HFile, raw bytes) and handing what it holds to the rules.
"""

from __future__ import annotations

import time

import pyarrow as pa
import pyarrow.parquet as pq
from py4j.protocol import Py4JJavaError

from pipelines.gdpr.scan.columns import ColumnMatcher
from pipelines.gdpr.scan.jvm import Jvm
from pipelines.gdpr.scan.model import PARQUET_BATCH, TEXT, Finding, ScanReport, Subject
from pipelines.gdpr.scan.tables import Table, decoder_of
from pipelines.lake.declaration import Declaration


class FileScan(ColumnMatcher):
    """Every file of a scan, decoded by its kind and matched (`ColumnMatcher`); the findings in `report`."""

    def __init__(self, jvm: Jvm, subject: Subject, decl: Declaration) -> None:
        super().__init__(subject, decl)
        self.jvm = jvm
        self.report = ScanReport()

    # -- per file

    def file(self, rel: str, table: Table) -> None:
        started = time.monotonic()
        self._start(table)
        name = rel.rsplit("/", 1)[-1]
        decoder = decoder_of(name)
        try:
            data = self.jvm.read(rel)
        except (OSError, Py4JJavaError) as e:
            if not self.jvm.exists(rel):
                self.report.vanished += 1
                return
            self._hit(f"could not decode: could not read the file ({_error(e)})")
            data = b""
        if self._raw_has_text(data):
            self._hit(f"{TEXT} in the raw bytes")
        used = "raw"
        if data and decoder != "raw":
            try:
                if decoder == "parquet":
                    self._parquet(data)
                elif decoder == "hfile":
                    self._hfile(rel)
                elif decoder == "hudi-log":
                    self._log(rel, data)
                else:
                    raise ValueError(f"no decoder for {decoder} files")
                used = decoder
            except Exception as e:  # Py4JJavaError, ArrowInvalid, ...: all mean the same here
                if not self.jvm.exists(rel):  # deleted while being decoded: its bytes were searched
                    self.report.vanished += 1
                    self._hits = {k: None for k in self._hits if not k.startswith("could not decode")}
                else:
                    self._hit(f"could not decode: {_error(e)}")
        self.report.decoded[used] += 1
        for what in self._hits:
            self.report.findings.append(Finding(rel, table.label, self._redact(what)))
        spent = time.monotonic() - started
        for where, key in ((self.report.seconds_by_decoder, used), (self.report.seconds_by_table, table.label or "")):
            where[key] = where.get(key, 0.0) + spent

    # -- decoders

    def _parquet(self, data: bytes) -> None:
        parquet = pq.ParquetFile(pa.BufferReader(data))
        for key, value in (parquet.metadata.metadata or {}).items():
            name, text = key.decode("utf-8", "replace"), value.decode("utf-8", "replace")
            if name in ("hoodie_min_record_key", "hoodie_max_record_key"):
                for kind in self._key_kinds(text):
                    self._hit(f"{kind} in the parquet footer's min/max record key")
            if self._has_text(text):
                self._hit(f"{TEXT} in the parquet footer metadata")
        for batch in parquet.iter_batches(batch_size=PARQUET_BATCH):
            self.report.records += batch.num_rows
            if self._table.dead_letters:  # per row: the rules depend on the row's topic
                for row in batch.to_pylist():
                    self._record(row)
                continue
            for i, column in enumerate(batch.schema):
                self._arrow_column(column.name, batch.column(i))
            self._arrow_rows(batch)

    def _hfile(self, rel: str) -> None:
        bounds, chunks, count = self.jvm.hfile(rel)
        for key in bounds:
            self._record_key(key, "the HFile's min/max key")
        for chunk in chunks:
            for record in self._values(chunk):
                self._record(record)
        self.report.records += count

    def _log(self, rel: str, data: bytes) -> None:
        for kind, what, chunk in self.jvm.log_blocks(rel, data):
            self.report.records += chunk.count
            values = self._values(chunk, keys=what == "keys") if what else []
            if what == "records":
                for record in values:
                    self._record(record, cdc=kind == "CDC_DATA_BLOCK")
            elif what == "keys":
                for key in values:
                    if key is not None:
                        self._record_key(key, "a delete block's record keys")
            elif kind == "CORRUPT_BLOCK":
                self._hit("could not decode: a corrupt block (only its raw bytes were searched, for texts)")

    def _record_key(self, key: str, where: str) -> None:
        """A record key outside a record (a file's bounds, a deleted key): the ids its fields name, and texts."""
        for kind in self._key_kinds(key):
            self._hit(f"{kind} in {where}")
        if self._has_text(key):
            self._hit(f"{TEXT} in {where}")


def _error(e: BaseException) -> str:
    """One line of an error: the Java exception rather than py4j's trace, bounded."""
    text = str(e.java_exception.toString()) if isinstance(e, Py4JJavaError) else f"{type(e).__name__}: {e}"
    line = text.strip().splitlines()[0] if text.strip() else type(e).__name__
    return line[:300]
