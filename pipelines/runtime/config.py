"""The pipeline's configuration: one file, `lakehouse.toml`, with profiles, checked whole by a typed model before
anything runs.

Where each setting comes from, strongest first: a command-line flag, an environment variable, the chosen
profile's section (`[profiles.<name>.<section>]`), the file's own section (`[<section>]`, every profile's),
the defaults below. The file is `--config`, else `LAKEHOUSE_CONFIG`, else `./lakehouse.toml`, else none (the
defaults: the embedded local stack of a checkout); the profile is `--profile`, else `LAKEHOUSE_PROFILE`, else
`local`. Every setting has an environment variable, `LAKEHOUSE_<SECTION>_<KEY>`; the older names
(`LAKEHOUSE_ROOT`, `KAFKA_BOOTSTRAP_SERVERS`, ...) are kept as aliases (`ALIASES`).

Secrets are never values, in the file or in these variables: a secret setting names where the secret is
(`{ env = "NAME" }`, `{ file = "path" }`, `{ airflow_connection = "id" }`, `{ aws_secret = "arn" }`), and is read
only when a client needs it (`Secret.reveal`). A literal value is refused, naming the key.
"""

from __future__ import annotations

import importlib.resources
import json
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator, model_validator

from pipelines.errors import LakehouseError, SecretError, SettingError
from pipelines.runtime import airflow_connections as connections

CONFIG_VARIABLE = "LAKEHOUSE_CONFIG"
PROFILE_VARIABLE = "LAKEHOUSE_PROFILE"
DEFAULT_FILE = Path("lakehouse.toml")
DEFAULT_PROFILE = "local"
# In lakehouse.zip only: the configuration the EMR steps run with (`lakehouse package`, pipelines/deploy/package.py),
# read when no file is given: a cluster's node has no file of the machine that built the bundle.
BUNDLED_FILE = "bundled.toml"


class _Section(BaseModel):
    """A section of the file: an unknown key or a value of the wrong type fails, naming both."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Secret(_Section):
    """Where a secret is, never the secret: exactly one of an environment variable, a file, an Airflow Connection's
    password, an AWS Secrets Manager secret (name or ARN; how EMR steps get theirs)."""

    env: str | None = None
    file: Path | None = None
    airflow_connection: str | None = None
    aws_secret: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _not_a_value(cls, value: Any) -> Any:
        if isinstance(value, str):
            raise ValueError('a secret is never a value here: say where it is, { env = "NAME" }, { file = "path" }, '
                             '{ airflow_connection = "id" } or { aws_secret = "arn" }')
        return value

    @model_validator(mode="after")
    def _one_place(self) -> Secret:
        given = [k for k in ("env", "file", "airflow_connection", "aws_secret") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"a secret is in exactly one place (env, file, airflow_connection or aws_secret); "
                             f"got {', '.join(given) or 'none'}")
        return self

    def where(self) -> str:
        """Where the secret is, as `config show` prints it: the place, never the value."""
        kind, place = next((k, v) for k, v in self.model_dump().items() if v is not None)
        return f"<secret: {kind} {place}>"

    def reveal(self) -> str:
        """The secret's value, read now; SecretError naming the place when it is not there."""
        if self.env is not None:
            if not (value := os.environ.get(self.env)):
                raise SecretError(f"the secret's environment variable {self.env} is not set")
            return value
        if self.file is not None:
            try:
                return self.file.read_text().strip()
            except OSError as exc:
                raise SecretError(f"the secret's file {self.file} cannot be read ({exc.strerror})") from exc
        if self.airflow_connection is not None:
            return _airflow_password(self.airflow_connection)
        assert self.aws_secret is not None
        from pipelines.runtime.secrets import secrets_manager_value

        return secrets_manager_value(self.aws_secret)


def _problems(exc: ValidationError, section: str) -> str:
    """A validation's errors in one line, each with the key it is about."""
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or section}: {e['msg'].removeprefix('Value error, ')}"
                     for e in exc.errors())


def _airflow_password(connection_id: str) -> str:
    """The password of an Airflow Connection (pipelines.runtime.airflow_connections says where it is read from)."""
    if not (password := connections.read(connection_id).password):
        raise SecretError(f"Airflow Connection {connection_id!r} has no password")
    return password


class LakeSettings(_Section):
    """The lake: where it is, which tables it holds, the key of its pseudonyms."""

    root: str | None = None  # a path or a URI (s3://...); none: lake/ in the checkout
    tables: str | None = None  # the declaration file; none: the packaged one
    erasure_key: Secret | None = None  # none: a key file outside the lake, made on first use
    hudi_overrides: tuple[str, ...] = ()  # TOML files of Hudi and Spark options over hudi_configs/


class KafkaSettings(_Section):
    """The brokers and how to reach them: the same for the stream, every client, the probes and the EMR steps."""

    bootstrap_servers: str = "127.0.0.1:9092"
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "AWS_MSK_IAM"] | None = None
    sasl_username: str | None = None
    sasl_password: Secret | None = None
    ssl_ca_file: Path | None = None  # the CA that signed the brokers' certificates; none: the system's
    ssl_cert_file: Path | None = None  # a client certificate (mutual TLS)
    ssl_key_file: Path | None = None
    ssl_key_password: Secret | None = None
    ssl_check_hostname: bool = True

    @model_validator(mode="after")
    def _authentication_whole(self) -> KafkaSettings:
        sasl = self.security_protocol.startswith("SASL_")
        if sasl and self.sasl_mechanism is None:
            raise ValueError(f"security_protocol {self.security_protocol} needs a sasl_mechanism")
        if not sasl and self.sasl_mechanism is not None:
            raise ValueError(f"sasl_mechanism {self.sasl_mechanism} needs a SASL_SSL or SASL_PLAINTEXT "
                             f"security_protocol (it is {self.security_protocol})")
        if self.sasl_mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512") \
                and (self.sasl_username is None or self.sasl_password is None):
            raise ValueError(f"sasl_mechanism {self.sasl_mechanism} needs sasl_username and sasl_password")
        if (self.ssl_cert_file is None) != (self.ssl_key_file is None):
            raise ValueError("a client certificate needs both ssl_cert_file and ssl_key_file")
        return self


class _Endpoint(_Section):
    """A section whose endpoint may be an Airflow Connection (`airflow_connection`) instead of its own keys: then
    those keys (`FROM_CONNECTION`) are the Connection's, and setting one beside it is refused, naming it; the
    Connection is read when the endpoint is used (`endpoint`), never when the file is loaded."""

    FROM_CONNECTION: ClassVar[tuple[str, ...]] = ()
    SECTION: ClassVar[str] = ""

    airflow_connection: str | None = None  # first: the keys' validators below see it

    @field_validator("*")
    @classmethod
    def _not_beside_connection(cls, value: Any, info: ValidationInfo) -> Any:
        """A key of the endpoint given beside `airflow_connection` (a default is never validated: only what is set)."""
        if (conn_id := info.data.get("airflow_connection")) and info.field_name in cls.FROM_CONNECTION:
            raise ValueError(f"[{cls.SECTION}] airflow_connection = {conn_id!r} gives the endpoint ("
                             f"{', '.join(cls.FROM_CONNECTION)}): {info.field_name} is the Connection's, not set "
                             "here (remove it, or airflow_connection)")
        return value

    def endpoint(self) -> Self:
        """These settings with the endpoint of `airflow_connection` read now (themselves without one), checked as
        the file's keys are (a Connection's bad port or sslmode is refused as the file's is): SettingError naming
        the Connection when it is not of the section's kind, lacks a field or holds a bad value."""
        if self.airflow_connection is None:
            return self
        conn = connections.read(self.airflow_connection)
        values = connections.source_values(conn) if self.SECTION == "source" \
            else connections.connect_values(conn)
        kept = self.model_dump(exclude={"airflow_connection", *self.FROM_CONNECTION})
        try:
            return type(self).model_validate({**kept, **values})
        except ValidationError as exc:
            raise SettingError(f"{conn.named()} ([{self.SECTION}] airflow_connection): {_problems(exc, self.SECTION)}"
                               ) from None

    def shown(self) -> dict[str, str]:
        """What `config show` prints of the keys the Connection gives, without reading it: where they are."""
        if self.airflow_connection is None:
            return {}
        return dict.fromkeys(self.FROM_CONNECTION, f"<Airflow Connection {self.airflow_connection}>")


class SourceSettings(_Endpoint):
    """The PostgreSQL database whose changes Debezium captures, as the source commands reach it (`lakehouse source
    sync|check`, `lakehouse doctor`), and the names Debezium's connector uses there. `airflow_connection`: the
    database is a postgres Connection's (host, port, login, password, schema the database, extra `sslmode` and
    `sslrootcert`)."""

    FROM_CONNECTION: ClassVar[tuple[str, ...]] = ("host", "port", "database", "user", "password", "sslmode",
                                                  "sslrootcert")
    SECTION: ClassVar[str] = "source"

    host: str = "127.0.0.1"
    port: int = 5433
    database: str = "shop"
    user: str = "postgres"
    password: Secret | None = None  # none: the server asks for none (the local dev source)
    sslmode: Literal["disable", "allow", "prefer", "require", "verify-ca", "verify-full"] = "prefer"
    sslrootcert: Path | None = None  # the CA that signed the server's certificate (verify-ca, verify-full)
    publication: str = "shop_publication"
    slot: str = "shop_debezium"
    signal_table: str = "public.debezium_signal"

    @model_validator(mode="after")
    def _verified_against_a_ca(self) -> SourceSettings:
        if self.sslmode in ("verify-ca", "verify-full") and self.sslrootcert is None:
            raise ValueError(f"sslmode {self.sslmode} needs sslrootcert, the CA that signed the server's certificate")
        return self


class ConnectSettings(_Endpoint):
    """The Kafka Connect cluster that runs Debezium, and the connector's name there (the connector watchdog).
    `airflow_connection`: the REST API is an http or https Connection's (host, with its scheme or the scheme as
    conn_type or schema; port; login and password, basic authentication; extra `ssl_ca_file`)."""

    FROM_CONNECTION: ClassVar[tuple[str, ...]] = ("url", "username", "password", "ssl_ca_file")
    SECTION: ClassVar[str] = "connect"

    url: str = "http://127.0.0.1:8083"
    connector: str = "shop-source"
    username: str | None = None  # HTTP basic authentication of the REST API; none: an open REST port
    password: Secret | None = None
    ssl_ca_file: Path | None = None  # the CA of an https:// REST API; none: the system's

    @model_validator(mode="after")
    def _both_or_neither(self) -> ConnectSettings:
        if (self.username is None) != (self.password is None):
            raise ValueError("basic authentication needs both username and password")
        return self

    @field_validator("url")
    @classmethod
    def _http(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"{url!r}: expected an http:// or https:// URL")
        return url.rstrip("/")


class CatalogSettings(_Section):
    """The catalog the tables are registered in by name: a Hive Metastore (thrift://), or Glue on EMR."""

    metastore_uri: str | None = None


class MetricsSettings(_Section):
    """Where the batch jobs push their metrics."""

    pushgateway: str | None = None  # host:port; none: the batch jobs push nothing


class SparkSettings(_Section):
    """Where Spark runs."""

    target: Literal["local", "emr"] = "local"
    master: str | None = None  # spark://host:port, a standalone cluster; none: local[2]
    table_services: Literal["inline", "external"] | None = None  # none: the target's default


class Config(_Section):
    """The whole configuration, every section with its defaults."""

    lake: LakeSettings = LakeSettings()
    kafka: KafkaSettings = KafkaSettings()
    source: SourceSettings = SourceSettings()
    connect: ConnectSettings = ConnectSettings()
    catalog: CatalogSettings = CatalogSettings()
    metrics: MetricsSettings = MetricsSettings()
    spark: SparkSettings = SparkSettings()


SECTIONS: dict[str, type[_Section]] = {name: f.annotation for name, f in Config.model_fields.items()}  # type: ignore[misc]
# The variables the project read before the file existed, still honoured (and what `config show` names).
ALIASES = {"LAKEHOUSE_ROOT": ("lake", "root"), "LAKEHOUSE_TABLES": ("lake", "tables"),
           "LAKEHOUSE_HUDI_OVERRIDES": ("lake", "hudi_overrides"),
           "KAFKA_BOOTSTRAP_SERVERS": ("kafka", "bootstrap_servers"),
           "LAKEHOUSE_CONNECT_URL": ("connect", "url"), "LAKEHOUSE_CONNECTOR": ("connect", "connector"),
           "LAKEHOUSE_METASTORE_URI": ("catalog", "metastore_uri"),
           "LAKEHOUSE_PUSHGATEWAY": ("metrics", "pushgateway"),
           "LAKEHOUSE_TARGET": ("spark", "target"), "LAKEHOUSE_SPARK_MASTER": ("spark", "master"),
           "LAKEHOUSE_TABLE_SERVICES": ("spark", "table_services")}


@dataclass(frozen=True)
class Loaded:
    """The effective configuration, where each setting came from (`section.key` -> its source), the file and
    the profile it was read with."""

    config: Config
    sources: dict[str, str] = field(default_factory=dict)
    path: Path | None = None
    profile: str = DEFAULT_PROFILE


def config_path(given: Path | None = None, environ: Mapping[str, str] = os.environ) -> Path | None:
    """The file to read: `given` (--config), else LAKEHOUSE_CONFIG, else ./lakehouse.toml if it exists, else none."""
    if given is not None:
        return given
    if named := environ.get(CONFIG_VARIABLE):
        return Path(named)
    return DEFAULT_FILE if DEFAULT_FILE.is_file() else None


def load_config(path: Path | None = None, profile: str | None = None, environ: Mapping[str, str] = os.environ,
                flags: Mapping[str, Any] | None = None) -> Loaded:
    """The configuration from the file, the profile, the environment and `flags` (`section.key` -> value), checked
    whole; SettingError naming the file, the section and the key of what is wrong."""
    path = config_path(path, environ)
    profile = profile or environ.get(PROFILE_VARIABLE) or DEFAULT_PROFILE
    layers: dict[str, dict[str, Any]] = {}
    sources: dict[str, str] = {}
    document = _read(path) if path is not None else _bundled()
    for name, section in document.items():
        if name != "profiles":
            _layer(layers, sources, name, section, f"{path or 'the bundle'} [{name}]", path)
    profiles = document.get("profiles", {})
    if profile not in profiles and profile != DEFAULT_PROFILE:
        raise SettingError(f"{path}: no profile {profile!r} (profiles: {', '.join(profiles) or 'none'})" if path
                           else f"profile {profile!r} ({PROFILE_VARIABLE} or --profile) needs a configuration file: "
                                f"none given ({CONFIG_VARIABLE}, --config) and no {DEFAULT_FILE} here")
    for name, section in profiles.get(profile, {}).items():
        _layer(layers, sources, name, section, f"{path} [profiles.{profile}.{name}]", path)
    for variable, (name, key) in _variables(environ).items():
        _layer(layers, sources, name, {key: _from_text(name, key, environ[variable], variable)}, f"env {variable}",
               None)
    for dotted, value in (flags or {}).items():
        name, _, key = dotted.partition(".")
        _layer(layers, sources, name, {key: value}, f"flag {dotted}", None)
    try:
        config = Config.model_validate(layers)
    except ValidationError as exc:
        raise SettingError(_explain(exc, sources, path)) from None
    return Loaded(config, sources, path, profile)


def _bundled() -> dict[str, Any]:
    """The bundle's configuration (BUNDLED_FILE beside this module, inside lakehouse.zip), else nothing."""
    found = importlib.resources.files(__package__ or "pipelines.runtime") / BUNDLED_FILE
    return tomllib.loads(found.read_text()) if found.is_file() else {}


def config_text(config: Config, heading: str) -> str:
    """`config` as a file of sections without profiles, `heading` its first comment: every value written, resolved
    as `config` holds it (paths absolute, secrets as where they are), so that the file loads to `config` again
    (the EMR bundle's BUNDLED_FILE, pipelines/deploy/package.py)."""
    lines = [f"# {heading}"]
    for name, section in config.model_dump(mode="json", exclude_none=True).items():
        given = getattr(config, name).shown() if isinstance(getattr(config, name), _Endpoint) else {}
        lines += ["", f"[{name}]", *(f"{key} = {_toml(value)}" for key, value in section.items() if key not in given)]
    return "\n".join(lines) + "\n"


def _toml(value: Any) -> str:
    """A TOML value of the JSON-like `value` (a JSON string is a TOML basic string)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items() if v is not None) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value)


def _read(path: Path) -> dict[str, Any]:
    """The file's TOML, its top level checked: sections and `profiles` only."""
    try:
        document = tomllib.loads(path.read_text())
    except OSError as exc:
        raise SettingError(f"{path}: cannot be read ({exc.strerror})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise SettingError(f"{path}: not valid TOML: {exc}") from exc
    if unknown := sorted(set(document) - {*SECTIONS, "profiles"}):
        raise SettingError(f"{path}: unknown section(s) {', '.join(unknown)} (sections: {', '.join(SECTIONS)}, "
                           "profiles)")
    for profile, sections in document.get("profiles", {}).items():
        if not isinstance(sections, dict):
            raise SettingError(f"{path}: [profiles.{profile}]: expected sections, got {sections!r}")
        if unknown := sorted(set(sections) - set(SECTIONS)):
            raise SettingError(f"{path}: [profiles.{profile}]: unknown section(s) {', '.join(unknown)} "
                               f"(sections: {', '.join(SECTIONS)})")
    return document


def _layer(layers: dict[str, dict[str, Any]], sources: dict[str, str], name: str, values: Any, source: str,
           path: Path | None) -> None:
    """Put `values` of section `name` over what is there, each key's source recorded."""
    if not isinstance(values, dict):
        raise SettingError(f"{source}: expected a table of settings, got {values!r}")
    section = layers.setdefault(name, {})
    for key, value in values.items():
        if path is not None and key in _PATH_KEYS:
            value = [_beside(path, v) for v in value] if isinstance(value, list) else _beside(path, value)
        elif path is not None and isinstance(value, dict) and "file" in value:  # a secret's file
            value = {**value, "file": _beside(path, value["file"])}
        section[key] = value
        sources[f"{name}.{key}"] = source


# Settings that are paths: a relative one in the file is relative to the file, as a reader expects.
_PATH_KEYS = {"root", "tables", "hudi_overrides", "ssl_ca_file", "ssl_cert_file", "ssl_key_file",
              "sslrootcert"}


def _beside(path: Path, value: Any) -> Any:
    """A path setting of the file `path` made absolute from the file's folder; a URI (s3://...) as it is."""
    if not isinstance(value, str) or "://" in value or Path(value).is_absolute():
        return value
    return str((path.parent / value).resolve())


def _variables(environ: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """The environment's settings: LAKEHOUSE_<SECTION>_<KEY> and the aliases, the latter first (weaker)."""
    found = {v: target for v, target in ALIASES.items() if environ.get(v)}
    for variable, value in environ.items():
        if not variable.startswith("LAKEHOUSE_") or not value or variable in ALIASES:
            continue
        name, _, key = variable.removeprefix("LAKEHOUSE_").lower().partition("_")
        if name in SECTIONS and key in SECTIONS[name].model_fields:
            found[variable] = (name, key)
    return found


def _from_text(name: str, key: str, text: str, variable: str) -> Any:
    """An environment variable's text as the setting's value: a list of paths split at `os.pathsep`; a secret
    refused (say where it is in the file instead)."""
    annotation = str(SECTIONS[name].model_fields[key].annotation)
    if "Secret" in annotation:
        raise SettingError(f"{variable}: a secret is never a value in the environment either; in the file, "
                           f'[{name}] {key} = {{ env = "{variable}" }} names the variable that holds it')
    if "tuple" in annotation:
        return tuple(p for p in text.split(os.pathsep) if p)
    return text


def _explain(exc: ValidationError, sources: dict[str, str], path: Path | None) -> str:
    """Every error of the model, each naming where the wrong value came from and its section and key."""
    lines = []
    for error in exc.errors():
        where = [str(p) for p in error["loc"] if not str(p).startswith(("function-", "tagged-"))]
        dotted = ".".join(where[:2])
        source = sources.get(dotted) or (f"{path}" if path else "the defaults")
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "extra_forbidden" and len(where) == 2 and where[0] in SECTIONS:
            message = f"unknown key (the keys of [{where[0]}]: {', '.join(SECTIONS[where[0]].model_fields)})"
        lines.append(f"{source}: {'.'.join(where) or 'the configuration'}: {message}")
    return "the configuration is wrong:\n  " + "\n  ".join(lines)


def effective(loaded: Loaded) -> list[tuple[str, Any, str]]:
    """Every setting as `config show` prints it: (`section.key`, value with secrets masked, where it came from)."""
    rows = []
    for name in SECTIONS:
        section = getattr(loaded.config, name)
        given = _from_connection(section) if isinstance(section, _Endpoint) else {}
        for key in type(section).model_fields:
            value = getattr(section, key)
            shown = value.where() if isinstance(value, Secret) else value
            source = loaded.sources.get(f"{name}.{key}", "default")
            if key in given:  # the Connection's, read when the endpoint is used: where it is, not its value
                shown, source = given[key], f"Airflow Connection {section.airflow_connection}"
            rows.append((f"{name}.{key}", shown, source))
    return rows


def _from_connection(section: _Endpoint) -> dict[str, Any]:
    """The keys an endpoint's Connection gives, as `config show` prints them: its values (the password as where it
    is) when the Connection can be read here, else where they are."""
    if section.airflow_connection is None:
        return {}
    try:
        resolved = section.endpoint()
    except LakehouseError:
        return section.shown()
    values = {key: getattr(resolved, key) for key in section.FROM_CONNECTION}
    return {key: value.where() if isinstance(value, Secret) else value for key, value in values.items()}


def airflow_connections(config: Config) -> list[str]:
    """The ids of the Airflow Connections `config` names: an endpoint's (`[source]`, `[connect]`) and every secret's
    (`{ airflow_connection = "id" }`), each once, in the sections' order."""
    found: list[str] = []
    for name in SECTIONS:
        section = getattr(config, name)
        values = [section.airflow_connection] if isinstance(section, _Endpoint) else []
        values += [v.airflow_connection for v in (getattr(section, k) for k in type(section).model_fields)
                   if isinstance(v, Secret)]
        found += [v for v in values if v is not None and v not in found]
    return found


def export(loaded: Loaded, environ: dict[str, str] | os._Environ[str] = os.environ) -> None:
    """Put the effective settings into `environ` under their variables (`ALIASES`), and the file and profile
    under LAKEHOUSE_CONFIG and LAKEHOUSE_PROFILE: what the code that still reads a variable, and every job this
    process starts (the supervised stream, spark-submit, an EMR step's environment), then find. Secrets are never
    put there: a job reads the file and reveals them itself."""
    if loaded.path is not None:
        environ[CONFIG_VARIABLE] = str(loaded.path.resolve())
        environ[PROFILE_VARIABLE] = loaded.profile
    for variable, (name, key) in ALIASES.items():
        if f"{name}.{key}" not in loaded.sources:
            continue
        value = getattr(getattr(loaded.config, name), key)
        if value is not None:
            environ[variable] = os.pathsep.join(value) if isinstance(value, tuple) else str(value)
