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
(`pipelines.storage`), on a local root or an object store alike: Hadoop's local listing
forks a process per file to read its permissions (about 5 ms a file) and hides `.crc`
files, which are scanned too. py4j calls are batched per block or file: records are
collected in the JVM (method handles stand in for lambdas) and rendered as one JSON text
by Avro's `GenericData.toString`, which Python parses.
"""

from __future__ import annotations

import json
import logging
import re
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from py4j.java_gateway import JavaObject
from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

from pipelines import contract, storage
from pipelines.services.table_services import lake_tables

log = logging.getLogger(__name__)

CUSTOMER = "customer id"
ORDER = "order id"
TEXT = "e-mail/name text"
DECODERS = ("parquet", "hudi-log", "hfile", "raw")

# Hudi's FSUtils.LOG_FILE_PATTERN (1.0.2): `.<fileId>_<instant>.log.<version>_<token>[.cdc]`,
# and `.archive` for the archived timeline of 0.x tables; anchored at the end, so that a
# marker left by a failed write (`<log file name>.marker.APPEND`) is not taken for a log.
_LOG_NAME = re.compile(r"^\.(.+)_(.*)\.(log|archive)\.(\d+)(_((\d+)-(\d+)-(\d+))([.-]cdc)?)?$")
# Avro names: what a JSON object key must look like to be a field rather than a map key.
_FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_INTEGER = re.compile(r"^\s*[+-]?\d+\s*$")
_DIGITS = re.compile(r"\d+")
# A metadata-table record's `key` string in GenericData.toString's JSON (no escapes: _Scan._values).
_MDT_KEY = re.compile(r'"key":\s*"([^"]*)"')
# The value of a data-table field that rules read ids at: a string, a scalar, or `[` (an array).
_ID_FIELD = re.compile(r'"(?:id|customer_id|_hoodie_record_key|record_key)":\s*("[^"]*"|\[|[^,}\]\s]*)')
# Records per `GenericData.toString` call: one py4j round trip, a bounded JSON text.
_CHUNK = 2000
# Rows per Arrow batch of a Parquet file: each batch costs a few kernel calls per column.
_PARQUET_BATCH = 65536
_LOG_MAGIC = b"#HUDI#"
_DATA_BLOCKS = ("AVRO_DATA_BLOCK", "HFILE_DATA_BLOCK", "PARQUET_DATA_BLOCK", "CDC_DATA_BLOCK")


@dataclass(frozen=True)
class Subject:
    customer_ids: frozenset[int]
    order_ids: frozenset[int]
    texts: frozenset[str]  # e-mails and full names; matched case-insensitively as substrings


@dataclass(frozen=True)
class Finding:
    path: str  # file path relative to the root
    table: str  # e.g. "silver/customers", "silver/customers (metadata table)"; "" outside tables
    what: str  # what was found, never the personal data itself


@dataclass
class ScanReport:
    files: int = 0  # files looked at
    # Files per decoder; a file that failed to decode counts as "raw" (only its bytes were scanned).
    decoded: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DECODERS, 0))
    records: int = 0  # decoded records looked at
    # Files deleted between the listing and their reading (a writer's heartbeat, a cleaned
    # slice): no longer under the root, so holding nothing.
    vanished: int = 0
    findings: list[Finding] = field(default_factory=list)
    seconds: float = 0.0
    # Where the scan's time went: seconds per decoder used, and per table (its label).
    seconds_by_decoder: dict[str, float] = field(default_factory=dict)
    seconds_by_table: dict[str, float] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        """No file holds the subject, and every file that looks like data was decoded."""
        return not self.findings


@dataclass(frozen=True)
class Chunk:
    """Records (or keys) decoded by Hudi's readers, rendered as one JSON array by Avro's GenericData.toString."""

    count: int
    text: str


def scan_lake(spark: SparkSession, root: str, subject: Subject,
              progress: Callable[[int, int], None] | None = None,
              only: Callable[[str], bool] | None = None) -> ScanReport:
    """Decode every file under `root` and report each one that still holds data of `subject`.

    `progress(done, total)` is called after each file. `only(rel)` narrows the scan to the
    files it accepts (paths relative to the root; the tables are still found from every
    file). Raises FileNotFoundError when the root does not exist: a typo must not produce a
    clean certificate.
    """
    started = time.monotonic()
    jvm = _Jvm(spark, root)
    every = jvm.list_files()
    tables = _tables(jvm, every)
    files = [rel for rel in every if only(rel)] if only else every
    scan = _Scan(jvm, subject)
    for done, rel in enumerate(files, 1):
        scan.file(rel, _table_of(rel, tables))
        if progress:
            progress(done, len(files))
    report = scan.report
    report.files = len(files)
    report.findings.sort(key=lambda f: (f.path, f.what))
    report.seconds = time.monotonic() - started
    log.info("scanned %d files (%s, %d vanished meanwhile), %d records in %.1f s: %d findings", report.files,
             report.decoded, report.vanished, report.records, report.seconds, len(report.findings))
    return report


# ----------------------------------------------------------------------------- tables


@dataclass(frozen=True)
class _Table:
    name: str  # as lake_tables names it ("silver/customers"); "" outside tables
    key_fields: tuple[str, ...] = ()  # the data table's record key fields
    mdt_partition: str | None = None  # metadata-table partition of the file; None for the data table

    @property
    def label(self) -> str:
        return f"{self.name} (metadata table)" if self.mdt_partition is not None else self.name

    @cached_property
    def entity(self) -> str | None:
        """Whose id the table's `id` column is: path segment `customers` or `orders`."""
        segments = self.name.split("/")
        return CUSTOMER if "customers" in segments else ORDER if "orders" in segments else None

    @cached_property
    def dead_letters(self) -> bool:
        return self.mdt_partition is None and "_dead_letters" in self.name.split("/")

    @cached_property
    def keyed_by_data_keys(self) -> bool:
        """Whether record keys here are the data table's: its own, and those of its record and secondary index."""
        partition = self.mdt_partition
        return partition is None or partition == "record_index" or partition.startswith("secondary_index")


def _tables(jvm: _Jvm, files: list[str]) -> dict[str, _Table]:
    """Table roots (relative) -> table: those lake_tables names, and any other with a hoodie.properties.

    The record key fields come from the table's hoodie.properties (what Hudi wrote), else
    from the writer options the pipeline uses.
    """
    tables = {t.name: _Table(t.name, _fields(t.options.get("hoodie.datasource.write.recordkey.field", "")))
              for t in lake_tables(jvm.root)}
    suffix = "/.hoodie/hoodie.properties"
    for rel in files:
        if not rel.endswith(suffix) or "/.hoodie/metadata/" in rel + "/":
            continue
        name = rel[: -len(suffix)]
        props = _properties(jvm.read(rel).decode("utf-8", "replace"))
        keys = _fields(props.get("hoodie.table.recordkey.fields", ""))
        tables[name] = _Table(name, keys or (tables[name].key_fields if name in tables else ()))
    return tables


def _table_of(rel: str, tables: dict[str, _Table]) -> _Table:
    """The table whose root is the longest prefix of `rel`; its metadata table below `.hoodie/metadata/`."""
    best = None
    for name, table in tables.items():
        if rel.startswith(name + "/") and (best is None or len(name) > len(best.name)):
            best = table
    if best is None:
        return _Table("")
    inner = rel[len(best.name) + 1:]
    if inner.startswith(".hoodie/metadata/"):
        parts = inner[len(".hoodie/metadata/"):].split("/")
        return replace(best, mdt_partition=parts[0] if len(parts) > 1 else "")
    return best


def _fields(spec: str) -> tuple[str, ...]:
    return tuple(f.strip() for f in spec.split(",") if f.strip())


def _properties(text: str) -> dict[str, str]:
    """Java properties as Hudi writes hoodie.properties (key=value lines, `\\` escapes)."""
    props = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "!")) and "=" in line:
            key, _, value = line.partition("=")
            props[key.strip()] = re.sub(r"\\(.)", r"\1", value.strip())
    return props


# ----------------------------------------------------------------------------- the JVM side


class _Jvm:
    """Hadoop listing and Hudi's readers through py4j, with per-block (not per-record) round trips."""

    def __init__(self, spark: SparkSession, root: str) -> None:
        sc = spark.sparkContext
        self._jvm = jvm = sc._jvm
        hconf = sc._jsc.hadoopConfiguration()
        hudi = jvm.org.apache.hudi
        self._hudi = hudi
        path = jvm.org.apache.hadoop.fs.Path(root)
        fs = path.getFileSystem(hconf)
        if not fs.exists(path):
            raise FileNotFoundError(f"lake root {root} does not exist")
        self.root = fs.makeQualified(path).toString().rstrip("/")
        parsed = urlparse(self.root)
        # What pipelines.storage lists and reads: the local path, or the store's URI.
        self._files = parsed.path.rstrip("/") if parsed.scheme == "file" else self.root
        self.storage = hudi.storage.hadoop.HoodieHadoopStorage(
            hudi.storage.StoragePath(self.root), hudi.storage.hadoop.HadoopStorageConfiguration(hconf))
        invoke = jvm.java.lang.invoke
        lookup, mtype = invoke.MethodHandles.publicLookup(), invoke.MethodType
        string = self._class("java.lang.String")
        self._data_of = self._function(lookup.findVirtual(
            self._class("org.apache.hudi.common.model.HoodieRecord"), "getData",
            mtype.methodType(self._class("java.lang.Object"))))
        self._key_of = self._function(lookup.findVirtual(
            self._class("org.apache.hudi.common.model.DeleteRecord"), "getRecordKey", mtype.methodType(string)))
        # Arrays.asList as a Function: py4j cannot pass an object array to a varargs method.
        self._as_list = self._function(lookup.findStatic(
            self._class("java.util.Arrays"), "asList",
            mtype.methodType(self._class("java.util.List"), self._class("[Ljava.lang.Object;"))).asFixedArity())
        self._to_list = jvm.java.util.stream.Collectors.toList()
        self._avro = jvm.org.apache.avro.generic.GenericData.get()
        self._avro_type = hudi.common.model.HoodieRecord.HoodieRecordType.AVRO
        self._schema_header = hudi.common.table.log.block.HoodieLogBlock.HeaderMetadataType.SCHEMA
        self.schema_ordinal = int(self._schema_header.ordinal())

    def _class(self, name: str) -> JavaObject:
        loader = self._jvm.java.lang.Thread.currentThread().getContextClassLoader()
        return self._jvm.java.lang.Class.forName(name, True, loader)

    def _function(self, handle: JavaObject) -> JavaObject:
        """A java.util.function.Function from a method handle: a JVM-side lambda, no Python callback."""
        return self._jvm.java.lang.invoke.MethodHandleProxies.asInterfaceInstance(
            self._class("java.util.function.Function"), handle)

    def _json(self, values: JavaObject) -> Iterator[Chunk]:
        """A Java list (of Avro records, strings) as JSON texts, a chunk per py4j round trip."""
        size = values.size()
        for start in range(0, size, _CHUNK):
            end = min(size, start + _CHUNK)
            yield Chunk(end - start, self._avro.toString(values.subList(start, end)))

    def _path(self, rel: str) -> JavaObject:
        return self._hudi.storage.StoragePath(f"{self.root}/{rel}")

    def list_files(self) -> list[str]:
        """Every file under the root, recursively, relative to it, sorted (`.crc` files too)."""
        return storage.list_files(self._files)

    def exists(self, rel: str) -> bool:
        return storage.exists(f"{self._files}/{rel}")

    def read(self, rel: str) -> bytes:
        return storage.read_bytes(f"{self._files}/{rel}")

    def log_blocks(self, rel: str, data: bytes) -> Iterator[tuple[str, str, Chunk]]:
        """(block type, what, values) of every block of a Hudi log file, in chunks.

        Values are record dicts for data blocks, record keys for delete blocks, none otherwise.
        A CDC block needs a reader schema (HoodieCDCDataBlock rejects none): the writer
        schema in the block's header; if a later block was written with another schema, the
        file is read again from that block on with it, so that no field is projected away.
        """
        hudi = self._hudi
        log_file = hudi.common.model.HoodieLogFile(self._path(rel))
        schema = _first_block_schema(data, self.schema_ordinal) if log_file.isCDC() else None
        done = 0
        while True:
            parsed = self._jvm.org.apache.avro.Schema.Parser().parse(schema) if schema else None
            reader = hudi.common.table.log.HoodieLogFormat.newReader(self.storage, log_file, parsed)
            # py4j's iterator wrapper turns Java errors in next() into StopIteration: call Java's.
            next_block = JavaObject.__getattr__(reader, "next")
            reread, index = False, 0
            try:
                while reader.hasNext():
                    block = next_block()
                    index += 1
                    if index <= done:
                        continue
                    kind = str(block.getBlockType().name())
                    if kind == "CDC_DATA_BLOCK" and schema is not None:
                        written = block.getLogBlockHeader().get(self._schema_header)
                        if written and written != schema:
                            schema, reread = written, True
                            break
                    if kind in _DATA_BLOCKS:
                        records = block.getRecordIterator(self._avro_type)
                        try:
                            data_list = hudi.common.util.CollectionUtils.toStream(records) \
                                .map(self._data_of).collect(self._to_list)
                        finally:
                            records.close()
                        for chunk in self._json(data_list):
                            yield kind, "records", chunk
                    elif kind == "DELETE_BLOCK":
                        deletes = self._jvm.java.util.stream.Stream.of(block.getRecordsToDelete()) \
                            .map(self._as_list).findFirst().get()
                        keys = deletes.stream().map(self._key_of).collect(self._to_list)
                        for chunk in self._json(keys):
                            yield kind, "keys", chunk
                    else:  # COMMAND_BLOCK (rollback), CORRUPT_BLOCK
                        yield kind, "", Chunk(0, "[]")
                    done = index
            finally:
                reader.close()
            if not reread:
                return

    def hfile(self, rel: str) -> tuple[list[str], Iterator[Chunk], int]:
        """(min/max keys, record chunks, record count) of an HFile, through Hudi's native HFile reader."""
        hudi = self._hudi
        reader = hudi.io.storage.HoodieNativeAvroHFileReader(self.storage, self._path(rel),
                                                            hudi.common.util.Option.empty())
        try:
            try:
                bounds = [str(k) for k in reader.readMinMaxRecordKeys()]
            except Py4JJavaError:  # optional file info; the keys are in the records anyway
                bounds = []
            schema = reader.getSchema()
            records = reader.getIndexedRecordIterator(schema, schema)
            try:
                values = hudi.common.util.CollectionUtils.toStream(records).collect(self._to_list)
            finally:
                records.close()
            chunks = list(self._json(values))
        finally:
            reader.close()
        return bounds, iter(chunks), sum(c.count for c in chunks)


def _first_block_schema(data: bytes, ordinal: int) -> str | None:
    """Writer schema in the first block header of a log file (format v1: magic, size, version, type, header)."""
    if not data.startswith(_LOG_MAGIC) or len(data) < 26:
        return None
    pos = len(_LOG_MAGIC) + 8 + 4 + 4
    try:
        (entries,) = struct.unpack_from(">i", data, pos)
        pos += 4
        for _ in range(entries):
            key, length = struct.unpack_from(">ii", data, pos)
            pos += 8
            if key == ordinal:
                return data[pos:pos + length].decode("utf-8")
            pos += length
    except (struct.error, UnicodeDecodeError):
        return None
    return None


# ----------------------------------------------------------------------------- the rules


def _decoder(name: str) -> str:
    if name.endswith(".crc"):
        return "raw"
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith(".hfile"):
        return "hfile"
    if _LOG_NAME.match(name):
        return "hudi-log"
    if name.endswith(".orc"):
        return "orc"  # a Hudi base file format this scanner has no decoder for
    return "raw"


def _as_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _INTEGER.match(value):
        return int(value)
    return None


def _id_kinds(table: _Table, fields: tuple[str, ...]) -> tuple[str, ...]:
    """Whose ids a value at field path `fields` of a data table's record is.

    `customer_id` anywhere; `id` of a customers or orders table; `id` of the structs in an
    `orders` array (gold/_customer_orders). Metadata-table records have no id columns.
    """
    if table.mdt_partition is not None or not fields:
        return ()
    if fields[-1] == "customer_id":
        return (CUSTOMER,)
    if fields[-1] == "id":
        if len(fields) == 1:
            return (table.entity,) if table.entity else ()
        if fields[-2] == "orders":
            return (ORDER,)
    return ()


def _key_parts(table: _Table, key: str) -> list[tuple[str, str]]:
    """(field, value) of a Hudi record key: `42`, or `id:42,_lsn:123` (ComplexKeyGenerator)."""
    if ":" in key:
        parts = [p.partition(":") for p in key.split(",")]
        known = set(table.key_fields)
        if all(sep and (f in known if known else _FIELD_NAME.match(f)) for f, sep, _ in parts):
            return [(f, v) for f, _, v in parts]
    return [(table.key_fields[0], key)] if len(table.key_fields) == 1 else []


def _secondary_index_record_key(key: str) -> str | None:
    """The record key in a secondary-index entry's key, `<secondary key>$<record key>` (`\\` escapes)."""
    for i in range(len(key) - 1, -1, -1):
        if key[i] == "$" and (i == 0 or key[i - 1] != "\\"):
            return re.sub(r"\\([\\$])", r"\1", key[i + 1:])
    return None


class _Scan:
    """The rules, applied to decoded values; one instance per scan, state per file."""

    def __init__(self, jvm: _Jvm, subject: Subject) -> None:
        self.jvm = jvm
        self.report = ScanReport()
        self.ids = {CUSTOMER: frozenset(subject.customer_ids), ORDER: frozenset(subject.order_ids)}
        self.texts = sorted({t.strip().casefold() for t in subject.texts if t.strip()})
        # Every text as a literal of one RE2 alternation: one pass over a column instead of one per
        # text, with the semantics of match_substring(ignore_case=True), which is RE2 on a literal.
        self._texts_regex = "|".join(re.sub(r"([.^$*+?{}\[\]\\|()])", r"\\\1", t) for t in self.texts)
        self._all_ids = self.ids[CUSTOMER] | self.ids[ORDER]
        self._id_values = {k: pa.array(sorted(v), pa.int64()) for k, v in self.ids.items()}
        self._json_ids = {name: re.compile(r'"' + name + r'"\s*:\s*"?\s*([+-]?\d+)(?![\d.eE])')
                          for name in ("id", "customer_id")}
        self._hits: dict[str, None] = {}
        self._table = self._key_table = _Table("")

    # -- per file

    def file(self, rel: str, table: _Table) -> None:
        started = time.monotonic()
        self._hits, self._table, self._key_table = {}, table, replace(table, mdt_partition=None)
        name = rel.rsplit("/", 1)[-1]
        decoder = _decoder(name)
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

    def _raw_has_text(self, data: bytes) -> bool:
        """The texts in a file's bytes as UTF-8, case-insensitive; in overlapping slices, to bound memory."""
        if not self.texts:
            return False
        step, overlap = 1 << 24, 4 * max(len(t.encode()) for t in self.texts)
        for start in range(0, len(data), step):
            text = data[start:start + step + overlap].decode("utf-8", "replace").casefold()
            if any(t in text for t in self.texts):
                return True
        return False

    def _hit(self, what: str) -> None:
        self._hits[what] = None

    def _values(self, chunk: Chunk, keys: bool = False) -> list[Any]:
        """The chunk's records as Python values, or [] when its JSON text cannot hold the subject.

        Most chunks (the record index's millions of keys, other customers' log records) hold
        nothing of the subject, and parsing and walking them is most of a scan's time. A
        chunk whose text has no escape (`\\`) and no Avro bytes value renders every string
        literally, so every string value, map key and number of its records is a substring of
        the text: when no subject text occurs in the text (casefolded, as values are) and
        none of its digit runs is a subject id (as _as_int reads numbers: leading zeros and
        signs aside), no rule can hit on any value, and skipping the chunk changes nothing.
        Any other chunk is parsed and walked in full. `keys`: the chunk is a delete block's
        record keys, not records.
        """
        text = chunk.text
        if "\\" in text or '"bytes"' in text or self._text_in(text) or self._id_in(text, keys):
            return json.loads(text)
        return []

    def _text_in(self, text: str) -> bool:
        if not self.texts:
            return False
        folded = text.casefold()
        return any(t in folded for t in self.texts)

    def _id_in(self, text: str, keys: bool) -> bool:
        """Whether a run of digits in `text` that a rule reads as an id is the number of a subject id.

        In a delete block's keys (of a data table, or of the record and secondary indexes)
        and in the dead letters (raw Kafka keys and values), any run. In a data table's
        records, the values of the fields whose name a rule reads ids at (`id`,
        `customer_id`: _id_kinds; `_hoodie_record_key`, `record_key`: _is_key), at any depth,
        not amounts, LSNs or timestamps, which would match any small id; an array there is
        parsed whatever it holds. In the metadata table's records, ids count
        only in the record and secondary indexes' keys (_id_kinds has none there): the runs of
        the `"key"` strings, not the index's positions and instant times.
        """
        if not self._all_ids:
            return False
        if (keys and (self._table.mdt_partition is None or self._table.keyed_by_data_keys)) \
                or self._table.dead_letters:  # raw Kafka keys and values: any run
            runs = _DIGITS.findall(text)
        elif self._table.mdt_partition is None:
            values = _ID_FIELD.findall(text)
            if "[" in values:
                return True
            runs = [run for value in values for run in _DIGITS.findall(value)]
        elif self._table.keyed_by_data_keys:
            runs = [run for key in _MDT_KEY.findall(text) for run in _DIGITS.findall(key)]
        else:
            return False
        ids = self._all_ids
        # Longer runs cannot be an id (and int() refuses runs beyond 4,300 digits).
        return any(len(number := run.lstrip("0")) <= 19 and number and int(number) in ids for run in runs)

    def _redact(self, text: str) -> str:
        """`text` without any of the subject's texts or ids (error messages may quote data)."""
        for needle in self.texts:
            text = re.sub(re.escape(needle), "<redacted>", text, flags=re.IGNORECASE)
        return re.sub(r"\d+", lambda m: "<redacted>" if int(m.group()) in self._all_ids else m.group(), text)

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
        for batch in parquet.iter_batches(batch_size=_PARQUET_BATCH):
            self.report.records += batch.num_rows
            if self._table.dead_letters:  # per row: the rules depend on the row's topic
                for row in batch.to_pylist():
                    self._record(row)
                continue
            for i, column in enumerate(batch.schema):
                for fields, col, leaf in _leaves(batch.column(i), (column.name,), column.name):
                    self._arrow_leaf(fields, col, leaf)

    def _hfile(self, rel: str) -> None:
        bounds, chunks, count = self.jvm.hfile(rel)
        for key in bounds:
            for kind in self._key_kinds(key):
                self._hit(f"{kind} in the HFile's min/max key")
            if self._has_text(key):
                self._hit(f"{TEXT} in the HFile's min/max key")
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
                    if key is None:
                        continue
                    for found in self._key_kinds(key):
                        self._hit(f"{found} in a delete block's record keys")
                    if self._has_text(key):
                        self._hit(f"{TEXT} in a delete block's record keys")
            elif kind == "CORRUPT_BLOCK":
                self._hit("could not decode: a corrupt block (only its raw bytes were searched, for texts)")

    # -- rules on Python values (decoded log and HFile records, dead letters)

    def _record(self, record: object, cdc: bool = False) -> None:
        if not isinstance(record, dict):
            self._walk(record, (), "", cdc)
            return
        for name, value in record.items():
            self._walk(value, (name,), name, cdc)
        if self._table.dead_letters:
            self._dead_letter(record)

    def _walk(self, value: object, fields: tuple[str, ...], col: str, cdc: bool) -> None:
        if isinstance(value, dict):
            raw = value.get("bytes") if len(value) == 1 else None
            if isinstance(raw, str):  # Avro bytes as GenericData.toString renders them: chars 0-255
                self._walk(_avro_bytes(raw), fields, col, cdc)
                return
            for name, item in value.items():
                name = name if _FIELD_NAME.match(name) else "{}"  # map keys are data, not names
                self._walk(item, (*fields, name), f"{col}.{name}" if col else name, cdc)
        elif isinstance(value, list | tuple):
            for item in value:
                self._walk(item, fields, f"{col}[]", cdc)
        elif isinstance(value, bytes | bytearray):
            self._scalar(bytes(value).decode("utf-8", "replace"), fields, col, cdc)
        elif isinstance(value, str | int) and not isinstance(value, bool):
            self._scalar(value, fields, col, cdc)

    def _scalar(self, value: str | int, fields: tuple[str, ...], col: str, cdc: bool) -> None:
        if cdc and len(fields) > 1 and fields[0] in ("before", "after"):
            fields = fields[1:]  # a CDC image is a row of the table
        if isinstance(value, str) and self._has_text(value):
            self._hit(f"{TEXT} in column {col}")
        number = _as_int(value)
        if number is not None:
            for kind in _id_kinds(self._table, fields):
                if number in self.ids[kind]:
                    self._hit(f"{kind} in column {col}")
        if isinstance(value, str) and self._is_key(fields, cdc):
            for kind in self._key_kinds(value):
                self._hit(self._key_label(kind, col))

    def _is_key(self, fields: tuple[str, ...], cdc: bool) -> bool:
        if self._table.mdt_partition is not None:
            partition = self._table.mdt_partition
            return fields == ("key",) and (partition == "record_index" or partition.startswith("secondary_index"))
        return fields == ("_hoodie_record_key",) or (cdc and fields == ("record_key",))

    def _key_label(self, kind: str, col: str) -> str:
        partition = self._table.mdt_partition
        return f"{kind} in column {col}" + (f" (a {partition} entry's key)" if partition is not None else "")

    def _key_kinds(self, key: str) -> set[str]:
        """Whose ids a record key of the (data) table holds, by the table's key fields.

        Keys of metadata partitions other than the record and secondary indexes are
        partition names, hashes, file names: they hold no ids.
        """
        if not self._table.keyed_by_data_keys:
            return set()
        if (self._table.mdt_partition or "").startswith("secondary_index"):
            key = _secondary_index_record_key(key) or ""
        kinds = set()
        for name, value in _key_parts(self._key_table, key):
            number = _as_int(value)
            if number is not None:
                kinds.update(k for k in _id_kinds(self._key_table, (name,)) if number in self.ids[k])
        return kinds

    def _has_text(self, value: str) -> bool:
        if not self.texts:
            return False
        folded = value.casefold()
        if any(t in folded for t in self.texts):
            return True
        stripped = value.lstrip()
        # JSON text (a Debezium payload): escapes hide needles. Without a backslash there is no
        # escape, and every string of the JSON is a substring of the value, searched above.
        if stripped[:1] in ("{", "[") and "\\" in value:
            try:
                return self._json_has_text(json.loads(stripped))
            except ValueError:
                return False
        return False

    def _json_has_text(self, value: object) -> bool:
        if isinstance(value, dict):
            return any(self._has_text(k) or self._json_has_text(v) for k, v in value.items())
        if isinstance(value, list):
            return any(self._json_has_text(v) for v in value)
        return isinstance(value, str) and self._has_text(value)

    def _dead_letter(self, row: dict[str, Any]) -> None:
        """Kafka key and value (raw bytes, maybe not JSON): `"id": N`, `"customer_id": N` by topic."""
        topic = row.get("kafka_topic")
        try:
            source = contract.table_of_topic(topic) if isinstance(topic, str) else None
        except ValueError:
            source = None
        of_id = (CUSTOMER,) if source == "customers" else (ORDER,) if source == "orders" else (CUSTOMER, ORDER)
        for col in ("key", "value"):
            text = _as_text(row.get(col))
            if not text:
                continue
            for name, kinds in (("id", of_id), ("customer_id", (CUSTOMER,))):
                numbers = {int(m) for m in self._json_ids[name].findall(text)}
                for kind in kinds:
                    if numbers & self.ids[kind]:
                        self._hit(f"{kind} in column {col}")

    # -- rules on Arrow columns (parquet), vectorized

    def _arrow_leaf(self, fields: tuple[str, ...], col: str, leaf: pa.Array) -> None:
        kind_of = leaf.type
        if pa.types.is_binary(kind_of) or pa.types.is_large_binary(kind_of) or pa.types.is_fixed_size_binary(kind_of):
            try:
                leaf = leaf.cast(pa.large_string())
            except pa.ArrowInvalid:  # not UTF-8: decode what is
                leaf = pa.array([None if b is None else b.decode("utf-8", "replace") for b in leaf.to_pylist()],
                                pa.large_string())
            kind_of = leaf.type
        kinds = _id_kinds(self._table, fields)
        if pa.types.is_string(kind_of) or pa.types.is_large_string(kind_of):
            if self.texts:
                if pc.any(pc.match_substring_regex(leaf, self._texts_regex, ignore_case=True)).as_py():
                    self._hit(f"{TEXT} in column {col}")
                else:
                    trimmed = pc.utf8_ltrim_whitespace(leaf)
                    jsonish = pc.or_(pc.starts_with(trimmed, "{"), pc.starts_with(trimmed, "["))
                    if any(self._has_text(s) for s in leaf.filter(jsonish).to_pylist() if s):
                        self._hit(f"{TEXT} in column {col}")
            if self._is_key(fields, cdc=False):
                self._arrow_keys(col, leaf)
            # Numbers in strings count only where a rule reads ids (most string columns: none).
            for kind in self._arrow_ids(_string_integers(leaf), kinds) if kinds else ():
                self._hit(f"{kind} in column {col}")
        elif kinds and (pa.types.is_integer(kind_of) or pa.types.is_decimal(kind_of)):
            for kind in self._arrow_ids(leaf, kinds):
                self._hit(f"{kind} in column {col}")

    def _arrow_keys(self, col: str, keys: pa.Array) -> None:
        """Record keys, as _key_kinds reads them: plain (`42`) or composite (`id:42,_lsn:7`)."""
        if not self._table.keyed_by_data_keys:
            return
        if (self._table.mdt_partition or "").startswith("secondary_index"):  # `<value>$<key>`: rare, in Python
            for key in pc.unique(keys).to_pylist():
                if key is not None:
                    for kind in self._key_kinds(key):
                        self._hit(self._key_label(kind, col))
            return
        table, found = self._key_table, set()
        composite = pc.match_substring(keys, ":")
        if len(table.key_fields) == 1:
            plain = keys.filter(pc.invert(composite))
            found.update(self._arrow_ids(_string_integers(plain), _id_kinds(table, table.key_fields)))
        composite_keys = keys.filter(composite)
        if len(composite_keys):
            for name in dict.fromkeys(table.key_fields or ("id", "customer_id")):
                kinds = _id_kinds(table, (name,))
                if kinds:
                    parts = pc.extract_regex(composite_keys, rf"(?:^|,){re.escape(name)}:(?P<v>[^,]*)")
                    found.update(self._arrow_ids(_string_integers(parts.flatten()[0]), kinds))
        for kind in found:
            self._hit(self._key_label(kind, col))

    def _arrow_ids(self, values: pa.Array | set[int], kinds: tuple[str, ...]) -> list[str]:
        """Those of `kinds` whose subject ids are among `values` (integers, decimals, or a set)."""
        kinds = tuple(k for k in kinds if self.ids[k])
        if not kinds:
            return []
        if isinstance(values, pa.Array):
            try:
                as_long = values.cast(pa.int64())
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # beyond int64, or fractions: in Python
                values = {int(v) for v in values.to_pylist() if v is not None and v == int(v)}
            else:
                return [k for k in kinds if pc.any(pc.is_in(as_long, value_set=self._id_values[k])).as_py()]
        return [k for k in kinds if self.ids[k] & values]


def _leaves(arr: pa.Array, fields: tuple[str, ...], col: str) -> Iterator[tuple[tuple[str, ...], str, pa.Array]]:
    """Leaf arrays of a column with their field path (rules) and display name (findings)."""
    kind = arr.type
    if pa.types.is_dictionary(kind):
        arr = arr.dictionary_decode()
        kind = arr.type
    if pa.types.is_struct(kind):
        for i, child in enumerate(arr.flatten()):
            name = kind.field(i).name
            yield from _leaves(child, (*fields, name), f"{col}.{name}")
    elif pa.types.is_map(kind):
        yield from _leaves(arr.keys, (*fields, "{}"), f"{col}{{}}")
        yield from _leaves(arr.items, (*fields, "{}"), f"{col}{{}}")
    elif pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        yield from _leaves(arr.flatten(), fields, f"{col}[]")
    else:
        yield fields, col, arr


def _string_integers(strings: pa.Array) -> pa.Array | set[int]:
    """The values of a string array that are whole numbers, as int64 (or a set when beyond it)."""
    digits = pc.utf8_trim_whitespace(strings.filter(pc.match_substring_regex(strings, r"^\s*[+-]?\d+\s*$")))
    try:
        return digits.cast(pa.int64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return {int(s) for s in digits.to_pylist()}


def _avro_bytes(text: str) -> bytes | str:
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:
        return text


def _as_text(value: object) -> str:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, dict) and isinstance(value.get("bytes"), str):
        raw = _avro_bytes(value["bytes"])
        return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    return value if isinstance(value, str) else ""


def _error(e: BaseException) -> str:
    """One line of an error: the Java exception rather than py4j's trace, bounded."""
    text = str(e.java_exception.toString()) if isinstance(e, Py4JJavaError) else f"{type(e).__name__}: {e}"
    line = text.strip().splitlines()[0] if text.strip() else type(e).__name__
    return line[:300]
