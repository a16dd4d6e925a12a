"""Which table a file belongs to (its path names it), and the rules: which fields of that table hold a
customer id, an order id or text, and how its record keys name them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import cached_property

from pipelines.gdpr.scan.jvm import Jvm
from pipelines.gdpr.scan.model import CUSTOMER, FIELD_NAME, INTEGER, LOG_NAME, ORDER
from pipelines.lake.catalog import lake_catalog, lake_tables
from pipelines.lake.declaration import Declaration

# ----------------------------------------------------------------------------- tables


@dataclass(frozen=True)
class Table:
    name: str  # as lake_tables names it ("silver/customers"); "" outside tables
    key_fields: tuple[str, ...] = ()  # the data table's record key fields
    mdt_partition: str | None = None  # metadata-table partition of the file; None for the data table
    source: str | None = None  # the declared table whose rows it holds (bronze, change log, ledger, silver, ...)
    subject: str | None = None  # that table's subject column, if it has one
    row_key: tuple[str, ...] = ()  # that table's declared key: its rows' identity (a change log adds `_lsn`)

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


def find_tables(jvm: Jvm, files: list[str], decl: Declaration) -> dict[str, Table]:
    """Table roots (relative) -> table: those lake_tables names for `decl`, and any other with a hoodie.properties.

    The record key fields come from the table's hoodie.properties (what Hudi wrote), else
    from the writer options the pipeline uses.
    """
    sources = {t.name: t.source for t in lake_catalog(decl)}
    tables = {}
    for t in lake_tables(jvm.root, decl):
        source = decl.tables.get(sources.get(t.name) or "")
        tables[t.name] = Table(t.name, fields_of(t.options.get("hoodie.datasource.write.recordkey.field", "")),
                               source=source.name if source else None, subject=source.subject if source else None,
                               row_key=source.key if source else ())
    suffix = "/.hoodie/hoodie.properties"
    for rel in files:
        if not rel.endswith(suffix) or "/.hoodie/metadata/" in rel + "/":
            continue
        name = rel[: -len(suffix)]
        props = properties_of(jvm.read(rel).decode("utf-8", "replace"))
        keys = fields_of(props.get("hoodie.table.recordkey.fields", ""))
        known = tables.get(name, Table(name))
        tables[name] = replace(known, key_fields=keys or known.key_fields)
    return tables


def table_of(rel: str, tables: dict[str, Table]) -> Table:
    """The table whose root is the longest prefix of `rel`; its metadata table below `.hoodie/metadata/`."""
    best = None
    for name, table in tables.items():
        if rel.startswith(name + "/") and (best is None or len(name) > len(best.name)):
            best = table
    if best is None:
        return Table("")
    inner = rel[len(best.name) + 1:]
    if inner.startswith(".hoodie/metadata/"):
        parts = inner[len(".hoodie/metadata/"):].split("/")
        return replace(best, mdt_partition=parts[0] if len(parts) > 1 else "")
    return best


def fields_of(spec: str) -> tuple[str, ...]:
    return tuple(f.strip() for f in spec.split(",") if f.strip())


def properties_of(text: str) -> dict[str, str]:
    """Java properties as Hudi writes hoodie.properties (key=value lines, `\\` escapes)."""
    props = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "!")) and "=" in line:
            key, _, value = line.partition("=")
            props[key.strip()] = re.sub(r"\\(.)", r"\1", value.strip())
    return props


# ----------------------------------------------------------------------------- the rules


def decoder_of(name: str) -> str:
    if name.endswith(".crc"):
        return "raw"
    if name.endswith(".parquet"):
        return "parquet"
    if name.endswith(".hfile"):
        return "hfile"
    if LOG_NAME.match(name):
        return "hudi-log"
    if name.endswith(".orc"):
        return "orc"  # a Hudi base file format this scanner has no decoder for
    return "raw"


def as_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and INTEGER.match(value):
        return int(value)
    return None


def id_kinds(table: Table, fields: tuple[str, ...]) -> tuple[str, ...]:
    """Whose ids a value at field path `fields` of a data table's record is.

    In a declared table's lake tables, its `subject` column (top level, or a change-feed image's);
    elsewhere (gold, dead letters, unknown tables), `customer_id` anywhere. `id` of a customers or
    orders table; `id` of the structs in an `orders` array (gold/_customer_orders). A declared
    table without a subject holds nobody's ids. Metadata-table records have no id columns.
    """
    if table.mdt_partition is not None or not fields:
        return ()
    if table.source is not None:
        if len(fields) == 1 and fields[0] == table.subject:
            return (CUSTOMER,)
    elif fields[-1] == "customer_id":
        return (CUSTOMER,)
    if fields[-1] == "id":
        if len(fields) == 1:
            return (table.entity,) if table.entity else ()
        if fields[-2] == "orders":
            return (ORDER,)
    return ()


def key_parts(table: Table, key: str) -> list[tuple[str, str]]:
    """(field, value) of a Hudi record key: `42`, or `id:42,_lsn:123` (ComplexKeyGenerator)."""
    if ":" in key:
        parts = [p.partition(":") for p in key.split(",")]
        known = set(table.key_fields)
        if all(sep and (f in known if known else FIELD_NAME.match(f)) for f, sep, _ in parts):
            return [(f, v) for f, _, v in parts]
    return [(table.key_fields[0], key)] if len(table.key_fields) == 1 else []


def secondary_index_record_key(key: str) -> str | None:
    """The record key in a secondary-index entry's key, `<secondary key>$<record key>` (`\\` escapes)."""
    for i in range(len(key) - 1, -1, -1):
        if key[i] == "$" and (i == 0 or key[i - 1] != "\\"):
            return re.sub(r"\\([\\$])", r"\1", key[i + 1:])
    return None
