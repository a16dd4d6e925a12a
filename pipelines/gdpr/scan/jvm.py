"""The scan's JVM side: Hudi's own readers of log files and HFiles, called through py4j in batches.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from urllib.parse import urlparse

from py4j.java_gateway import JavaObject
from py4j.protocol import Py4JJavaError
from pyspark.sql import SparkSession

from pipelines.errors import StorageError
from pipelines.gdpr.scan.model import CHUNK, DATA_BLOCKS, LOG_MAGIC, Chunk
from pipelines.lake import storage
from pipelines.lake.jvm import jvm_of

# ----------------------------------------------------------------------------- the JVM side


class Jvm:
    """Hadoop listing and Hudi's readers through py4j, with per-block (not per-record) round trips."""

    def __init__(self, spark: SparkSession, root: str) -> None:
        sc = spark.sparkContext
        self._jvm = jvm = jvm_of(sc)
        hconf = sc._jsc.hadoopConfiguration()
        hudi = jvm.org.apache.hudi
        self._hudi = hudi
        path = jvm.org.apache.hadoop.fs.Path(root)
        fs = path.getFileSystem(hconf)
        if not fs.exists(path):
            raise StorageError(f"lake root {root} does not exist")
        self.root = fs.makeQualified(path).toString().rstrip("/")
        parsed = urlparse(self.root)
        # What pipelines.lake.storage lists and reads: the local path, or the store's URI.
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
        for start in range(0, size, CHUNK):
            end = min(size, start + CHUNK)
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
        schema = first_block_schema(data, self.schema_ordinal) if log_file.isCDC() else None
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
                    if kind in DATA_BLOCKS:
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


def first_block_schema(data: bytes, ordinal: int) -> str | None:
    """Writer schema in the first block header of a log file (format v1: magic, size, version, type, header)."""
    if not data.startswith(LOG_MAGIC) or len(data) < 26:
        return None
    pos = len(LOG_MAGIC) + 8 + 4 + 4
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
