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

from pipelines.errors import AnotherStreamRunning
from pipelines.ingest.stream import (
    Heartbeat,
    Limits,
    StreamLease,
    judge,
    kafka_offsets,
    not_caught_up,
)
from pipelines.runtime.local_process import process_started

pytestmark = pytest.mark.unit

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
    # Waiting for Kafka: live and left running, however long the batch it holds up has run; dead still wins.
    (beat(waiting_for="Kafka at 127.0.0.1:9092", waiting_since=NOW - 40, waiting_why="refused"), "waiting"),
    (beat(waiting_for="Kafka at 127.0.0.1:9092", trigger_since=NOW - 900, waiting_why="refused"), "waiting"),
    (beat(waiting_for="Kafka at 127.0.0.1:9092", written_at=NOW - 61, waiting_why="refused"), "dead"),
])
def test_judge(hb, state) -> None:
    assert judge(hb, LIM, now=NOW).state == state


def test_waiting_names_what_since_when_and_why(tmp_path) -> None:
    lease = StreamLease(str(tmp_path), LIM)
    lease.claim()
    lease.waiting("Kafka at 127.0.0.1:9092", "127.0.0.1:9092: [Errno 111] Connection refused")
    since = lease.hb.waiting_since
    lease.waiting("Kafka at 127.0.0.1:9092", "127.0.0.1:9092: timed out")  # the same wait goes on
    lease.beat(None, True)
    health = judge(lease.files.heartbeat(), LIM)
    assert health.state == "waiting" and health.live and health.running
    assert "waiting for Kafka at 127.0.0.1:9092 since " in health.why and "timed out" in health.why
    assert lease.hb.waiting_since == since
    lease.waiting("Kafka at 127.0.0.1:9092", None)
    lease.beat(None, False)
    assert judge(lease.files.heartbeat(), LIM).state == "healthy"
    lease.release()


def test_batches_back_to_back_are_not_one_stalled_batch(tmp_path) -> None:
    """Under steady load Spark's trigger never reads inactive between batches: each completed batch (a new
    `batchId` in the last progress) starts the running one's clock again; one batch over the limit is stalled."""
    lease = StreamLease(str(tmp_path), LIM)
    lease.claim()
    for batch in range(5):
        lease.beat({"batchId": batch, "timestamp": "2026-11-29T10:00:00.000Z"}, True)
        lease.hb.trigger_since -= 200  # each batch ran 200 s: 1,000 s of triggers back to back
    assert judge(lease.files.heartbeat(), LIM, now=time.time()).state == "healthy"
    lease.hb.trigger_since -= 301 - 200  # batch 5, running since batch 4 completed, past the limit...
    lease.beat({"batchId": 4, "timestamp": "2026-11-29T10:00:00.000Z"}, True)  # ... and still running
    assert judge(lease.files.heartbeat(), LIM, now=time.time()).state == "stalled"
    lease.release()


def test_the_kafka_probe_needs_an_answer_not_a_listener() -> None:
    """A port that refuses, and one that accepts and says nothing (a proxy in a blackout, a silent
    network), are both no Kafka; the reason names the server."""
    from pipelines.runtime.local_process import free_port, kafka_unanswered

    refused = f"127.0.0.1:{free_port()}"
    assert "refused" in kafka_unanswered(refused, 1.0)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        assert kafka_unanswered(address, 0.5) == f"{address}: timed out"
        assert kafka_unanswered(f"{refused},{address}", 0.5).count("127.0.0.1:") == 2


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


ENDS = {"shop.public.orders": {"0": 10, "1": 5}}


@pytest.mark.parametrize(("hb", "why"), [
    (None, "no stream is running"),
    (beat(state="stopped", read_to=ENDS), "no stream is running (it stopped)"),
    (beat(trigger_since=NOW - 3, read_to=ENDS), "batch 7 is running"),
    (beat(read_to=None), "15 records on Kafka not read yet"),
    (beat(read_to={"shop.public.orders": {"0": 10, "1": 3}}), "2 records on Kafka not read yet"),
    (beat(read_to=ENDS, tables={"orders": {"waiting": 4, "age": 3.0, "target": 15}}),
     "changes waiting for their table's commit: orders 4"),
    (beat(read_to=ENDS, tables={"orders": {"waiting": 0, "age": None, "target": 15}}), None),
    (beat(read_to={"shop.public.orders": {"0": 12, "1": 5}}), None),  # read past the ends taken at the call
])
def test_caught_up_means_read_to_the_ends_and_nothing_waiting(hb, why) -> None:
    got = not_caught_up(hb, ENDS)
    assert got == why if why is None else got.startswith(why), got


def test_the_heartbeat_keeps_where_the_newest_batch_ended() -> None:
    progress = {"batchId": 3, "sources": [{"endOffset": '{"shop.public.orders": {"0": 10, "1": 5}}',
                                           "latestOffset": {"shop.public.orders": {"0": 12, "1": 5}}}]}
    assert kafka_offsets(progress, "endOffset") == ENDS
    assert kafka_offsets(progress, "latestOffset") == {"shop.public.orders": {"0": 12, "1": 5}}
    assert kafka_offsets({"sources": []}, "endOffset") is None and kafka_offsets(None, "endOffset") is None
