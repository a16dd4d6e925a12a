"""What the scan looks for and reports: the subject, each finding, the report; the names and patterns
the decoders share.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

CUSTOMER = "customer id"
ORDER = "order id"
ROW = "erased row's key"  # the key of a row of a declared table that was the subject's
TEXT = "e-mail/name text"
DECODERS = ("parquet", "hudi-log", "hfile", "raw")

# Hudi's FSUtils.LOG_FILE_PATTERN (1.0.2): `.<fileId>_<instant>.log.<version>_<token>[.cdc]`,
# and `.archive` for the archived timeline of 0.x tables; anchored at the end, so that a
# marker left by a failed write (`<log file name>.marker.APPEND`) is not taken for a log.
LOG_NAME = re.compile(r"^\.(.+)_(.*)\.(log|archive)\.(\d+)(_((\d+)-(\d+)-(\d+))([.-]cdc)?)?$")
# Avro names: what a JSON object key must look like to be a field rather than a map key.
FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
INTEGER = re.compile(r"^\s*[+-]?\d+\s*$")
DIGITS = re.compile(r"\d+")
# A metadata-table record's `key` string in GenericData.toString's JSON (no escapes: FileScan._values).
MDT_KEY = re.compile(r'"key":\s*"([^"]*)"')
# The value of a data-table field that rules read ids at: a string, a scalar, or `[` (an array).
ID_FIELD = re.compile(r'"(?:id|customer_id|_hoodie_record_key|record_key)":\s*("[^"]*"|\[|[^,}\]\s]*)')
# Records per `GenericData.toString` call: one py4j round trip, a bounded JSON text.
CHUNK = 2000
# Rows per Arrow batch of a Parquet file: each batch costs a few kernel calls per column.
PARQUET_BATCH = 65536
LOG_MAGIC = b"#HUDI#"
DATA_BLOCKS = ("AVRO_DATA_BLOCK", "HFILE_DATA_BLOCK", "PARQUET_DATA_BLOCK", "CDC_DATA_BLOCK")


@dataclass(frozen=True)
class Subject:
    customer_ids: frozenset[int]
    order_ids: frozenset[int]  # the shop's orders (gold's state lists them)
    texts: frozenset[str]  # pii values (e-mails, names, ...); matched case-insensitively as substrings
    # Per declared table (the lake's name), the keys of the subject's rows: each key column's value as
    # text, in the declared order (pipelines.lake.erasure_registry.key_text). A table keyed by its subject
    # alone needs none: its key is a customer id.
    rows: dict[str, frozenset[tuple[str | None, ...]]] = field(default_factory=dict)


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
