"""Decoding one file (Parquet, Hudi log, HFile, raw bytes) and matching what it holds against the subject.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from py4j.protocol import Py4JJavaError

from pipelines import contract
from pipelines.gdpr.scan.jvm import Jvm
from pipelines.gdpr.scan.model import (
    CUSTOMER,
    DIGITS,
    FIELD_NAME,
    ID_FIELD,
    MDT_KEY,
    ORDER,
    PARQUET_BATCH,
    TEXT,
    Chunk,
    Finding,
    ScanReport,
    Subject,
)
from pipelines.gdpr.scan.tables import Table, as_int, decoder_of, id_kinds, key_parts, secondary_index_record_key


class FileScan:
    """The rules, applied to decoded values; one instance per scan, state per file."""

    def __init__(self, jvm: Jvm, subject: Subject) -> None:
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
        self._table = self._key_table = Table("")

    # -- per file

    def file(self, rel: str, table: Table) -> None:
        started = time.monotonic()
        self._hits, self._table, self._key_table = {}, table, replace(table, mdt_partition=None)
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
        none of its digit runs is a subject id (as as_int reads numbers: leading zeros and
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
        `customer_id`: id_kinds; `_hoodie_record_key`, `record_key`: _is_key), at any depth,
        not amounts, LSNs or timestamps, which would match any small id; an array there is
        parsed whatever it holds. In the metadata table's records, ids count
        only in the record and secondary indexes' keys (id_kinds has none there): the runs of
        the `"key"` strings, not the index's positions and instant times.
        """
        if not self._all_ids:
            return False
        if (keys and (self._table.mdt_partition is None or self._table.keyed_by_data_keys)) \
                or self._table.dead_letters:  # raw Kafka keys and values: any run
            runs = DIGITS.findall(text)
        elif self._table.mdt_partition is None:
            values = ID_FIELD.findall(text)
            if "[" in values:
                return True
            runs = [run for value in values for run in DIGITS.findall(value)]
        elif self._table.keyed_by_data_keys:
            runs = [run for key in MDT_KEY.findall(text) for run in DIGITS.findall(key)]
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
        for batch in parquet.iter_batches(batch_size=PARQUET_BATCH):
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
                name = name if FIELD_NAME.match(name) else "{}"  # map keys are data, not names
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
        number = as_int(value)
        if number is not None:
            for kind in id_kinds(self._table, fields):
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
            key = secondary_index_record_key(key) or ""
        kinds = set()
        for name, value in key_parts(self._key_table, key):
            number = as_int(value)
            if number is not None:
                kinds.update(k for k in id_kinds(self._key_table, (name,)) if number in self.ids[k])
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
        kinds = id_kinds(self._table, fields)
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
            found.update(self._arrow_ids(_string_integers(plain), id_kinds(table, table.key_fields)))
        composite_keys = keys.filter(composite)
        if len(composite_keys):
            for name in dict.fromkeys(table.key_fields or ("id", "customer_id")):
                kinds = id_kinds(table, (name,))
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
