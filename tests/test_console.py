"""Operator output (pipelines/runtime/console.py): the summary on the console, the rest in the log file.

No Spark and no lake: a child process stands in for the driver JVM (what it prints must reach
the file, not the console), and loggers named like the libraries' stand in for them.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.runtime import console

pytestmark = pytest.mark.unit


@pytest.fixture
def log_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LAKEHOUSE_LOG_DIR", str(tmp_path))
    monkeypatch.delenv("LAKEHOUSE_LOG_FILE", raising=False)
    monkeypatch.delenv("LAKEHOUSE_TARGET", raising=False)
    return tmp_path


def _emit() -> None:
    logging.getLogger("great_expectations._docs_decorators").info("Skipping registering function x")
    logging.getLogger("kafka.net.selector").warning("Task ran for 0.2s")
    logging.getLogger("pipelines.transform.etl").info("silver/orders: valid=3 (0.1 s)")
    # What a JVM started under `jvm_output` prints, on its stdout and its stderr.
    with console.jvm_output():
        subprocess.run([sys.executable, "-c", "import sys; print('jvm stdout'); "
                        "print('WARN  HoodieLogBlock - noise', file=sys.stderr)"], check=True)


def test_the_console_gets_the_summary_and_the_file_the_rest(log_dir: Path, capfd: pytest.CaptureFixture) -> None:
    console.setup("etl")
    try:
        path = console.log_file()
        assert path is not None and path.parent == log_dir and "etl" in path.name
        _emit()
        assert not console.interactive()  # captured: no terminal, so no progress bar
        assert list(console.progress(range(3), "steps")) == [0, 1, 2]
    finally:
        console.teardown()
    out, err = capfd.readouterr()
    assert out == ""  # stdout stays the command's own output
    assert err == "silver/orders: valid=3 (0.1 s)\n"
    text = path.read_text()
    for line in ("Task ran for 0.2s", "silver/orders: valid=3", "jvm stdout", "WARN  HoodieLogBlock - noise"):
        assert line in text, (line, text)
    assert "Skipping registering function" not in text  # libraries' INFO is left out everywhere


def test_verbose_puts_everything_on_the_console(log_dir: Path, capfd: pytest.CaptureFixture) -> None:
    console.setup("etl", verbose=True)
    try:
        assert console.log_file() is None
        _emit()
    finally:
        console.teardown()
    out, err = capfd.readouterr()
    assert out == ""
    for line in ("Skipping registering function x", "Task ran for 0.2s", "silver/orders: valid=3", "jvm stdout",
                 "WARN  HoodieLogBlock - noise"):
        assert line in err, (line, err)
    assert list(log_dir.iterdir()) == []



def test_a_full_disk_is_named_wherever_the_error_chain_holds_it(tmp_path: Path, monkeypatch) -> None:
    """py4j's ENOSPC is a `Caused by:` line deep in a Java stack trace, and the error a command ends with may be
    a later one (a heartbeat that could not be written either): the line names the disk all the same."""
    monkeypatch.setenv("LAKEHOUSE_ROOT", str(tmp_path / "lake"))
    java = ("An error occurred while calling o77.save.\n: org.apache.hudi.exception.HoodieUpsertException: Error "
            "upserting bucketType UPDATE for partition :0\n\tat ...\nCaused by: org.apache.hadoop.fs.FSError: "
            "java.io.IOException: No space left on device")
    try:
        try:
            raise RuntimeError(java)
        except RuntimeError:
            raise OSError("the heartbeat could not be written")  # noqa: B904 (the context is the point)
    except OSError as exc:
        line = console.failure("ingest", exc)
    assert line.startswith("ingest failed: no space left on device (ENOSPC): the lake "), line
    assert f"{tmp_path / 'lake'} is on " in line and " free of " in line and "`lakehouse ingest` again" in line
    assert console.failure("etl", ValueError("bad input\nthe rest")) == "etl failed: bad input"
