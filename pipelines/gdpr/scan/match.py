"""The scan's rules on decoded Python values (log and HFile records, delete blocks' keys, dead letters),
and what the file at hand was found to hold.

`Matcher` knows the subject (its ids and texts) and the table the current file belongs to;
the decoders hand it values, it records what it found (`_hit`) without ever keeping the
personal data itself. Arrow columns go through the same rules, vectorized
(`pipelines.gdpr.scan.columns`), and `FileScan` (`pipelines.gdpr.scan.files`) builds on both.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

from pipelines.errors import UnknownTable
from pipelines.gdpr.scan.model import (
    CUSTOMER,
    DIGITS,
    FIELD_NAME,
    ID_FIELD,
    MDT_KEY,
    ORDER,
    ROW,
    TEXT,
    Chunk,
    Subject,
)
from pipelines.gdpr.scan.tables import Table, as_int, id_kinds, key_parts, secondary_index_record_key
from pipelines.lake.declaration import Declaration


class Matcher:
    """The rules, applied to decoded values; one instance per scan, state per file. `decl` names the tables whose
    topics the dead letters came from."""

    def __init__(self, subject: Subject, decl: Declaration) -> None:
        self.decl = decl
        self.ids = {CUSTOMER: frozenset(subject.customer_ids), ORDER: frozenset(subject.order_ids)}
        self.texts = sorted({t.strip().casefold() for t in subject.texts if t.strip()})
        self._all_ids = self.ids[CUSTOMER] | self.ids[ORDER]
        self._json_ids: dict[str, re.Pattern[str]] = {}
        self.rows = {t: frozenset(keys) for t, keys in subject.rows.items() if keys}
        self._rows: frozenset[tuple[str | None, ...]] = frozenset()
        self._hits: dict[str, None] = {}
        self._table = self._key_table = Table("")

    def _start(self, table: Table) -> None:
        """Forget what the previous file held: the rules now apply to a file of `table`."""
        self._hits, self._table, self._key_table = {}, table, replace(table, mdt_partition=None)
        # The subject's rows of the declared table this file holds rows of (its keys: record keys, key columns).
        self._rows = self.rows.get(table.source or "", frozenset()) if table.row_key else frozenset()

    def _json_id(self, name: str) -> re.Pattern[str]:
        """`"<name>": N` in JSON text (a number, or digits in a string), N's digits captured."""
        if name not in self._json_ids:
            self._json_ids[name] = re.compile(r'"' + re.escape(name) + r'"\s*:\s*"?\s*([+-]?\d+)(?![\d.eE])')
        return self._json_ids[name]

    def _raw_has_text(self, data: bytes) -> bool:
        """The texts in a file's bytes as UTF-8, case-insensitive; in overlapping slices, to bound memory."""
        if not self.texts:
            return False
        step, overlap = 1 << 24, 4 * max(len(t.encode()) for t in self.texts)
        for start in range(0, len(data), step):
            if self._text_in(data[start:start + step + overlap].decode("utf-8", "replace")):
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
        if "\\" in text or '"bytes"' in text or self._text_in(text) or self._id_in(text, keys) \
                or self._row_in(text):
            return json.loads(text)
        return []

    def _row_in(self, text: str) -> bool:
        """Whether every key value of one of the subject's rows occurs in `text` (else no record of it can be there)."""
        return any(all(part is None or part in text for part in row) for row in self._rows)

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

    # -- rules on Python values

    def _record(self, record: object, cdc: bool = False) -> None:
        if not isinstance(record, dict):
            self._walk(record, (), "", cdc)
            return
        for name, value in record.items():
            self._walk(value, (name,), name, cdc)
        if self._table.dead_letters:
            self._dead_letter(record)
        elif self._rows and self._table.mdt_partition is None:
            for image, label in ((record, ""), *(((record.get(i), f"{i}.") for i in ("before", "after")) if cdc
                                                 else ())):
                if isinstance(image, dict) and self._is_erased_row(image):
                    self._hit(f"{ROW} in columns {label}{','.join(self._table.row_key)}")

    def _is_erased_row(self, row: dict[str, Any]) -> bool:
        """Whether a record (a row of the table, or a change-feed image) has the key of one of the subject's rows."""
        if not all(c in row for c in self._table.row_key):
            return False
        return tuple(key_value_text(row[c]) for c in self._table.row_key) in self._rows

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
        kinds: set[str] = set()
        parts = key_parts(self._key_table, key)
        for name, value in parts:
            number = as_int(value)
            if number is not None:
                kinds.update(k for k in id_kinds(self._key_table, (name,)) if number in self.ids[k])
        if self._rows:
            values = dict(parts)
            if all(c in values for c in self._table.row_key) \
                    and tuple(values[c] for c in self._table.row_key) in self._rows:
                kinds.add(ROW)
        return kinds

    def _has_text(self, value: str) -> bool:
        if not self.texts:
            return False
        if self._text_in(value):
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
        """Kafka key and value (raw bytes, maybe not JSON), by the topic's declared table: `"<subject>": N` a
        customer, `"id": N` an order of the shop's orders, the key's columns one of the subject's rows;
        `"customer_id": N` a customer anywhere, and `"id": N` either on a topic no declared table has."""
        topic = row.get("kafka_topic")
        try:
            source = self.decl.table_of_topic(topic) if isinstance(topic, str) else None
        except UnknownTable:
            source = None
        decl = self.decl.tables.get(source or "")
        fields: list[tuple[str, tuple[str, ...]]] = [("customer_id", (CUSTOMER,))]
        if decl is None:
            fields.append(("id", (CUSTOMER, ORDER)))
        else:
            fields += [(decl.subject, (CUSTOMER,))] if decl.subject else []
            fields += [("id", (ORDER,))] if source == "orders" else []
        rows = self.rows.get(source or "", frozenset())
        for col in ("key", "value"):
            text = _as_text(row.get(col))
            if not text:
                continue
            for name, kinds in fields:
                numbers = {int(m) for m in self._json_id(name).findall(text)}
                for kind in kinds:
                    if numbers & self.ids[kind]:
                        self._hit(f"{kind} in column {col}")
            if rows and decl is not None and self._dead_letter_row(text, decl.key, rows, col == "key"):
                self._hit(f"{ROW} in column {col}")

    def _dead_letter_row(self, text: str, key: tuple[str, ...], rows: frozenset[tuple[str | None, ...]],
                         whole: bool) -> bool:
        """Whether a dead letter's Kafka key (`whole`: its columns, plain or under a Connect schema's `payload`) or
        value (a single key column's numbers) names one of the subject's rows."""
        if whole:
            try:
                doc = json.loads(text)
            except ValueError:
                doc = None
            for image in (doc, doc.get("payload") if isinstance(doc, dict) else None):
                if isinstance(image, dict) and all(c in image for c in key) \
                        and tuple(key_value_text(image[c]) for c in key) in rows:
                    return True
        if len(key) == 1:
            return any((str(int(m)),) in rows for m in self._json_id(key[0]).findall(text))
        return False


def key_value_text(value: object) -> str | None:
    """A key value as Spark casts it to text (`erasure_registry.key_text`): how the subject's rows are named."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


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
