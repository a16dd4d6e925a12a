"""Background processes on this machine: one way to start, find again, wait for and stop them.

The local Kafka broker, the real source's PostgreSQL and Kafka Connect, the object store and the
supervised bronze stream each run detached (their own session), so they outlive whatever started
them, and are found again through a pid file by the next command. `LocalProcess` is that shared
life cycle: start, or adopt the one already running; wait until it serves, naming the errors its log
recorded if it does not; stop with a polite signal, then SIGKILL. A subclass says only what differs:
its command, its files, how it shows it is ready.

Pure standard library: the Airflow environment (no pyspark) imports the deploy modules that use it,
and the EMR bundle's CLI imports it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Self

from pipelines.errors import ProcessError, SetupError, StartFailed

HOST = "127.0.0.1"
LOG_TAIL_LINES = 30
LOG_ERROR_LINES = 10
# How much of a log a failure message reads: the errors of one start, the last lines of the file.
LOG_READ_BYTES = 4 << 20
TAIL_READ_BYTES = 64 << 10


def free_port() -> int:
    """A port nobody listens on right now; the OS may hand it out again, so use it promptly."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def saved_state(path: Path) -> dict[str, Any] | None:
    """The JSON a service group wrote at its first start (its ports, ...); None before that, or if unreadable."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def port_open(port: int, host: str = HOST, timeout: float = 1.0) -> bool:
    """Whether something accepts TCP connections there (a listener, not yet a working service)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


# ApiVersions (key 18), version 0: the one request every Kafka broker answers before anything else.
API_VERSIONS_PROBE = struct.pack(">hhih", 18, 0, 0x1A4E, 9) + b"lakehouse"


def kafka_unanswered(bootstrap: str, timeout: float = 5.0, tls: ssl.SSLContext | None = None) -> str | None:
    """None when a broker of `bootstrap` answers a Kafka request, else why none did (per server).

    A request, not a TCP connect: a proxy in a blackout, a half-dead broker or a network that drops
    packets accepts connections, or holds them open, and answers nothing. What the ingest stream's
    heartbeat names as what it waits for (pipelines/ingest/stream.py). `tls`: the brokers' listener speaks TLS
    (pipelines.runtime.kafka_clients.probe_tls).
    """
    why = []
    for server in bootstrap.split(","):
        host, _, port = server.strip().rpartition(":")
        try:
            with _connected(host.strip("[]") or HOST, int(port), timeout, tls) as sock:
                sock.settimeout(timeout)
                sock.sendall(struct.pack(">i", len(API_VERSIONS_PROBE)) + API_VERSIONS_PROBE)
                answer = sock.recv(8)
            if len(answer) == 8 and struct.unpack(">i", answer[4:])[0] == 0x1A4E:
                return None
            why.append(f"{server.strip()}: {'connection closed' if not answer else 'not a Kafka answer'}")
        except (OSError, ValueError) as error:
            why.append(f"{server.strip()}: {error or type(error).__name__}")
    return "; ".join(why)


def _connected(host: str, port: int, timeout: float, tls: ssl.SSLContext | None) -> socket.socket:
    """A connection to `host:port`, through TLS when `tls` is given (the handshake within `timeout` too)."""
    sock = socket.create_connection((host, port), timeout=timeout)
    if tls is None:
        return sock
    try:
        return tls.wrap_socket(sock, server_hostname=host)
    except BaseException:
        sock.close()
        raise


def process_started(pid: int) -> float | None:
    """When process `pid` started (clock ticks since boot, Linux), None when there is no such process.

    With the pid it names one process for good: a pid reused by a later process has another
    start time.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:  # no /proc: all we can tell is whether the pid exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        return 0.0
    # Fields after the command name (which may hold spaces): state (3rd), ..., starttime (22nd).
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):  # exited, not yet reaped (an orphan whose new parent never waits)
        return None
    return float(fields[19])


def command_line(pid: int) -> str:
    """The command line of a live process, "" if it is gone or a zombie.

    Checked before trusting or signalling a pid from a pid file: after a reboot that pid may
    belong to an unrelated process.
    """
    if Path("/proc/self").exists():
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            return ""
    ps = subprocess.run(["ps", "-o", "stat=,command=", "-p", str(pid)], check=False, capture_output=True, text=True)
    return "" if ps.stdout.lstrip().startswith("Z") else ps.stdout


def java() -> str:
    """The `java` of JAVA_HOME, else the one on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    found = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if not found:
        raise SetupError("no `java` on PATH and JAVA_HOME is unset; the local JVM services need Java 17+")
    return found


def java_command(main_class: str, *args: str, classpath: str, options: Sequence[str] = ()) -> list[str]:
    """`java OPTIONS -cp CLASSPATH MAIN ARGS`; a `dir/*` classpath is expanded by java itself, not by a shell."""
    return [java(), *options, "-cp", classpath, main_class, *args]


class LocalProcess(ABC):
    """One detached background process, found again through its pid file.

    The pid file holds the pid and the process's start time, so a pid reused after a reboot is
    not mistaken for it; `marker`, when set, must also be in its command line (a pid file that
    the process writes itself, such as PostgreSQL's, has no start time). Subclasses give the
    command, the files and the readiness test; the class attributes tune messages, signals and
    timeouts.
    """

    label: ClassVar[str] = "process"
    # What `stop` sends first (SIGINT for PostgreSQL's fast shutdown), and whether to the whole
    # session or to the leader alone (the stream's driver lets its batch finish, its JVM must not
    # die under it). SIGKILL always goes to the whole session.
    stop_signal: ClassVar[signal.Signals] = signal.SIGTERM
    stop_group: ClassVar[bool] = True
    # False when the process writes its pid file itself (PostgreSQL's postmaster.pid).
    writes_pid_file: ClassVar[bool] = True
    error: ClassVar[type[Exception]] = ProcessError
    error_line: ClassVar[re.Pattern[str]] = re.compile(r"\b(ERROR|FATAL)\b|^Caused by: ")
    start_timeout: float = 60.0
    stop_timeout: float = 30.0
    kill_timeout: float = 10.0
    poll_seconds: float = 0.1
    _process: subprocess.Popen[bytes] | None = None

    @property
    @abstractmethod
    def pid_path(self) -> Path: ...

    @property
    @abstractmethod
    def log_path(self) -> Path: ...

    @abstractmethod
    def command(self) -> list[str]: ...

    @property
    def marker(self) -> str | None:
        """Text the process's command line must hold to be this one (None: the start time is enough)."""
        return None

    def prepare(self, log_start: int) -> None:
        """Before a launch: write configs, format storage; errors through `failure(..., log_start)`."""
        return None

    def popen_options(self) -> dict[str, Any]:
        """More `subprocess.Popen` arguments: cwd, env, user."""
        return {}

    def unready(self, pid: int, deadline: float) -> str | None:
        """Why the process does not serve yet, None once it does; raises StartFailed if it never will."""
        return None

    def adopt(self, pid: int) -> None:
        """Take over what a running process was started with (its port, say); raise if it cannot be used."""
        return None

    def pid(self) -> int | None:
        """The pid of the running process, None if it is not running (a stale pid file is ignored)."""
        if self._process is not None and self._process.poll() is None:
            # Our own child: right after the fork its command line is still Python's.
            return self._process.pid
        recorded = self._read_pid_file()
        if recorded is None:
            return None
        pid, started = recorded
        running_since = process_started(pid)
        if running_since is None or (started is not None and running_since != started):
            return None
        return pid if self.marker is None or self.marker in command_line(pid) else None

    def is_running(self) -> bool:
        return self.pid() is not None

    def start(self, timeout: float | None = None) -> Self:
        """Start the process, or adopt the one already running, and wait until it serves."""
        deadline = time.monotonic() + (self.start_timeout if timeout is None else timeout)
        pid = self.pid()
        if pid is None:
            self.launch(deadline)
        else:
            self.adopt(pid)
            self.wait_ready(pid, deadline, self.log_size())
        return self

    def launch(self, deadline: float) -> int:
        """Spawn and wait until it serves; a process that does not is stopped (it would hold its ports)."""
        pid, log_start = self.spawn()
        try:
            self.wait_ready(pid, deadline, log_start)
        except BaseException:
            self.stop()
            raise
        return pid

    def spawn(self) -> tuple[int, int]:
        """Start the process detached, its output appended to the log: its pid and where its log begins."""
        self.pid_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log_start = self.log_size()
        self.prepare(log_start)
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL, stdout=log,
                                             stderr=subprocess.STDOUT, start_new_session=True, **self.popen_options())
        pid = self._process.pid
        if self.writes_pid_file:
            self.pid_path.write_text(json.dumps({"pid": pid, "started": process_started(pid)}))
        return pid, log_start

    def wait_ready(self, pid: int, deadline: float, log_start: int) -> None:
        while True:
            if self.pid() != pid:
                code = self._process.returncode if self._process is not None and self._process.pid == pid else None
                raise self.error(self.failure(f"{self.label} (pid {pid}) exited during startup, code {code}",
                                              log_start))
            try:
                why = self.unready(pid, deadline)
            except StartFailed as failed:
                raise self.error(self.failure(str(failed), log_start)) from None
            if why is None:
                return
            if time.monotonic() >= deadline:
                raise self.error(self.failure(f"{self.label} (pid {pid}) not ready in time: {why}", log_start))
            time.sleep(self.poll_seconds)

    def stop(self, timeout: float | None = None) -> None:
        """`stop_signal` for a clean shutdown, SIGKILL if that hangs; a stopped process is a no-op."""
        pid = self.pid()
        if pid is not None and self.terminate(pid, self.stop_timeout if timeout is None else timeout) is None:
            raise self.error(f"{self.label} pid {pid} survived SIGKILL")
        self._forget()

    def kill(self) -> None:
        """SIGKILL at once: no shutdown of its own (what a crash leaves behind)."""
        pid = self.pid()
        if pid is not None:
            self.send(pid, signal.SIGKILL, group=True)
            if not self.wait_exit(pid, self.kill_timeout):
                raise self.error(f"{self.label} pid {pid} survived SIGKILL")
        self._forget()

    def terminate(self, pid: int, timeout: float) -> signal.Signals | None:
        """`stop_signal`, then SIGKILL after `timeout`: the signal the process ended on, None if it survived both."""
        self.send(pid, self.stop_signal, group=self.stop_group)
        if self.wait_exit(pid, timeout):
            return self.stop_signal
        self.send(pid, signal.SIGKILL, group=True)
        return signal.SIGKILL if self.wait_exit(pid, self.kill_timeout) else None

    @staticmethod
    def send(pid: int, signum: signal.Signals, *, group: bool) -> None:
        # It may have exited since `pid()` looked.
        with contextlib.suppress(ProcessLookupError):
            if group:
                os.killpg(pid, signum)
            else:
                os.kill(pid, signum)

    def exited(self, pid: int | None) -> bool:
        """Whether the process `pid` is gone (`wait_exit`'s test; a subclass may ask for more)."""
        return pid is None or self.pid() != pid

    def wait_exit(self, pid: int | None, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self.exited(pid):
            if time.monotonic() >= deadline:
                return False
            time.sleep(self.poll_seconds)
        return True

    def log_size(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def log_since(self, offset: int) -> str:
        """What the log holds from `offset` on (at most LOG_READ_BYTES of it)."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(offset)
                return log.read(LOG_READ_BYTES).decode(errors="replace")
        except FileNotFoundError:
            return ""

    def failure(self, message: str, log_start: int = 0) -> str:
        """`message` plus what the log says about it.

        A service often logs the cause once and then a long orderly shutdown, so the tail alone
        misses it: the errors logged since this start come first.
        """
        errors = [line for line in self.log_since(log_start).splitlines() if self.error_line.search(line)]
        report = [message]
        if errors:
            report += ["--- errors logged during this start ---", *list(dict.fromkeys(errors))[:LOG_ERROR_LINES]]
        tail = self.log_since(max(0, self.log_size() - TAIL_READ_BYTES)).splitlines()[-LOG_TAIL_LINES:]
        return "\n".join([*report, f"--- last {LOG_TAIL_LINES} lines of {self.log_path} ---", *tail])

    def _read_pid_file(self) -> tuple[int, float | None] | None:
        """(pid, start time) from the pid file: ours is JSON, PostgreSQL's has a bare pid on its first line."""
        try:
            text = self.pid_path.read_text()
        except OSError:
            return None
        with contextlib.suppress(ValueError, TypeError, KeyError):
            recorded = json.loads(text)
            return int(recorded["pid"]), recorded.get("started")
        first = text.partition("\n")[0].strip()
        return (int(first), None) if first.isdigit() else None

    def _forget(self) -> None:
        self.pid_path.unlink(missing_ok=True)
        self._process = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
