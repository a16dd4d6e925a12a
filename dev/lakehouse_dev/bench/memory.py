"""A running JVM's memory, read from outside without stopping it: resident set and heap in use.

The soak (`lakehouse dev bench soak`) samples the stream driver's JVM for half an hour: whether its
memory is flat or grows is one of its figures. Both readings cost a file read, no JVM of their own
(`jcmd` and `jstat` are JVMs that attach: a second of CPU each on the 2 cores being measured):

- resident memory: the kernel's `VmRSS` (/proc/<pid>/status);
- heap in use: HotSpot's performance counters, which every JVM keeps in a memory-mapped file,
  /tmp/hsperfdata_<user>/<pid> (`-XX:+UsePerfData`, the default), the file `jstat` reads: the
  `used` counter of every space of every generation (`sun.gc.generation.<g>.space.<s>.used`),
  the old generation's apart (generation 1: what survives collections, where a leak shows).

Neither tells the live set: under G1 the old generation holds garbage until a mixed collection
takes it, so its use swings by gigabytes. `live_set` reads it the one sure way, a full collection
and a count of what survived by class (`jcmd <pid> GC.class_histogram`): a pause of a second or two
of the measured JVM and a JVM start for `jcmd`, so it is taken every few minutes, not seconds. Two
such readings of one JVM also say which classes grew.
"""

from __future__ import annotations

import pwd
import re
import struct
import subprocess
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from lakehouse_dev.bench.common import process_tree
from pipelines.runtime.local_process import java

_MAGIC = b"\xca\xfe\xc0\xc0"
_PROLOGUE = 32  # magic, byte order, versions, accessible, used, overflow, mod time, entry offset, entries
_MIB = 2**20


@dataclass(frozen=True)
class JvmMemory:
    """One reading of a JVM: resident MiB, and heap MiB in use (all spaces; old generation) when readable."""

    pid: int
    rss_mib: float
    heap_used_mib: float | None
    old_used_mib: float | None


def perf_counters(data: bytes) -> dict[str, int]:
    """The long counters ('J') of a HotSpot perf-data buffer (hsperfdata, format 2.0) by name.

    Layout (HotSpot's perfMemory.hpp): a 32-byte prologue (magic 0xcafec0c0, byte order 0 big /
    1 little, ..., offset of the first entry, number of entries), then entries of a 20-byte header
    (length, name offset, vector length, type, flags, units, variability, data offset) with the
    name and the value at those offsets from the entry's start.
    """
    if len(data) < _PROLOGUE or data[:4] != _MAGIC:
        raise ValueError("not a HotSpot perf-data buffer")
    order = "<" if data[4] == 1 else ">"
    entry_offset, entries = struct.unpack_from(f"{order}ii", data, 24)
    counters: dict[str, int] = {}
    at = entry_offset
    for _ in range(entries):
        length, name_offset, vector, kind, _flags, _units, _var, data_offset = \
            struct.unpack_from(f"{order}iiibbbbi", data, at)
        if length <= 0:
            break
        if kind == ord("J") and vector == 0:
            end = data.index(b"\0", at + name_offset)
            counters[data[at + name_offset:end].decode()] = struct.unpack_from(f"{order}q", data, at + data_offset)[0]
        at += length
    return counters


def heap_used(counters: dict[str, int]) -> tuple[float, float] | None:
    """(heap MiB in use over every generation's spaces, the old generation's), None without GC counters."""
    used = {name: v for name, v in counters.items()
            if name.startswith("sun.gc.generation.") and name.endswith(".used") and ".space." in name}
    if not used:
        return None
    old = sum(v for name, v in used.items() if name.startswith("sun.gc.generation.1."))
    return sum(used.values()) / _MIB, old / _MIB


def _perf_file(pid: int) -> Path | None:
    with suppress(OSError, KeyError):
        user = pwd.getpwuid(Path(f"/proc/{pid}").stat().st_uid).pw_name
        path = Path("/tmp") / f"hsperfdata_{user}" / str(pid)
        return path if path.exists() else None
    return None


def _rss_mib(pid: int) -> float | None:
    with suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return None


def java_below(pid: int) -> int | None:
    """The `java` process at or below `pid` (a `lakehouse` command's Spark driver), None if there is none."""
    for p in process_tree(pid):
        with suppress(OSError):
            if Path(f"/proc/{p}/comm").read_text().strip() == "java":
                return p
    return None


def jvm_memory(pid: int) -> JvmMemory | None:
    """The JVM at or below `pid`, read now; None when it is gone (a restart in progress)."""
    java = java_below(pid)
    rss = _rss_mib(java) if java is not None else None
    if java is None or rss is None:
        return None
    heap = None
    if (path := _perf_file(java)) is not None:
        with suppress(OSError, ValueError, struct.error):
            heap = heap_used(perf_counters(path.read_bytes()))
    return JvmMemory(java, round(rss, 1), round(heap[0], 1) if heap else None, round(heap[1], 1) if heap else None)


# A row of `GC.class_histogram`: rank, instances, bytes, class name (and its module).
_HISTOGRAM_ROW = re.compile(r"^\s*\d+:\s+(\d+)\s+(\d+)\s+(\S+)")
_HISTOGRAM_TOTAL = re.compile(r"^Total\s+(\d+)\s+(\d+)")


@dataclass(frozen=True)
class LiveSet:
    """What survived a full collection of a JVM: MiB in all, and MiB per class (the `top` largest)."""

    pid: int
    live_mib: float
    classes: dict[str, float]


def parse_histogram(text: str, top: int = 40) -> tuple[float, dict[str, float]]:
    """(live MiB, the `top` classes by MiB) from `jcmd <pid> GC.class_histogram`'s output."""
    classes: dict[str, float] = {}
    total = None
    for line in text.splitlines():
        if (row := _HISTOGRAM_ROW.match(line)) and len(classes) < top:
            classes[row.group(3)] = round(int(row.group(2)) / _MIB, 2)
        elif found := _HISTOGRAM_TOTAL.match(line):
            total = int(found.group(2)) / _MIB
    if total is None:
        raise ValueError(f"no Total line in the class histogram: {text[:500]!r}")
    return round(total, 1), classes


def live_set(pid: int, timeout: float = 120.0) -> LiveSet | None:
    """The live set of the JVM at or below `pid` (a full collection first); None when it is gone or will not say."""
    target = java_below(pid)
    if target is None:
        return None
    jcmd = str(Path(java()).with_name("jcmd"))
    with suppress(OSError, subprocess.SubprocessError, ValueError):
        done = subprocess.run([jcmd, str(target), "GC.class_histogram"], capture_output=True, text=True,
                              timeout=timeout, check=True)
        total, classes = parse_histogram(done.stdout)
        return LiveSet(target, total, classes)
    return None
