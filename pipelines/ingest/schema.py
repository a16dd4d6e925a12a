"""The shape of each bronze table, following the source's columns as they change (contract section 6).

Bronze parses a row image as a map of column name to JSON text (`pipelines.ingest.parse`), so no column
the source adds is lost at parsing; this module decides, per batch and table, what the bronze
table's columns become:

- a column the table lacks is added at the end (Hudi's schema evolution on write: older rows
  read it as null), typed by the message's Kafka Connect `schema` when it carries one
  (`schemas.enable=true`, `CONNECT_TYPES`), else inferred from its JSON values (`infer_type`);
- a type the schema declares wider than the table's widens the column (`WIDENINGS`, the
  promotions Hudi applies on write); a narrower declared type of a column whose type was itself
  inferred is no change (the inference took the widest type);
- a column the source dropped stays, written null from then on (every write carries every column).

What cannot be applied compatibly, and is not accepted (`accepted_path`), is *incompatible*: a
declared type narrowed or changed to another kind, a contract column (section 1) missing from
an image. Those events go to the dead-letter store with a reason starting with
`SCHEMA_REASON`; only that table is held, every other goes on.

The table's columns, with the batch and time that introduced each, ride in every main commit's
metadata (`COLUMNS_META`): what a restarted stream starts from and what `lakehouse schema` shows.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from pipelines.errors import UnknownTable
from pipelines.lake import storage
from pipelines.lake.declaration import Declaration, TableDecl

COLUMNS_META = "_lakehouse.columns"
SCHEMA_REASON = "schema: "

# Type promotions Hudi applies on write (Avro schema resolution): the stored type can be read as the new.
WIDENINGS = {("int", "bigint"), ("int", "float"), ("int", "double"), ("bigint", "double"), ("float", "double")}


def infer_type(values: list[Any]) -> str | None:
    """The type of a column known only from JSON values (`schemas.enable=false`); None if all are null.

    Integers as bigint (the widest: no later widening needed), other numbers as double,
    booleans as boolean, strings and anything else as text. A column whose values in the
    batch are all null waits for a batch that shows one.
    """
    seen = {type(v) for v in values if v is not None}
    if not seen:
        return None
    if seen == {bool}:
        return "boolean"
    if seen <= {int}:
        return "bigint"
    if seen <= {int, float}:
        return "double"
    return "string"


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    declared: bool  # typed by a message's schema (True) or inferred from values (False)
    batch: int | None = None  # the ingest batch that introduced it (None: the table's creation)
    at: str | None = None  # when that batch committed it (UTC, ISO)
    widened: tuple[tuple[str, int, str], ...] = ()  # (from type, batch, at) of each widening
    convert: str = ""  # how the value's JSON text becomes `type` (pipelines.ingest.connect_types.convert)


@dataclass
class Shape:
    """A bronze table's columns, in table order (the declared ones first, then those added since).

    It carries its table's declaration (`decl`), the one the stream's query runs with: its key and the columns
    it fixes are the declaration's, and a stream that follows a changed declaration builds its shapes again.
    """

    decl: TableDecl
    columns: dict[str, Column] = field(default_factory=dict)

    @property
    def table(self) -> str:
        """The lake's name of the table (`orders`)."""
        return self.decl.name

    @classmethod
    def initial(cls, decl: TableDecl) -> Shape:
        """The declared columns, typed by their declared wire types (JSON text if none): before any message."""
        return cls(decl, {c: Column(c, decl.wire_type(c), True) for c in decl.columns})

    @classmethod
    def from_meta(cls, decl: TableDecl, text: str | None) -> Shape:
        """The shape recorded in a main commit's metadata; the declared one for tables older than the record."""
        shape = cls.initial(decl)
        for doc in json.loads(text) if text else []:
            shape.columns[doc["name"]] = Column(doc["name"], doc["type"], doc["declared"], doc.get("batch"),
                                                doc.get("at"), tuple(tuple(w) for w in doc.get("widened", ())),
                                                doc.get("convert", ""))
        return shape

    def to_meta(self) -> str:
        return json.dumps([{"name": c.name, "type": c.type, "declared": c.declared, "batch": c.batch, "at": c.at,
                            "widened": [list(w) for w in c.widened], "convert": c.convert}
                           for c in self.columns.values()])

    @property
    def key(self) -> tuple[str, ...]:
        """The declared key's columns."""
        return self.decl.key

    @property
    def declared_columns(self) -> tuple[str, ...]:
        """The columns the declaration fixes (contract sections 1 and 7): never dropped from an image."""
        return tuple(self.decl.columns)

    @property
    def extras(self) -> list[str]:
        """Columns beyond the declared ones, in the order they were added."""
        fixed = self.declared_columns
        return [c for c in self.columns if c not in fixed]

    @property
    def fixed(self) -> list[str]:
        """The declared columns (those a writer puts before the metadata), in declared order."""
        return [c for c in self.declared_columns if c in self.columns]

    def types(self) -> dict[str, str]:
        return {c.name: c.type for c in self.columns.values()}


@dataclass
class Decision:
    """What one batch's shapes mean for a table: its new shape and the shapes it cannot apply."""

    shape: Shape
    changed: bool = False
    # Declared shapes (tuple of (field, type, conversion)) and missing-column sets that are held, with the reason.
    held_declared: dict[tuple[tuple[str, str, str], ...], str] = field(default_factory=dict)
    held_missing: dict[tuple[str, ...], str] = field(default_factory=dict)


def _narrowing(table: str, column: str, stored: str, declared: str) -> str:
    return f"{SCHEMA_REASON}{table}.{column}: the source's type {declared} does not hold bronze's {stored}"


def _missing(table: str, columns: tuple[str, ...]) -> str:
    return (f"{SCHEMA_REASON}{table}.{','.join(columns)}: declared column missing from the source "
            "(dropped or renamed)")


@dataclass(frozen=True)
class _Applying:
    """What applying a batch's shapes to one table needs beside its columns: built once by `decide`."""

    table: str
    fixed: tuple[str, ...]  # the columns its declaration fixes (`Shape.declared_columns`)
    accepted: set[str]  # `table.column`s whose incompatible change an operator accepted
    batch_id: int
    at: str  # when, for the columns added or widened

    def ok(self, column: str) -> bool:
        return f"{self.table}.{column}" in self.accepted


def decide(shape: Shape, declared_shapes: list[list[tuple[str, str, str]]], missing_sets: list[list[str]],
           new_keys: dict[str, str | None], accepted: set[str], batch_id: int) -> Decision:
    """Apply a batch's shapes to `shape`.

    `declared_shapes`: the distinct `after` field lists (name, bronze type, conversion: see
    `connect_types.bronze_column`) the batch's wrapped messages declare, where they differ from
    what is known; `missing_sets`: declared columns
    absent from bare images; `new_keys`: columns of bare images the table lacks, with their
    inferred type (None: only nulls seen). `accepted` names `table.column`s an operator accepted
    (`lakehouse schema accept`): their change is applied as far as it can be (a narrowed type
    keeps the wider column, a missing contract column is null).
    """
    table = shape.table
    columns = dict(shape.columns)
    at = datetime.now(UTC).isoformat(timespec="seconds")
    decision = Decision(shape)
    applying = _Applying(table, shape.declared_columns, accepted, batch_id, at)
    for fields in sorted(declared_shapes):
        if reasons := _apply_declared(fields, columns, applying):
            decision.held_declared[tuple(fields)] = "; ".join(reasons)
    for missing in sorted(missing_sets):
        gone = tuple(c for c in missing if not applying.ok(c))
        if gone:
            decision.held_missing[tuple(missing)] = _missing(table, gone)
    for name, kind in sorted(new_keys.items()):
        if name not in columns and kind is not None:
            columns[name] = Column(name, kind, False, batch_id, at)
    if columns != shape.columns:
        decision.shape = Shape(shape.decl, columns)
        decision.changed = True
    return decision


def _apply_declared(fields: list[tuple[str, str, str]], columns: dict[str, Column], applying: _Applying) -> list[str]:
    """Step: one declared shape's fields applied to `columns` where they fit; why the shape is held where not."""
    table, fixed, ok, batch_id, at = applying.table, applying.fixed, applying.ok, applying.batch_id, applying.at
    names = {n for n, _, _ in fields}
    reasons = []
    gone = tuple(c for c in fixed if c not in names and not ok(c))
    if gone:
        reasons.append(_missing(table, gone))
    for name, want, conversion in fields:
        have = columns.get(name)
        if have is None:
            columns[name] = Column(name, want, True, batch_id, at, convert=conversion)
        elif have.type == want:
            if have.convert and conversion and have.convert != conversion:
                # Same type, another encoding (timestamp(3) altered to timestamp(6): Debezium's milliseconds
                # become microseconds): a value cannot say which it is, and a wrong guess corrupts it silently.
                if ok(name):
                    columns[name] = replace(have, convert=conversion)
                else:
                    reasons.append(f"{SCHEMA_REASON}{table}.{name}: the source's encoding of {want} changed "
                                   f"({have.convert} -> {conversion}): accept it to read new values that way")
            continue
        elif (have.type, want) in WIDENINGS and name not in fixed:
            columns[name] = replace(have, type=want, declared=True,
                                    widened=(*have.widened, (have.type, batch_id, at)))
        elif (want, have.type) in WIDENINGS and (not have.declared or ok(name)):
            continue  # the column is already wider: values fit
        elif not ok(name):
            reasons.append(_narrowing(table, name, have.type, want))
    return reasons


# --------------------------------------------------------------------------- accepted changes

def accepted_path(root: str) -> str:
    """Incompatible changes an operator accepted (`lakehouse schema accept`), beside the lake's tables."""
    return f"{root.rstrip('/')}/_schema/accepted.json"


def read_accepted(root: str) -> set[str]:
    """`table.column` names whose incompatible change is accepted."""
    path = accepted_path(root)
    if not storage.exists(path):
        return set()
    return set(json.loads(storage.read_text(path)))


def accept(root: str, table: str, column: str, decl: Declaration) -> set[str]:
    """Accept the incompatible change of `table.column`, a table of `decl`: the events held for it apply once
    replayed."""
    if table not in decl.names:
        raise UnknownTable(f"no declared table {table!r} (tables: {', '.join(decl.names)})")
    accepted = read_accepted(root) | {f"{table}.{column}"}
    storage.write_text(accepted_path(root), json.dumps(sorted(accepted)))
    return accepted


def held_column(reason: str) -> tuple[str, list[str]] | None:
    """(table, columns) named by a dead letter's schema reason; None for any other reason."""
    if not reason.startswith(SCHEMA_REASON):
        return None
    qualified = reason[len(SCHEMA_REASON):].split(":", 1)[0]
    table, _, columns = qualified.partition(".")
    return table, columns.split(",")
