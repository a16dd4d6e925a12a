"""The pipeline on a broker that takes only TLS and SASL/SCRAM, configured by a `lakehouse.toml` alone: `doctor`
names each way a client can be refused (a wrong password, a CA that did not sign the broker's certificate,
plaintext to the TLS listener), a refused `ingest` writes nothing, the right file passes, and the password is in
no log and no process's command line. The pipeline's clients use the broker's SECURE listener (SASL_SSL,
SCRAM-SHA-512, the local stack's own CA: dev/lakehouse_dev/tls.py); the whole pipeline over it, from a real
source, is tests/test_real_source_secure.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from hudi_configs import test_profile as suite_profile
from lakehouse_dev.kafka_local import SCRAM_USER, KafkaBroker
from pipelines.runtime.settings import log_dir
from tests.kill import command_lines
from tests.lake import own_environment

pytestmark = pytest.mark.integration


@pytest.fixture
def secure_broker(tmp_path: Path) -> Iterator[KafkaBroker]:
    broker = KafkaBroker(tmp_path / "kafka", secure_port=0).start()
    try:
        yield broker
    finally:
        broker.stop()


def write_config(where: Path, broker: KafkaBroker, **kafka: str) -> Path:
    """A lakehouse.toml for the lake in `where`, reaching the broker's SECURE listener; `kafka` replaces keys of
    its [kafka] section (TOML values, as written)."""
    (where / "erasure.key").write_text("ab" * 32)
    section = {"bootstrap_servers": f'"{broker.secure_bootstrap}"', "security_protocol": '"SASL_SSL"',
               "sasl_mechanism": '"SCRAM-SHA-512"', "sasl_username": f'"{SCRAM_USER}"',
               "sasl_password": f'{{ file = "{broker.scram_password_file}" }}',
               "ssl_ca_file": f'"{broker.tls.ca_file}"', **kafka}
    path = where / f"lakehouse-{len(list(where.glob('lakehouse*.toml')))}.toml"
    path.write_text("\n".join([
        "[lake]", 'root = "lake"', 'erasure_key = { file = "erasure.key" }',
        f'hudi_overrides = ["{suite_profile()}"]', "", "[kafka]",
        *(f"{key} = {value}" for key, value in section.items() if value)]) + "\n")
    return path


def lakehouse(config: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "pipelines.cli", "--config", str(config), *args],
                            env=own_environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def refused(tmp_path: Path, broker: KafkaBroker) -> None:
    """Each wrong configuration: doctor says what is wrong, naming the setting, and exits 1."""
    wrong_password = tmp_path / "wrong-password"
    wrong_password.write_text("not-the-password")
    stranger = tmp_path / "stranger-ca.pem"
    trustme.CA(organization_name="nobody the broker knows").cert_pem.write_to_path(str(stranger))
    cases = {"authentication failed": {"sasl_password": f'{{ file = "{wrong_password}" }}'},
             "not signed by a CA this client trusts ([kafka] ssl_ca_file)": {"ssl_ca_file": f'"{stranger}"'},
             "security_protocol": {"security_protocol": '"PLAINTEXT"', "sasl_mechanism": "",
                                   "sasl_username": "", "sasl_password": "", "ssl_ca_file": ""}}
    runs = {words: lakehouse(write_config(tmp_path, broker, **kafka), "doctor", "--timeout", "4", "--json")
            for words, kafka in cases.items()}
    for words, run in runs.items():
        out, err = run.communicate(timeout=120)
        assert run.returncode == 1, err
        kafka = next(f for f in json.loads(out) if f["endpoint"] == "kafka")
        assert kafka["status"] == "failed" and words in kafka["detail"], kafka
        assert broker.secure_bootstrap in kafka["where"]


def files_holding(secret: str, *folders: Path, since: float = 0.0) -> list[str]:
    return [str(p) for folder in folders for p in folder.rglob("*")
            if p.is_file() and p.stat().st_mtime >= since and secret.encode() in p.read_bytes()]


def test_a_secured_broker_s_refusals_are_named_and_nothing_is_written(
        secure_broker: KafkaBroker, tmp_path: Path) -> None:
    started = time.time()
    refused(tmp_path, secure_broker)

    # A refused ingest fails at once, naming Kafka and the setting, and the lake gets nothing.
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-password")
    bad = lakehouse(write_config(tmp_path, secure_broker, sasl_password=f'{{ file = "{wrong}" }}'), "ingest",
                    "--once")
    _, err = bad.communicate(timeout=180)
    assert bad.returncode != 0 and "authentication failed" in err and "[kafka] sasl_username" in err, err
    assert not (tmp_path / "lake").exists(), "a refused ingest wrote to the lake"

    # The right file: doctor's Kafka line is ok (the ingest itself over SASL_SSL, across a SIGKILL, is
    # tests/test_real_source_secure.py's), and the password was written nowhere.
    secret = secure_broker.scram_password_file.read_text().strip()
    seen: set[str] = set()
    good = lakehouse(write_config(tmp_path, secure_broker), "doctor", "--json")
    while good.poll() is None:
        seen |= {pid for pid, line in command_lines().items() if secret in line}
        time.sleep(0.2)
    out, err = good.communicate(timeout=120)
    assert next(f for f in json.loads(out) if f["endpoint"] == "kafka")["status"] == "ok", out + err
    assert not seen, f"the SCRAM password was on the command line of processes {sorted(set(seen))}"
    leaked = files_holding(secret, tmp_path, log_dir(), since=started)
    leaked = [p for p in leaked if Path(p) != secure_broker.scram_password_file]
    assert not leaked, f"the SCRAM password is written in {leaked}"
