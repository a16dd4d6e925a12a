"""The class archive `make setup` writes is mapped by the driver JVMs the project starts.

A JVM that cannot map it (another JDK, another class path) starts without it and says
nothing (its warning is silenced on purpose), so only a look inside a running JVM shows
that every local job still gets the shorter start-up.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from pipelines.runtime.spark_conf import archive_path

pytestmark = pytest.mark.integration


def test_the_session_jvm_maps_the_archive(spark) -> None:
    assert archive_path().is_file(), "no class archive: `make setup` writes it"
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    info = subprocess.run(["jcmd", str(pid), "VM.info"], capture_output=True, text=True, check=True).stdout
    mapped = re.search(r"CDS archive\(s\) mapped at: .*?size (\d+)", info)
    # The JDK's own base archive is a few MB; the project's archive (the top layer) is far larger.
    assert mapped and int(mapped[1]) > archive_path().stat().st_size, (mapped and mapped[0], archive_path())
