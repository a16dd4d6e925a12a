"""`[source]` and `[connect]` from an Airflow Connection (pipelines/runtime/airflow_connections.py): both forms of
`AIRFLOW_CONN_<ID>`, what a file may set beside it, and `config show` naming it, the password never shown."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines.errors import SecretError, SettingError
from pipelines.runtime.airflow_connections import parse
from pipelines.runtime.config import airflow_connections, config_text, effective, load_config

pytestmark = pytest.mark.unit

PASSWORD = "s3cr3t/p@ss"
SOURCE_JSON = json.dumps({"conn_type": "postgres", "host": "db.internal", "port": 6432, "login": "lake",
                          "password": PASSWORD, "schema": "shop",
                          "extra": {"sslmode": "verify-full", "sslrootcert": "/etc/ca.pem"}})
SOURCE_URI = "postgresql://lake:s3cr3t%2Fp%40ss@db.internal:6432/shop?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem"
FILE = """
[source]
airflow_connection = "lakehouse_source"
slot = "lake_slot"

[connect]
airflow_connection = "lakehouse_connect"
connector = "pg"
"""


@pytest.mark.parametrize("text", [SOURCE_JSON, SOURCE_URI], ids=["json", "uri"])
def test_both_forms_give_the_same_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    (tmp_path / "lakehouse.toml").write_text(FILE)
    monkeypatch.setenv("AIRFLOW_CONN_LAKEHOUSE_SOURCE", text)
    config = load_config(tmp_path / "lakehouse.toml", environ={}).config
    source = config.source.endpoint()
    assert (source.host, source.port, source.database, source.user, source.sslmode, str(source.sslrootcert),
            source.slot) == ("db.internal", 6432, "shop", "lake", "verify-full", "/etc/ca.pem", "lake_slot")
    assert source.password is not None and source.password.reveal() == PASSWORD
    assert PASSWORD not in repr(source) and PASSWORD not in repr(parse("lakehouse_source", text))
    assert airflow_connections(config) == ["lakehouse_source", "lakehouse_connect"]


@pytest.mark.parametrize("text, url", [
    (json.dumps({"conn_type": "http", "host": "https://connect.internal", "port": 8443, "login": "admin",
                 "password": PASSWORD, "extra": {"ssl_ca_file": "/etc/ca.pem"}}), "https://connect.internal:8443"),
    (json.dumps({"conn_type": "http", "schema": "https", "host": "connect.internal", "login": "admin",
                 "password": PASSWORD, "extra": {"ssl_ca_file": "/etc/ca.pem"}}), "https://connect.internal"),
    ("https://admin:s3cr3t%2Fp%40ss@connect.internal:8443?ssl_ca_file=%2Fetc%2Fca.pem", "https://connect.internal:8443"),
], ids=["json-host-with-scheme", "json-schema", "uri"])
def test_connect_from_a_connection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, url: str) -> None:
    (tmp_path / "lakehouse.toml").write_text(FILE)
    monkeypatch.setenv("AIRFLOW_CONN_LAKEHOUSE_CONNECT", text)
    connect = load_config(tmp_path / "lakehouse.toml", environ={}).config.connect.endpoint()
    assert (connect.url, connect.username, str(connect.ssl_ca_file), connect.connector) == \
        (url, "admin", "/etc/ca.pem", "pg")
    assert connect.password is not None and connect.password.reveal() == PASSWORD


def test_a_key_beside_the_connection_is_refused_naming_file_section_and_key(tmp_path: Path) -> None:
    path = tmp_path / "lakehouse.toml"
    path.write_text(FILE.replace('slot = "lake_slot"', 'host = "db"'))
    with pytest.raises(SettingError, match=rf"{path} \[source\]: source.host: \[source\] airflow_connection = "
                                           r"'lakehouse_source' gives the endpoint"):
        load_config(path, environ={})
    with pytest.raises(SettingError, match=r"env LAKEHOUSE_CONNECT_URL: connect.url: .*url is the Connection's"):
        load_config(tmp_path / "lakehouse.toml", environ={"LAKEHOUSE_CONNECT_URL": "http://x:1"})


def test_resolved_lazily_and_named_when_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading reads no Connection; using the endpoint without one says which variable it looked for."""
    (tmp_path / "lakehouse.toml").write_text(FILE)
    monkeypatch.delenv("AIRFLOW_CONN_LAKEHOUSE_SOURCE", raising=False)
    config = load_config(tmp_path / "lakehouse.toml", environ={}).config
    with pytest.raises(SecretError, match="AIRFLOW_CONN_LAKEHOUSE_SOURCE is not set"):
        config.source.endpoint()
    monkeypatch.setenv("AIRFLOW_CONN_LAKEHOUSE_SOURCE", json.dumps({"conn_type": "http", "host": "h"}))
    with pytest.raises(SettingError, match="conn_type 'http', expected postgres"):
        config.source.endpoint()
    monkeypatch.setenv("AIRFLOW_CONN_LAKEHOUSE_SOURCE", "{not json " + PASSWORD)
    with pytest.raises(SecretError, match="AIRFLOW_CONN_LAKEHOUSE_SOURCE: not an Airflow Connection") as caught:
        config.source.endpoint()
    assert PASSWORD not in str(caught.value)


def test_config_show_names_the_connection_never_the_password(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "lakehouse.toml").write_text(FILE)
    loaded = load_config(tmp_path / "lakehouse.toml", environ={})
    monkeypatch.delenv("AIRFLOW_CONN_LAKEHOUSE_SOURCE", raising=False)
    rows = {k: (v, source) for k, v, source in effective(loaded)}
    assert rows["source.host"] == ("<Airflow Connection lakehouse_source>", "Airflow Connection lakehouse_source")
    monkeypatch.setenv("AIRFLOW_CONN_LAKEHOUSE_SOURCE", SOURCE_JSON)
    rows = {k: (v, source) for k, v, source in effective(loaded)}
    assert rows["source.host"] == ("db.internal", "Airflow Connection lakehouse_source")
    assert rows["source.password"][0] == "<secret: airflow_connection lakehouse_source>"
    assert PASSWORD not in repr(rows)
    # The bundle's file (config_text) keeps the Connection, not the defaults beside it: it loads again.
    (tmp_path / "again.toml").write_text(config_text(loaded.config, "again"))
    assert load_config(tmp_path / "again.toml", environ={}).config == loaded.config
