"""The stream's health rules (pipelines.ingest.stream.judge) on heartbeats of every kind, and the lease's guard.

Pure Python: the running stream is covered by test_bronze_ingest's supervised-stream test.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from pipelines.ingest.stream import AnotherStreamRunning, Heartbeat, Limits, StreamLease, judge
from pipelines.local_process import process_started

LIM = Limits(heartbeat_seconds=1, dead_after_seconds=60, stalled_after_seconds=300, start_timeout_seconds=10,
             stop_timeout_seconds=10, kill_timeout_seconds=5)
NOW = 1_800_000_000.0


def beat(**kw) -> Heartbeat:
    fields = {"owner": "o", "host": "elsewhere", "pid": 1, "pid_started": 1.0, "started_at": NOW - 1000,
              "written_at": NOW - 5, "state": "running", "batch": 7, "last_progress_at": NOW - 5,
              "trigger_since": None} | kw
    return Heartbeat(**fields)


@pytest.mark.parametrize(("hb", "state"), [
    (None, "absent"),
    (beat(state="stopped"), "stopped"),
    (beat(), "healthy"),
    (beat(trigger_since=NOW - 100), "healthy"),
    (beat(written_at=NOW - 61), "dead"),
    (beat(trigger_since=NOW - 301), "stalled"),
    (beat(last_progress_at=NOW - 301), "stalled"),
    (beat(host=socket.gethostname(), pid=os.getpid(), pid_started=process_started(os.getpid())), "healthy"),
    (beat(host=socket.gethostname(), pid=os.getpid(), pid_started=-1.0), "dead"),  # pid reused
])
def test_judge(hb, state) -> None:
    assert judge(hb, LIM, now=NOW).state == state


def test_a_second_writer_on_this_host_is_refused_at_once(tmp_path) -> None:
    first = StreamLease(str(tmp_path), LIM)
    first.claim()
    with pytest.raises(AnotherStreamRunning, match="another ingest stream"):
        StreamLease(str(tmp_path), LIM).claim()
    first.release()
    StreamLease(str(tmp_path), LIM).claim()  # a stopped stream's heartbeat holds nothing


def test_an_exited_process_not_yet_reaped_counts_as_gone() -> None:
    """A stream SIGKILLed after its supervisor exited is a zombie until someone reaps it: not alive."""
    child = subprocess.Popen(["true"])
    while Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.01)
    assert process_started(child.pid) is None
    child.wait()
