"""lakehouse.toml (pipelines/runtime/config.py): precedence, profiles, errors naming file, section and key, secrets
that are never values, and the commands reading it."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from pipelines.cli.app import main
from pipelines.cli.config import schema
from pipelines.errors import SecretError, SettingError
from pipelines.runtime.config import Secret, effective, export, load_config
from pipelines.runtime.lake import Lake

pytestmark = pytest.mark.unit

DOCS = Path(__file__).resolve().parents[1] / "docs"
FILE = """
[lake]
root = "lake-here"

[kafka]
bootstrap_servers = "file:9092"

[catalog]
metastore_uri = "thrift://file:9083"

[profiles.prod.kafka]
bootstrap_servers = "prod:9092"

[profiles.prod.lake]
erasure_key = { file = "key.txt" }
"""


@pytest.fixture(autouse=True)
def environment_kept() -> Iterator[None]:
    """The environment as it was: a command exports the settings it loaded into it (`export`), and a later
    test in this process must not find them."""
    before = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(before)


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "conf" / "lakehouse.toml"
    path.parent.mkdir()
    path.write_text(FILE)
    return path


def _sources(loaded) -> dict[str, tuple[object, str]]:
    return {key: (value, source) for key, value, source in effective(loaded)}


def test_a_flag_beats_a_variable_beats_the_profile_beats_the_file_beats_the_default(config_file: Path) -> None:
    base = _sources(load_config(config_file, environ={}))
    assert base["kafka.bootstrap_servers"] == ("file:9092", f"{config_file} [kafka]")
    # A relative path in the file is relative to the file.
    assert base["lake.root"] == (str(config_file.parent / "lake-here"), f"{config_file} [lake]")
    assert base["spark.target"] == ("local", "default")
    prod = _sources(load_config(config_file, "prod", environ={}))
    assert prod["kafka.bootstrap_servers"] == ("prod:9092", f"{config_file} [profiles.prod.kafka]")
    assert prod["catalog.metastore_uri"] == ("thrift://file:9083", f"{config_file} [catalog]")
    env = {"LAKEHOUSE_PROFILE": "prod", "KAFKA_BOOTSTRAP_SERVERS": "alias:9092", "LAKEHOUSE_SPARK_TARGET": "emr"}
    varied = _sources(load_config(config_file, environ=env))
    assert varied["kafka.bootstrap_servers"] == ("alias:9092", "env KAFKA_BOOTSTRAP_SERVERS")
    assert varied["spark.target"] == ("emr", "env LAKEHOUSE_SPARK_TARGET")
    # The general name beats the older alias of the same setting.
    both = _sources(load_config(config_file, environ={**env, "LAKEHOUSE_KAFKA_BOOTSTRAP_SERVERS": "general:1"}))
    assert both["kafka.bootstrap_servers"] == ("general:1", "env LAKEHOUSE_KAFKA_BOOTSTRAP_SERVERS")
    flagged = _sources(load_config(config_file, environ=env, flags={"kafka.bootstrap_servers": "flag:9092"}))
    assert flagged["kafka.bootstrap_servers"] == ("flag:9092", "flag kafka.bootstrap_servers")
    assert _sources(load_config(None, environ={}))["kafka.bootstrap_servers"] == ("127.0.0.1:9092", "default")


@pytest.mark.parametrize(("text", "message"), [
    ("[kafka]\nbootstrap = 'x'\n", r"\[kafka\]: kafka\.bootstrap: unknown key \(the keys of \[kafka\]: "
                                   r"bootstrap_servers, security_protocol, "),
    ("[spark]\ntarget = 'yarn'\n", r"\[spark\]: spark\.target: Input should be 'local' or 'emr'"),
    ("[lake]\nerasure_key = 'a-literal-key'\n", r"\[lake\]: lake\.erasure_key: a secret is never a value here"),
    ("[lake]\nerasure_key = { env = 'A', file = 'b' }\n", r"lake\.erasure_key: a secret is in exactly one place"),
    ("[kafak]\n", r"unknown section\(s\) kafak"),
    ("[profiles.prod.sparks]\n", r"\[profiles\.prod\]: unknown section\(s\) sparks"),
    ("[connect]\nurl = 'connect:8083'\n", r"connect\.url: 'connect:8083': expected an http:// or https:// URL"),
    ("[lake\n", r"not valid TOML"),
])
def test_a_wrong_file_is_refused_naming_the_file_the_section_and_the_key(tmp_path: Path, text: str,
                                                                          message: str) -> None:
    path = tmp_path / "lakehouse.toml"
    path.write_text(text)
    with pytest.raises(SettingError, match=message) as error:
        load_config(path, environ={})
    assert str(path) in str(error.value)


def test_profiles_and_secrets_say_what_is_wrong(config_file: Path, tmp_path: Path) -> None:
    with pytest.raises(SettingError, match=r"no profile 'staging' \(profiles: prod\)"):
        load_config(config_file, "staging", environ={})
    with pytest.raises(SettingError, match=r"profile 'prod' .* needs a configuration file"):
        load_config(None, "prod", environ={})
    with pytest.raises(SettingError, match="LAKEHOUSE_LAKE_ERASURE_KEY: a secret is never a value in the environment"):
        load_config(config_file, environ={"LAKEHOUSE_LAKE_ERASURE_KEY": "x" * 40})
    key = load_config(config_file, "prod", environ={}).config.lake.erasure_key
    assert key is not None and key.where() == f"<secret: file {config_file.parent / 'key.txt'}>"
    with pytest.raises(SecretError, match=r"key\.txt cannot be read"):
        key.reveal()
    (config_file.parent / "key.txt").write_text("k" * 64 + "\n")
    assert key.reveal() == "k" * 64
    with pytest.raises(SecretError, match="variable NOT_SET_HERE is not set"):
        Secret(env="NOT_SET_HERE").reveal()


def test_the_settings_reach_the_jobs_it_starts_and_never_a_secret(config_file: Path) -> None:
    environ: dict[str, str] = {"KAFKA_BOOTSTRAP_SERVERS": "alias:9092"}
    export(load_config(config_file, "prod", environ=dict(environ)), environ)
    assert environ["LAKEHOUSE_CONFIG"] == str(config_file) and environ["LAKEHOUSE_PROFILE"] == "prod"
    assert environ["KAFKA_BOOTSTRAP_SERVERS"] == "alias:9092"
    assert environ["LAKEHOUSE_METASTORE_URI"] == "thrift://file:9083"
    assert environ["LAKEHOUSE_ROOT"] == str(config_file.parent / "lake-here")
    assert "LAKEHOUSE_TARGET" not in environ, "a default is left to the job's own"
    assert not [v for v in environ.values() if "key.txt" in v or "k" * 32 in v]


def test_commands_read_the_file_and_show_where_each_setting_came_from(config_file: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("LAKEHOUSE_ROOT", "KAFKA_BOOTSTRAP_SERVERS", "LAKEHOUSE_METASTORE_URI", "LAKEHOUSE_PROFILE"):
        monkeypatch.delenv(variable, raising=False)
    (config_file.parent / "key.txt").write_text("k" * 64)
    runner = CliRunner()
    shown = runner.invoke(main, ["--config", str(config_file), "--profile", "prod", "config", "show", "--json"])
    assert shown.exit_code == 0, shown.output
    doc = json.loads(shown.stdout)
    settings = {s["setting"]: s for s in doc["settings"]}
    assert doc["profile"] == "prod"
    assert settings["kafka.bootstrap_servers"]["from"] == f"{config_file} [profiles.prod.kafka]"
    assert settings["lake.erasure_key"]["value"].startswith("<secret: file ") and "k" * 32 not in shown.stdout
    status = runner.invoke(main, ["--config", str(config_file), "status", "--json"])
    assert status.exit_code == 0, status.output
    assert json.loads(status.stdout)["lake_root"] == str(config_file.parent / "lake-here")
    lake = Lake.from_environment(loaded=load_config(config_file, "prod", environ={}))
    assert lake.root == str(config_file.parent / "lake-here") and lake.erasure_key == "k" * 64
    bad = runner.invoke(main, ["--config", str(config_file), "--profile", "nope", "status"])
    assert bad.exit_code == 2 and "no profile 'nope'" in bad.output


def test_the_published_schema_and_example_are_the_model_s() -> None:
    assert json.loads((DOCS / "lakehouse.schema.json").read_text()) == schema(), \
        "docs/lakehouse.schema.json is behind the model: `lakehouse config schema > docs/lakehouse.schema.json`"
    for profile in ("local", "compose", "emr"):
        load_config(DOCS / "lakehouse.example.toml", profile, environ={})
