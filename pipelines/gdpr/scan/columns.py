"""The scan's rules on Arrow columns (Parquet files), vectorized: the same findings `Matcher` makes on
Python values, a few kernel calls per column instead of a Python call per value.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import TypeGuard

import pyarrow as pa
import pyarrow.compute as pc

from pipelines.gdpr.scan.match import Matcher
from pipelines.gdpr.scan.model import ROW, TEXT, Subject
from pipelines.gdpr.scan.tables import id_kinds
from pipelines.lake.declaration import Declaration


class ColumnMatcher(Matcher):
    """`Matcher` with the rules on Arrow columns."""

    def __init__(self, subject: Subject, decl: Declaration) -> None:
        super().__init__(subject, decl)
        # Every text as a literal of one RE2 alternation: one pass over a column instead of one per
        # text, with the semantics of match_substring(ignore_case=True), which is RE2 on a literal.
        self._texts_regex = "|".join(re.sub(r"([.^$*+?{}\[\]\\|()])", r"\\\1", t) for t in self.texts)
        self._id_values = {k: pa.array(sorted(v), pa.int64()) for k, v in self.ids.items()}

    def _arrow_column(self, name: str, column: pa.Array) -> None:
        """A column of a record batch, leaf by leaf (the fields of structs, maps and lists)."""
        for fields, col, leaf in _leaves(column, (name,), name):
            self._arrow_leaf(fields, col, leaf)

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
        if self._rows and self._arrow_key_rows(keys, composite):
            found.add(ROW)
        for kind in found:
            self._hit(self._key_label(kind, col))

    def _erased_set(self, like: pa.DataType) -> pa.Array:
        """The subject's rows of this table, each key's values joined by U+001F (a key with a NULL part left out)."""
        return pa.array(sorted("\x1f".join(row) for row in self._rows if _whole(row)), pa.string()).cast(like)

    def _arrow_key_rows(self, keys: pa.Array, composite: pa.Array) -> bool:
        """Whether record keys (plain `eu`, or composite `region:eu,order_no:5`) name one of the subject's rows."""
        table, fields = self._key_table, self._table.row_key
        if len(table.key_fields) == 1 and len(fields) == 1:
            plain = keys.filter(pc.invert(composite))
            return bool(len(plain)) and pc.any(pc.is_in(plain, value_set=self._erased_set(keys.type))).as_py()
        composite_keys = keys.filter(composite)
        if not len(composite_keys):
            return False
        parts = [pc.extract_regex(composite_keys, rf"(?:^|,){re.escape(name)}:(?P<v>[^,]*)").flatten()[0]
                 for name in fields]
        joined = pc.binary_join_element_wise(*parts, "\x1f")
        return bool(pc.any(pc.is_in(joined, value_set=self._erased_set(joined.type))).as_py())

    def _arrow_rows(self, batch: pa.RecordBatch) -> None:
        """A record batch of a data table: does a row have the key of one of the subject's rows (its key columns)?"""
        names = batch.schema.names
        fields = self._table.row_key
        if not self._rows or self._table.mdt_partition is not None or not all(c in names for c in fields):
            return
        try:
            parts = [pc.cast(batch.column(names.index(c)), pa.string()) for c in fields]
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # a key type Arrow cannot render: per row, in Python
            if any(self._is_erased_row(row) for row in batch.select(list(fields)).to_pylist()):
                self._hit(f"{ROW} in columns {','.join(fields)}")
            return
        joined = parts[0] if len(parts) == 1 else pc.binary_join_element_wise(*parts, "\x1f")
        if pc.any(pc.is_in(joined, value_set=self._erased_set(joined.type))).as_py():
            self._hit(f"{ROW} in columns {','.join(fields)}")

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


def _whole(row: tuple[str | None, ...]) -> TypeGuard[tuple[str, ...]]:
    """Whether every part of a row's key is known: a key with a NULL part matches no stored key."""
    return None not in row


def _string_integers(strings: pa.Array) -> pa.Array | set[int]:
    """The values of a string array that are whole numbers, as int64 (or a set when beyond it)."""
    digits = pc.utf8_trim_whitespace(strings.filter(pc.match_substring_regex(strings, r"^\s*[+-]?\d+\s*$")))
    try:
        return digits.cast(pa.int64())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return {int(s) for s in digits.to_pylist()}
