"""Operator output: the summary a command prints, and a log file for everything else.

A person running `lakehouse` (or reading its Airflow task log) needs one line per step: what
it read, what it wrote, how long it took, what failed. Spark, Hudi, Great Expectations and
py4j say far more than that, in the same streams. So a command's console gets the records of
the project's own loggers (`pipelines.*`); the libraries' records and the JVM's output (its
log4j console appender, and whatever it prints itself) go to a log file, named when Spark
starts and when a command fails. `--verbose` puts everything on the console instead.

The file is `$LAKEHOUSE_LOG_FILE` when set, else a new one per command under
`$LAKEHOUSE_LOG_DIR` (default `.logs/` in the checkout); on EMR (no checkout) everything stays
on stderr, which YARN keeps. Progress bars are drawn only when
stderr is a terminal: in a pipe, a file or a task log they are noise.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import hudi_configs
from pipelines.runtime.settings import log_dir

T = TypeVar("T")

_state: dict[str, object] = {}  # the handlers and levels `setup` changed, for `teardown`


def setup(command: str, verbose: bool = False) -> None:
    """Route logging for one CLI command: its summary to stderr, the rest to the log file (or all to stderr)."""
    teardown()
    root, own = logging.getLogger(), logging.getLogger("pipelines")
    _state.update(root_level=root.level, own_level=own.level, handlers=[])
    console = logging.StreamHandler(sys.stderr)
    handlers: list[logging.Handler] = [console]
    if verbose:
        console.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.setLevel(logging.INFO)
        own.setLevel(logging.DEBUG)
    elif hudi_configs.target() == "emr":
        # On a cluster the step's stderr is the log YARN keeps: everything stays there.
        console.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.setLevel(logging.WARNING)
        own.setLevel(logging.INFO)
    else:
        console.setFormatter(_Summary())
        console.addFilter(lambda record: record.name.startswith("pipelines"))
        path = Path(os.environ.get("LAKEHOUSE_LOG_FILE") or
                    log_dir() / f"{datetime.now():%Y%m%d-%H%M%S}-{command}-{os.getpid()}.log")
        path.parent.mkdir(parents=True, exist_ok=True)
        _state["file"] = path
        logfile = logging.FileHandler(path, delay=True)
        logfile.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        # A process whose stderr already is that file (the stream's child, stream_local.py) writes each line once.
        handlers = [logfile] if _is_stderr(path) else [console, logfile]
        # Libraries at WARNING (GE logs 200 INFO lines at import), the project at INFO.
        root.setLevel(logging.WARNING)
        own.setLevel(logging.INFO)
    for handler in handlers:
        root.addHandler(handler)
    _state["handlers"] = handlers


def _is_stderr(path: Path) -> bool:
    try:
        here, there = os.fstat(sys.stderr.fileno()), os.stat(path)
    except (OSError, ValueError, AttributeError):  # no such file yet, or a stderr without a descriptor
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def teardown() -> None:
    """Undo `setup` (the CLI runs in-process in tests, one command after another)."""
    root = logging.getLogger()
    for handler in _state.get("handlers", []):  # type: ignore[attr-defined]
        root.removeHandler(handler)
        handler.close()
    if "root_level" in _state:
        root.setLevel(_state["root_level"])  # type: ignore[arg-type]
        logging.getLogger("pipelines").setLevel(_state["own_level"])  # type: ignore[arg-type]
    _state.clear()


def log_file() -> Path | None:
    """The command's log file; None with --verbose or outside the CLI."""
    return _state.get("file")  # type: ignore[return-value]


def see_log() -> str:
    """` (log: <file>)` to end a failure's message with, or nothing when there is no file."""
    return f" (log: {path})" if (path := log_file()) else ""


def interactive() -> bool:
    """True when a person watches: stderr is a terminal."""
    return sys.stderr.isatty()


def progress(items: Iterable[T], what: str, total: int | None = None) -> Iterator[T]:
    """`items`, with a progress bar on a terminal and nothing elsewhere."""
    if not interactive():
        yield from items
        return
    from tqdm import tqdm

    yield from tqdm(items, desc=what, total=total, leave=False, file=sys.stderr)


@contextlib.contextmanager
def jvm_output() -> Iterator[None]:
    """Around the start of a local driver JVM: its stdout and stderr, for its whole life, go to the log file.

    A JVM started here inherits this process's file descriptors, so they point it at the file
    while it starts. Without a file (--verbose, tests) its stdout goes to stderr: stdout is the
    command's output (`lakehouse changes` prints JSON lines), and libraries in the JVM print there.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    path = log_file()
    saved = os.dup(1), os.dup(2)
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if path else os.dup(2)
    try:
        os.dup2(target, 1)
        if path:
            os.dup2(target, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, target):
            os.close(fd)


def redirect_submitted_jvm(jvm: Any) -> None:
    """Under spark-submit (Airflow's local tasks) the JVM is our parent: point its System.out/err at the file.

    Its log4j console appender follows System.err (hudi_configs/log4j2.properties); this
    process's own output still reaches the task log, through the stream spark-submit copied it to.
    """
    if (path := log_file()) is None:
        return
    stream = jvm.java.io.PrintStream(jvm.java.io.FileOutputStream(str(path), True), True)
    jvm.java.lang.System.setErr(stream)
    jvm.java.lang.System.setOut(stream)


def timed(log: logging.Logger, name: str, run: Callable[[], dict[str, int]]) -> dict[str, int]:
    """`run()`, then one line: `name: its counts (seconds)`."""
    started = time.monotonic()
    counts = run()
    log.info("%s: %s (%.1f s)", name, counts_text(counts), time.monotonic() - started)
    return counts


def counts_text(counts: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in counts.items()) or "nothing new"


class _Summary(logging.Formatter):
    """`message` for INFO, `WARNING: message` above it: the console is for people."""

    def format(self, record: logging.LogRecord) -> str:
        message = super().format(record)
        return message if record.levelno <= logging.INFO else f"{record.levelname}: {message}"


def first_line(exc: BaseException) -> str:
    """The first line of an error's message (its type when it has none): what a failed command prints,
    the rest (a JVM's stack) going to the log file."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# What the JVM (java.io.IOException, wrapped by Hadoop's FSError and by py4j) and Python (OSError) say
# when a write finds its file system full.
NO_SPACE = ("No space left on device", "ENOSPC")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and every exception behind it: Python's causes and contexts (an error raised while the first
    was handled, such as a heartbeat that could not be written as the stream stopped), and PySpark's `cause`."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        more = getattr(current, "cause", None)
        todo += [current.__cause__, current.__context__, more if isinstance(more, BaseException) else None]


def _texts(exc: BaseException) -> Iterator[str]:
    """What an exception says, the JVM's stack traces included: a Hudi write's ENOSPC is a `Caused by:` line
    deep in them (HoodieUpsertException <- FSError <- IOException), never the first line."""
    for e in _chain(exc):
        yield from (a for a in e.args if isinstance(a, str))
        for attribute in ("desc", "stackTrace"):  # PySpark's CapturedException (StreamingQueryException, ...)
            if isinstance(text := getattr(e, attribute, None), str):
                yield text
        if type(e).__name__ == "Py4JJavaError":  # its text is the Java stack trace, fetched from the JVM
            with contextlib.suppress(Exception):
                yield str(e)


def out_of_space(exc: BaseException) -> bool:
    """True when `exc`, or an error behind it, is a write that found its file system full (ENOSPC)."""
    return any(isinstance(e, OSError) and e.errno == errno.ENOSPC for e in _chain(exc)) or \
        any(marker in text for text in _texts(exc) for marker in NO_SPACE)


def _size(n: int) -> str:
    """`n` bytes as people read it: `0 B`, `96.0 MiB`, `42.0 GiB`."""
    if n < 1024:
        return f"{n} B"
    size, unit = n / 1024, "KiB"
    for bigger in ("MiB", "GiB", "TiB"):
        if size < 1024:
            break
        size, unit = size / 1024, bigger
    return f"{size:.1f} {unit}"


def _mount_point(path: Path) -> Path:
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


# A file system with less free than this share of its size counts as the full one (a failed write may
# have freed the few blocks it had taken by the time the message is made).
FULL_SHARE = 0.05


def disks(root: str) -> list[tuple[str, str, Path, int, int]]:
    """The local file systems a job writes to, as (what, path, mount point, free bytes, size): the lake's
    (unless it is on an object store), then Spark's scratch space (shuffle and cache spills) when that is
    another file system."""
    from pipelines.lake import storage

    places = [] if storage.is_remote(root) else [("the lake", root.removeprefix("file://").removeprefix("file:"))]
    places.append(("Spark's scratch space",
                   (os.environ.get("SPARK_LOCAL_DIRS") or "").split(",")[0] or tempfile.gettempdir()))
    found, devices = [], set()
    for what, where in places:
        path = Path(where).absolute()
        while not path.exists() and path != path.parent:  # a lake not created yet: the folder it would be in
            path = path.parent
        if (device := path.stat().st_dev) in devices:
            continue
        devices.add(device)
        usage = shutil.disk_usage(path)
        found.append((what, where, _mount_point(path), usage.free, usage.total))
    return found


def _no_space(command: str, root: str) -> str:
    """`failure`'s line for a full disk: which one (the lake's, Spark's scratch space), its free space, what to do."""
    try:
        found = disks(root)
    except OSError as err:  # the folders gone meanwhile: still say what happened
        return f"{command} failed: no space left on device (ENOSPC) under the lake {root} (free space unknown: {err})"
    full = [d for d in found if d[3] < FULL_SHARE * d[4]] or found  # none full any more: name them all
    named = "; ".join(f"{what} {where} is on {mount}, {_size(free)} free of {_size(total)}"
                      for what, where, mount, free, total in full)
    move = " or ".join(f"point {variable} at a larger disk" for what, variable in
                       (("the lake", "LAKEHOUSE_ROOT"), ("Spark's scratch space", "SPARK_LOCAL_DIRS"))
                       if any(d[0] == what for d in full))
    return (f"{command} failed: no space left on device (ENOSPC): {named}. Free space there (or {move}) and run "
            f"`lakehouse {command}` again: the commit the full disk cut short is rolled back and made again, "
            f"nothing is lost or applied twice")


def failure(command: str, exc: BaseException) -> str:
    """The one line a command that failed prints (`<command> failed: ...`); the whole exception goes to the log file.

    A full disk gets its own line: the JVM's ENOSPC reaches the console as a Spark or Hudi error
    whose first line says nothing of space ("Error upserting bucketType UPDATE", a streaming query
    "terminated with exception"), so the operator would dig through the log to learn that a disk
    is full and which one. The line names the full file system (the lake's path, or Spark's
    scratch space), its free space, and what to do.
    """
    logging.getLogger("lakehouse.failure").error("%s failed", command, exc_info=exc)  # the log file only
    if not out_of_space(exc):
        return f"{command} failed: {first_line(exc)}{see_log()}"
    from pipelines.runtime.settings import lake_root

    return _no_space(command, lake_root()) + see_log()
