"""The declared tables (contract section 7): which source tables the lake captures and what it does with them.

A team onboards a table by declaring it in a TOML file named by `LAKEHOUSE_TABLES`, never by writing
code; unset, the project's own declaration of the shop (`pipelines/lake/shop_tables.toml`), which spells
the contract's sections 1 and 3 the same way. Each command, DAG task and test reads it once where it
starts (pipelines.runtime.lake.Lake) and hands it down: a running stream keeps the one it started
with until it moves to a changed file between queries.

A declaration is checked whole when it is read, before anything is written: an unknown field or
rule, a rule or cleaning step on a column the table does not declare, two tables with one lake
name or one source table. The error names the file, the table and the field. What only the source
can tell (a table or column it lacks, a key that is not its primary key) is checked against
PostgreSQL by `lakehouse dev source sync` (`lakehouse_dev.pg_source`), and against bronze's
columns by the etl before it writes (`missing_columns`).

Beyond the contract's fields, a table may say (the project's own, all optional; docs/tables.md):
`columns` with wire types (only with `typed = false`: topics without a Connect schema;
silver then carries exactly those), `silver_extra` (bronze columns beyond them that silver carries,
off by default: an added column is unvalidated and perhaps personal data), `typed = false` (bronze
keeps the wire form, as the shop's does), rules with `cast = "<Spark type>"` (the value converts
exactly, silver holds it converted) or with `not_null = true` beside their check (a NULL fails them
too: the shop's rules, so that an accepted dropped column's NULLs stay in quarantine), `name` on a
rule (quarantine's `failed_rule`, default `<column>_<kind>`), and `[[tables.<name>.derive]]`
`column`, `date_of`: a silver column holding a timestamp's UTC date. For bronze main, `buckets` (its bucket
index's file groups: fixed when the table is created, `pipelines.lake.buckets` refuses a changed one) and
`compact_every` (delta commits between compaction plans), where a table needs other than bronze.toml's.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field, replace
from enum import StrEnum
from importlib import resources
from pathlib import Path
from typing import Any

from pipelines.errors import DeclarationError, UnknownTable

DECLARATION_VARIABLE = "LAKEHOUSE_TABLES"
SHOP = "shop_tables.toml"  # the project's own declaration, beside this module
# The declaration the EMR bundle carries (pipelines/deploy/package.py), inside its zip: there is no
# LAKEHOUSE_TABLES file on the cluster. Never in the source tree.
BUNDLED = "tables.toml"


class RuleKind(StrEnum):
    """What a silver rule checks: its field in the declaration (`one_of = [...]`, `pattern = "..."`, ...)."""

    ONE_OF = "one_of"
    PATTERN = "pattern"
    MIN = "min"
    MAX = "max"
    NOT_NULL = "not_null"
    CAST = "cast"


RULE_KINDS = tuple(k.value for k in RuleKind)  # the declaration's words, in its messages' order
CLEAN_STEPS = ("trim", "upper", "lower")
WIRE_TYPES = ("bigint", "double", "boolean", "string")
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_SOURCE = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*\.[A-Za-z_][A-Za-z0-9_$]*$")
_TABLE_FIELDS = {"source", "key", "subject", "pii", "rules", "clean", "derive", "columns", "typed", "silver_extra",
                 "freshness_seconds", "buckets", "compact_every"}
# The bounds of the per-table Hudi options: a bucket is about 1-2 GB of table (bronze.toml), and a compaction
# planned less often than every 1,000 delta commits leaves readers merging that many log files.
_BOUNDS = {"buckets": (1, 4096), "compact_every": (1, 1000)}
# How stale bronze/<table> may get behind its source when a table declares no target: the stream
# commits a table's changes when they are due by it, not every batch (pipelines.ingest.cadence).
DEFAULT_FRESHNESS_SECONDS = 15.0


@dataclass(frozen=True)
class Rule:
    """One of silver's checks: a live row that fails it goes to quarantine with `name`."""

    column: str
    kind: RuleKind
    value: Any  # the allowed values, the pattern, the bound, the type (None for not_null)
    name: str
    not_null: bool = False  # the rule fails a NULL (always true of a `not_null` rule; the others pass one unless set)


@dataclass(frozen=True)
class Clean:
    """A cleaning step of one column, applied before the rules: trim first, then upper or lower."""

    column: str
    trim: bool = False
    upper: bool = False
    lower: bool = False


@dataclass(frozen=True)
class Derive:
    """A silver column made from another: `date_of` a timestamp column, as its UTC date."""

    column: str
    date_of: str


@dataclass(frozen=True)
class TableDecl:
    """A declared table: the lake's name for it, its source table and key, and what silver and the erasure do."""

    name: str
    schema: str
    table: str
    key: tuple[str, ...]
    subject: str | None = None
    pii: tuple[str, ...] = ()
    rules: tuple[Rule, ...] = ()
    clean: tuple[Clean, ...] = ()
    derive: tuple[Derive, ...] = ()
    columns: dict[str, str] = field(default_factory=dict)  # declared columns -> wire type (may be empty)
    typed: bool = True
    silver_extra: tuple[str, ...] = ()
    freshness_seconds: float = DEFAULT_FRESHNESS_SECONDS  # bronze's target: a change visible within this
    buckets: int | None = None  # bronze main's bucket count (None: bronze.toml's)
    compact_every: int | None = None  # bronze main's delta commits between compaction plans (None: bronze.toml's)
    # The file that declares it, for errors found later (a rule on a column bronze lacks); not part of its value.
    declared_in: str = field(default="the declaration", compare=False)

    @property
    def source(self) -> str:
        return f"{self.schema}.{self.table}"

    def wire_type(self, column: str) -> str:
        """The JSON type of a declared column's values (a string for any other)."""
        return self.columns.get(column, "string")


@dataclass(frozen=True)
class Declaration:
    """The declared tables, in the file's order, and the topics they arrive on."""

    path: str
    topic_prefix: str
    tables: dict[str, TableDecl]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.tables)

    def table(self, name: str) -> TableDecl:
        try:
            return self.tables[name]
        except KeyError:
            raise UnknownTable(f"no declared table {name!r} in {self.path} (declared: {', '.join(self.tables)})") \
                from None

    def topic(self, name: str) -> str:
        """Debezium's topic of a declared table: `<topic_prefix>.<schema>.<table>`."""
        t = self.table(name)
        return f"{self.topic_prefix}.{t.schema}.{t.table}"

    def topics(self) -> dict[str, str]:
        """Topic -> the lake's name of its table."""
        return {self.topic(n): n for n in self.tables}

    def table_of_topic(self, topic: str) -> str:
        """The declared table a topic carries; UnknownTable naming the declared topics otherwise."""
        try:
            return self.topics()[topic]
        except KeyError:
            raise UnknownTable(f"topic {topic!r} is no declared table's ({', '.join(self.topics())}; {self.path})") \
                from None


# --------------------------------------------------------------------------- reading

def packaged() -> str:
    """The declaration that ships with the code: the bundle's on EMR (`lakehouse package`), else the shop's."""
    bundled = resources.files(__package__).joinpath(BUNDLED)
    return str(bundled if bundled.is_file() else resources.files(__package__).joinpath(SHOP))


def load(path: str | Path) -> Declaration:
    """Read and check a declaration file; DeclarationError naming the file, table and field if it is wrong."""
    where = str(path)
    packaged = {str(resources.files(__package__).joinpath(n)): n for n in (SHOP, BUNDLED)}
    try:  # a packaged file may live inside a zip (EMR's --py-files): read it as a resource
        text = Path(path).read_text() if Path(path).is_file() else \
            resources.files(__package__).joinpath(packaged[where]).read_text() if where in packaged else None
    except OSError as e:
        raise DeclarationError(f"{where}: cannot be read ({e})") from e
    if text is None:
        raise DeclarationError(f"{where}: no such declaration file ({DECLARATION_VARIABLE} names it)")
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:  # two tables of one name end up here: TOML forbids it
        raise DeclarationError(f"{where}: not valid TOML: {e}") from e
    return parse(doc, where)


def parse(doc: dict[str, Any], where: str = "<declaration>") -> Declaration:
    """A declaration from its TOML document (`load` without the file)."""
    unknown = set(doc) - {"source", "tables"}
    if unknown:
        raise DeclarationError(f"{where}: unknown top-level field(s) {sorted(unknown)} (known: source, tables)")
    source = doc.get("source")
    if not isinstance(source, dict) or not isinstance(source.get("topic_prefix"), str) \
            or not source["topic_prefix"]:
        raise DeclarationError(f"{where}: [source] topic_prefix is required (Debezium's topic.prefix)")
    if set(source) - {"topic_prefix"}:
        raise DeclarationError(f"{where}: [source]: unknown field(s) {sorted(set(source) - {'topic_prefix'})}")
    tables = doc.get("tables")
    if not isinstance(tables, dict) or not tables:
        raise DeclarationError(f"{where}: no [tables.<name>] declared")
    parsed: dict[str, TableDecl] = {}
    sources: dict[str, str] = {}
    for name, spec in tables.items():
        t = _table(name, spec, f"{where}: tables.{name}")
        if t.source in sources:
            raise DeclarationError(f"{where}: tables.{name}: source {t.source!r} is already declared as "
                                   f"tables.{sources[t.source]}")
        sources[t.source] = name
        parsed[name] = replace(t, declared_in=where)
    return Declaration(where, source["topic_prefix"], parsed)


def _table(name: str, spec: Any, at: str) -> TableDecl:
    """One `[tables.<name>]` checked, field by field in the order a reader fixes them; the first wrong one raises."""
    source, key, columns, typed = _table_fields(name, spec, at)
    subject, pii = _table_subject(spec, at, key, columns)
    cleans, rules, derives, extra = _table_silver(spec, at, key, columns)
    schema, table = source.split(".", 1)
    freshness = spec.get("freshness_seconds", DEFAULT_FRESHNESS_SECONDS)
    if isinstance(freshness, bool) or not isinstance(freshness, int | float) or not 1 <= freshness <= 86400:
        raise DeclarationError(f"{at}.freshness_seconds: must be a number of seconds from 1 to 86400 "
                               f"(got {freshness!r})")
    buckets, compact_every = (_bounded(spec, f, at) for f in ("buckets", "compact_every"))
    return TableDecl(name, schema, table, key, subject, pii, rules, cleans, derives, dict(columns), typed,
                     tuple(c for c in extra if c not in columns), float(freshness), buckets, compact_every)


def _bounded(spec: dict[str, Any], name: str, at: str) -> int | None:
    """A per-table Hudi option (`_BOUNDS`): a whole number within its bounds, or None when not declared."""
    value = spec.get(name)
    low, high = _BOUNDS[name]
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high):
        raise DeclarationError(f"{at}.{name}: must be a whole number from {low} to {high} (got {value!r})")
    return value


def _table_fields(name: str, spec: Any, at: str) -> tuple[str, tuple[str, ...], dict[str, str], bool]:
    """Step: the table's name and fields, its source, key, columns and typing: what every later check reads."""
    if not _NAME.match(name):
        raise DeclarationError(f"{at}: the lake's name must be lower-case letters, digits and '_', starting "
                               "with a letter (it names bronze/<name>, silver/<name>)")
    if not isinstance(spec, dict):
        raise DeclarationError(f"{at}: must be a table ([tables.{name}])")
    unknown = set(spec) - _TABLE_FIELDS
    if unknown:
        raise DeclarationError(f"{at}: unknown field(s) {sorted(unknown)} (known: {', '.join(sorted(_TABLE_FIELDS))})")
    source = spec.get("source")
    if not isinstance(source, str) or not _SOURCE.match(source):
        raise DeclarationError(f"{at}.source: must be \"schema.table\" (got {source!r})")
    key = _names(spec.get("key"), f"{at}.key", required=True)
    if len(set(key)) != len(key):
        raise DeclarationError(f"{at}.key: a column is named twice ({key})")
    columns = spec.get("columns", {})
    if not isinstance(columns, dict) or any(not isinstance(v, str) or v not in WIRE_TYPES for v in columns.values()):
        raise DeclarationError(f"{at}.columns: must map each column to its wire type, one of {WIRE_TYPES}")
    typed = spec.get("typed", True)
    if not isinstance(typed, bool):
        raise DeclarationError(f"{at}.typed: must be true or false")
    if columns and typed:
        # With a Connect schema, each message says its columns' types; wire types would contradict them.
        raise DeclarationError(f"{at}.columns: wire types are for topics without a Connect schema: add "
                               "`typed = false`, or leave `columns` out (the messages' schema types the columns)")
    return source, key, columns, typed


def _known(columns: dict[str, str], column: str, where: str) -> None:
    """A column a field names must be a declared one, when the table declares its columns."""
    if columns and column not in columns:
        raise DeclarationError(f"{where}: column {column!r} is not among the table's declared columns "
                               f"({', '.join(columns)})")


def _table_subject(spec: dict[str, Any], at: str, key: tuple[str, ...],
                   columns: dict[str, str]) -> tuple[str | None, tuple[str, ...]]:
    """Step: whose rows they are (`subject`) and their personal data (`pii`), and that the key's columns exist."""
    subject = spec.get("subject")
    if subject is not None and not isinstance(subject, str):
        raise DeclarationError(f"{at}.subject: must be a column name")
    pii = _names(spec.get("pii", []), f"{at}.pii")
    if pii and subject is None:
        raise DeclarationError(f"{at}.pii: personal data needs a `subject` column saying whose it is")
    for c in key:
        _known(columns, c, f"{at}.key")
    if subject:
        _known(columns, subject, f"{at}.subject")
    for c in pii:
        _known(columns, c, f"{at}.pii")
        if c in key:
            raise DeclarationError(f"{at}.pii: {c!r} is a key column: an erasure removes the row, it does not blank "
                                   "its key")
    return subject, pii


def _table_silver(spec: dict[str, Any], at: str, key: tuple[str, ...], columns: dict[str, str]
                  ) -> tuple[tuple[Clean, ...], tuple[Rule, ...], tuple[Derive, ...], tuple[str, ...]]:
    """Step: what silver does with the table's rows (cleans, rules, derived and extra columns), each on a column the
    table has."""
    cleans = tuple(_clean(s, f"{at}.clean[{i}]") for i, s in enumerate(_list(spec.get("clean"), f"{at}.clean")))
    rules = tuple(_rule(s, f"{at}.rules[{i}]") for i, s in enumerate(_list(spec.get("rules"), f"{at}.rules")))
    derives = tuple(_derive(s, f"{at}.derive[{i}]") for i, s in enumerate(_list(spec.get("derive"), f"{at}.derive")))
    for i, clean in enumerate(cleans):
        _known(columns, clean.column, f"{at}.clean[{i}].column")
    for i, r in enumerate(rules):
        _known(columns, r.column, f"{at}.rules[{i}].column")
    for i, d in enumerate(derives):
        _known(columns, d.date_of, f"{at}.derive[{i}].date_of")
        if d.column in columns or d.column in key or d.column.startswith("_"):
            raise DeclarationError(f"{at}.derive[{i}].column: {d.column!r} is a source column or starts with '_'")
    extra = _names(spec.get("silver_extra", []), f"{at}.silver_extra")
    if extra and not columns:
        raise DeclarationError(f"{at}.silver_extra: only with `columns` (without them silver carries every column)")
    if any(c.startswith("_") or c in {d.column for d in derives} for c in extra):
        raise DeclarationError(f"{at}.silver_extra: names starting with '_' and derived columns are silver's own")
    names = [r.name for r in rules]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise DeclarationError(f"{at}.rules: two rules share a name ({twice}): quarantine could not say which failed")
    return cleans, rules, derives, extra


def _list(value: Any, at: str) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise DeclarationError(f"{at}: must be an array of tables ([[...]])")
    return value


def _names(value: Any, at: str, *, required: bool = False) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value) or (required and not value):
        raise DeclarationError(f"{at}: must be a{' non-empty' if required else ''} list of column names")
    return tuple(value)


def _clean(spec: dict[str, Any], at: str) -> Clean:
    unknown = set(spec) - {"column", *CLEAN_STEPS}
    if unknown:
        raise DeclarationError(f"{at}: unknown field(s) {sorted(unknown)} (cleaning steps: {', '.join(CLEAN_STEPS)})")
    column = spec.get("column")
    if not isinstance(column, str) or not column:
        raise DeclarationError(f"{at}.column: required")
    steps = {s: spec.get(s, False) for s in CLEAN_STEPS}
    if any(not isinstance(v, bool) for v in steps.values()):
        raise DeclarationError(f"{at}: {', '.join(CLEAN_STEPS)} take true or false")
    if not any(steps.values()):
        raise DeclarationError(f"{at}: no step (set one of {', '.join(CLEAN_STEPS)} to true)")
    if steps["upper"] and steps["lower"]:
        raise DeclarationError(f"{at}: upper and lower together")
    return Clean(column, **steps)


def _rule(spec: dict[str, Any], at: str) -> Rule:
    unknown = set(spec) - {"column", "name", *RULE_KINDS}
    if unknown:
        raise DeclarationError(f"{at}: unknown field(s) {sorted(unknown)} (rules: {', '.join(RULE_KINDS)})")
    column = spec.get("column")
    if not isinstance(column, str) or not column:
        raise DeclarationError(f"{at}.column: required")
    kinds = [k for k in RULE_KINDS if k in spec]
    refuses_null = len(kinds) == 2 and "not_null" in kinds  # another check that fails a NULL too
    if refuses_null:
        if spec["not_null"] is not True:
            raise DeclarationError(f"{at}.not_null: must be true")
        kinds.remove("not_null")
    if len(kinds) != 1:
        raise DeclarationError(f"{at}: exactly one of {', '.join(RULE_KINDS)} per rule, `not_null = true` "
                               f"beside another to refuse NULLs too (got {kinds or 'none'})")
    kind, value = kinds[0], spec[kinds[0]]
    if kind == "one_of" and (not isinstance(value, list) or not value
                             or not all(isinstance(v, str | int | float) and not isinstance(v, bool) for v in value)):
        raise DeclarationError(f"{at}.one_of: must be a non-empty list of strings or numbers")
    if kind == "pattern" and (not isinstance(value, str) or not value):
        raise DeclarationError(f"{at}.pattern: must be a (Java) regular expression")
    if kind in ("min", "max") and (isinstance(value, bool) or not isinstance(value, int | float | str)):
        raise DeclarationError(f"{at}.{kind}: must be a number (or a date or timestamp as text)")
    if kind == "not_null":
        if value is not True:
            raise DeclarationError(f"{at}.not_null: must be true")
        value = None
    if kind == "cast" and (not isinstance(value, str) or not re.match(r"^(decimal\(\d+,\s*\d+\)|timestamp|date|"
                                                                       r"bigint|int|double|boolean)$", value)):
        raise DeclarationError(f"{at}.cast: one of decimal(p,s), timestamp, date, bigint, int, double, boolean "
                               f"(got {value!r})")
    name = spec.get("name", f"{column}_{kind}")
    if not isinstance(name, str) or not name:
        raise DeclarationError(f"{at}.name: must be text")
    return Rule(column, RuleKind(kind), value, name, refuses_null or kind == "not_null")


def _derive(spec: dict[str, Any], at: str) -> Derive:
    if set(spec) != {"column", "date_of"} or not all(isinstance(v, str) and v for v in spec.values()):
        raise DeclarationError(f"{at}: a derived column takes exactly `column` and `date_of` (a timestamp column)")
    return Derive(spec["column"], spec["date_of"])


def missing_columns(table: TableDecl, have: set[str]) -> list[str]:
    """Columns the declaration's key, subject, pii, cleaning, rules or derivations name that `have` lacks,
    each as `<field>: <column>`."""
    named = [("key", c) for c in table.key] + [("subject", table.subject)] * bool(table.subject) + \
        [("pii", c) for c in table.pii] + [(f"clean[{i}].column", c.column) for i, c in enumerate(table.clean)] + \
        [(f"rules[{i}].column", r.column) for i, r in enumerate(table.rules)] + \
        [(f"derive[{i}].date_of", d.date_of) for i, d in enumerate(table.derive)]
    return [f"{f}: {c}" for f, c in named if c not in have]
