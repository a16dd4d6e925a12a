"""A Hudi table's timeline and file layout read from its files alone: Python and pyarrow.fs, no JVM, no Hudi library.

Airflow's workers decide with it which tables have work before any Spark job starts
(`pipelines.services.due`): on EMR they have neither Spark nor Hudi, and a decision must cost a
few listings and small reads per table, not a JVM. Hudi 1.x names each timeline file after its
instant, so a listing says which instants exist, what each did and when it completed:

    <requested>.<action>.requested     <requested>.<action>.inflight (a copy-on-write commit's: <requested>.inflight)
    <requested>_<completed>.<action>   (a compaction completes as `commit`, a clustering as `replacecommit`)

and data files carry the instant that wrote them (`<file id>_<write token>_<instant>.parquet`, a log
file `.<file id>_<instant>.log.<version>_<write token>`). The few facts only a metadata file holds
(the file groups a replace commit replaced, what the last clean kept) are read from Hudi's Avro,
which it writes uncompressed (`read_avro`).
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pyarrow import fs as pafs

from pipelines.errors import StorageError
from pipelines.lake import storage

INSTANT_FILE = re.compile(r"^(?P<requested>\d+)(?:_(?P<completed>\d+)\.(?P<done>[a-z]+)"
                          r"|\.(?:(?P<action>[a-z]+)\.)?(?P<state>requested|inflight))$")
# `<file id>_<write token>_<instant>.parquet` and `.<file id>_<instant>.log.<version>_<write token>`.
_BASE_FILE = re.compile(r"^(?P<file_id>[^_.][^_]*)_[^_]+_(?P<instant>\d+)\.parquet$")
_LOG_FILE = re.compile(r"^\.(?P<file_id>[^_]+)_(?P<instant>\d+)\.log\.\d+_[\d-]+$")
# Hudi's completed commits timeline: what readers read, and what retention counts.
COMMIT_ACTIONS = ("commit", "deltacommit", "replacecommit")
# Instant times: the timeline's time zone (LOCAL, Hudi's default, which the project keeps), to the millisecond.
INSTANT_FORMAT = "%Y%m%d%H%M%S%f"
# A writer touches its heartbeat file every hoodie.client.heartbeat.interval_in_ms (60 s) and
# is taken for dead after hoodie.client.heartbeat.tolerable.misses (2) more: Hudi's defaults.
HEARTBEAT_EXPIRY_MS = 60_000 * (2 + 1)


@dataclass(frozen=True)
class Instant:
    requested: str
    action: str  # what was requested: deltacommit, commit, compaction, clustering, replacecommit, clean, rollback, ...
    completed: str | None = None  # completion time; None while requested or inflight
    completed_as: str | None = None  # the completed file's action (`commit` for a compaction)

    @property
    def is_commit(self) -> bool:
        """A completed instant of Hudi's commits timeline (compactions and clusterings included)."""
        return self.completed_as in COMMIT_ACTIONS

    @property
    def changes_data(self) -> bool:
        """A completed commit that changed rows: not a compaction or clustering, which rewrite the same rows."""
        return self.is_commit and self.action not in ("compaction", "clustering")


def instant_time(moment: datetime) -> str:
    """A local time as Hudi spells an instant (milliseconds)."""
    return moment.strftime(INSTANT_FORMAT)[:17]


def instant_datetime(instant: str) -> datetime:
    return datetime.strptime(instant[:17].ljust(17, "0"), INSTANT_FORMAT)


def timeline(path: str) -> list[Instant]:
    """The active timeline of the table at `path`, oldest first; [] when it has none (no table yet)."""
    found: dict[str, dict[str, str | None]] = {}
    for name in storage.list_dir(f"{path.rstrip('/')}/.hoodie/timeline"):
        if not (m := INSTANT_FILE.match(name)):
            continue
        seen = found.setdefault(m["requested"], {"action": None, "completed": None, "completed_as": None})
        if m["completed"]:
            seen["completed"], seen["completed_as"] = m["completed"], m["done"]
        elif m["state"] == "requested" or seen["action"] is None:
            seen["action"] = m["action"] or "commit"  # `<requested>.inflight`: a copy-on-write commit's
    return [Instant(requested, seen["action"] or seen["completed_as"] or "commit", seen["completed"],
                    seen["completed_as"]) for requested, seen in sorted(found.items())]


def instant_metadata(path: str, instant: Instant) -> dict[str, Any]:
    """The metadata of a completed instant (commit, replace commit, clean), as Hudi's Avro record holds it;
    StorageError naming the file when it is not the Avro file it should be."""
    name = f"{instant.requested}_{instant.completed}.{instant.completed_as}"
    file = f"{path.rstrip('/')}/.hoodie/timeline/{name}"
    try:
        (record,) = read_avro(storage.read_bytes(file))
    except StorageError as exc:
        raise StorageError(f"{file}: {exc}") from exc
    return record


@dataclass(frozen=True)
class DataFile:
    partition: str  # "" for a table without partitions
    name: str
    file_id: str
    instant: str  # the instant that wrote it
    size: int
    log: bool


def data_files(path: str) -> list[DataFile]:
    """The base and log files of the table at `path`: in its folder and, when it is partitioned, in the partitions'
    folders (one level: `<column>=<value>`, as every partitioned table of the lake is written)."""
    fs, base = storage.filesystem(path)

    def listed(folder: str, partition: str) -> list[DataFile]:
        files = []
        for info in fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True)):
            if info.type == pafs.FileType.Directory and not partition and "=" in info.base_name:
                files += listed(info.path, info.base_name)
            elif info.type == pafs.FileType.File and (m := _BASE_FILE.match(info.base_name) or
                                                      _LOG_FILE.match(info.base_name)):
                files.append(DataFile(partition, info.base_name, m["file_id"], m["instant"], info.size or 0,
                                      info.base_name.startswith(".")))
        return files

    return listed(base, "")


# --------------------------------------------------------------------------- Avro, as Hudi writes its metadata

def avro_long(data: bytes, at: int) -> tuple[int, int]:
    """An Avro long (zig-zag varint) at `at`: (value, where the next item starts). IndexError past the end."""
    shift = result = 0
    while True:
        byte = data[at]
        at += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), at


class _Reader:
    """Avro's binary encoding of one schema (the subset Hudi's metadata records use, named types included)."""

    def __init__(self, data: bytes, at: int = 0) -> None:
        self.data, self.at = data, at
        self.named: dict[str, Any] = {}

    def long(self) -> int:
        value, self.at = avro_long(self.data, self.at)
        return value

    def raw(self, size: int) -> bytes:
        chunk = self.data[self.at:self.at + size]
        if len(chunk) < size:
            raise StorageError("Avro data cut short")
        self.at += size
        return chunk

    def blocks(self) -> Iterator[int]:  # an array's or map's items: blocks of a count (negative: then a size)
        while (count := self.long()) != 0:
            if count < 0:
                count = -count
                self.long()
            yield from range(count)

    def register(self, schema: Any, namespace: str | None) -> None:
        if isinstance(schema, list):
            for branch in schema:
                self.register(branch, namespace)
        elif isinstance(schema, dict):
            kind = schema["type"]
            if kind in ("record", "enum", "fixed"):
                space = schema.get("namespace", namespace)
                full = schema["name"] if "." in schema["name"] or not space else f"{space}.{schema['name']}"
                self.named[full] = self.named[schema["name"].rsplit(".", 1)[-1]] = (schema, space)
                namespace = space
            for field in schema.get("fields", ()):
                self.register(field["type"], namespace)
            for key in ("items", "values"):
                if key in schema:
                    self.register(schema[key], namespace)
            if isinstance(kind, dict | list):
                self.register(kind, namespace)

    def read(self, schema: Any) -> Any:
        if isinstance(schema, list):
            return self.read(schema[self.long()])
        if isinstance(schema, str) and schema in self.named:
            return self.read(self.named[schema][0])
        kind = schema["type"] if isinstance(schema, dict) else schema
        if isinstance(kind, dict | list):
            return self.read(kind)
        if kind == "null":
            return None
        if kind == "boolean":
            return self.raw(1) != b"\x00"
        if kind in ("int", "long"):
            return self.long()
        if kind == "float":
            return struct.unpack("<f", self.raw(4))[0]
        if kind == "double":
            return struct.unpack("<d", self.raw(8))[0]
        if kind == "bytes":
            return self.raw(self.long())
        if kind == "string":
            return self.raw(self.long()).decode()
        if kind == "fixed":
            return self.raw(schema["size"])
        if kind == "enum":
            return schema["symbols"][self.long()]
        if kind == "array":
            return [self.read(schema["items"]) for _ in self.blocks()]
        if kind == "map":
            return {self.read("string"): self.read(schema["values"]) for _ in self.blocks()}
        if kind == "record":
            return {f["name"]: self.read(f["type"]) for f in schema["fields"]}
        raise StorageError(f"Avro type {kind!r} is not read here")


def read_avro(data: bytes) -> list[Any]:
    """The records of an uncompressed Avro object container file (Hudi's commit, replace and clean metadata)."""
    if not data.startswith(b"Obj\x01"):
        raise StorageError("not an Avro object container file")
    reader = _Reader(data, 4)
    header = {reader.read("string"): reader.read("bytes") for _ in reader.blocks()}
    if header.get("avro.codec", b"null") != b"null":
        raise StorageError(f"Avro codec {header['avro.codec'].decode()!r}: only uncompressed files are read here")
    schema = json.loads(header["avro.schema"])
    reader.register(schema, None)
    sync = reader.raw(16)
    records = []
    while reader.at < len(data):
        count = reader.long()
        reader.long()  # the block's size in bytes
        records += [reader.read(schema) for _ in range(count)]
        if reader.raw(16) != sync:
            raise StorageError("Avro block not followed by the file's sync marker")
    return records
