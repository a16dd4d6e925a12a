"""The EMR code bundle stands on its own: its packages and TOML files load from the zip alone."""

from __future__ import annotations

import json
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import pipelines
from pipelines.deploy.package import build
from pipelines.runtime.config import load_config
from pipelines.runtime.declared import read_declaration

pytestmark = pytest.mark.unit

# Run with -S (no site-packages, so not the checkout's editable install): only the zip is on the path.
PROBE = """
import sys
sys.path.insert(0, sys.argv[1])
import hudi_configs, pipelines.deploy.jobs
assert hudi_configs.__file__.startswith(sys.argv[1]), hudi_configs.__file__
options = hudi_configs.writer("bronze", "changelog")
assert options["hoodie.clean.policy"] == "KEEP_LATEST_BY_HOURS"
step = pipelines.deploy.jobs.SparkJob("etl", ("etl",), {"LAKEHOUSE_TABLES": "/here/t.toml"}).emr_step("s3://code/lakehouse")
print(" ".join(step["HadoopJarStep"]["Args"]))
import pipelines.lake.declaration
decl = pipelines.lake.declaration.load(pipelines.lake.declaration.packaged())
print("declared:", decl.path, ",".join(decl.names))
"""

# Run with -S too, with the environment's libraries (click, pyarrow) put back by hand: site's .pth
# files would install this checkout's editable finder, which finds `lakehouse_dev` beside the zip.
CLI_PROBE = """
import sys
sys.path.insert(0, sys.argv[1])
sys.path.extend(sys.argv[2:])
import pipelines.cli.app
assert pipelines.cli.app.__file__.startswith(sys.argv[1]), pipelines.cli.app.__file__
print(" ".join(pipelines.cli.app.main.commands))
from pipelines.runtime.config import load_config
print("config:", load_config(environ={}).config.model_dump_json())
"""


def test_bundle_loads_from_the_zip_and_pins_what_the_cluster_lacks(tmp_path, monkeypatch) -> None:
    # The declaration in force where the bundle is built travels inside it: the cluster has no such file.
    declaration = tmp_path / "ours.toml"
    shop = (Path(pipelines.__file__).parent / "lake" / "shop_tables.toml").read_text()
    declaration.write_text(shop.replace("[tables.orders]", "[tables.purchases]")
                           .replace("tables.orders.", "tables.purchases."))
    monkeypatch.setenv("LAKEHOUSE_TABLES", str(declaration))
    # The configuration of the profile it is built with travels too, written out: the cluster has no file either.
    (tmp_path / "lakehouse.toml").write_text(
        '[kafka]\nbootstrap_servers = "local:9092"\n\n[profiles.emr.kafka]\nbootstrap_servers = "b-1.msk:9098"\n'
        'security_protocol = "SASL_SSL"\nsasl_mechanism = "AWS_MSK_IAM"\n\n[profiles.emr.lake]\n'
        'root = "s3://lake/prod"\nerasure_key = { aws_secret = "arn:aws:secretsmanager:eu-west-1:1:secret:k" }\n')
    config = load_config(tmp_path / "lakehouse.toml", "emr", environ={}).config
    files = {p.name: p for p in build(tmp_path / "bundle", read_declaration(), config)}
    monkeypatch.delenv("LAKEHOUSE_TABLES")
    assert set(files) == {"lakehouse.zip", "cli.py", "requirements.txt", "bootstrap.sh", "aws-msk-iam-auth.jar"}
    names = zipfile.ZipFile(files["lakehouse.zip"]).namelist()
    assert {"pipelines/cli/app.py", "hudi_configs/__init__.py", "hudi_configs/bronze.toml"} <= set(names)
    assert not [n for n in names if "__pycache__" in n or n.startswith(("tests/", "dev/lakehouse_dev/"))]

    probe = subprocess.run([sys.executable, "-S", "-c", PROBE, str(files["lakehouse.zip"])],
                           capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, probe.stderr
    assert "--py-files s3://code/lakehouse/lakehouse.zip s3://code/lakehouse/cli.py etl" in probe.stdout
    assert "spark.pyspark.python=/usr/bin/python3.11" in probe.stdout
    assert "LAKEHOUSE_TABLES" not in probe.stdout, "a path of the machine that built the step"
    assert "declared: " in probe.stdout and "tables.toml customers,purchases" in probe.stdout, probe.stdout

    # The bundle's CLI, from the zip (with the environment's click and pyarrow): the pipeline's
    # commands, none of the dev tools'.
    cli = subprocess.run([sys.executable, "-S", "-c", CLI_PROBE, str(files["lakehouse.zip"]), *site.getsitepackages()],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    assert set(cli.stdout.split()) >= {"ingest", "etl", "gdpr", "services", "quality", "stream", "source"}, cli.stdout
    assert not set(cli.stdout.split()) & {"dev", "generate", "kafka", "s3", "bench"}, cli.stdout
    bundled = json.loads(cli.stdout.split("config: ", 1)[1])
    assert bundled["kafka"] == {**config.kafka.model_dump(mode="json")} and bundled["kafka"]["sasl_mechanism"] == \
        "AWS_MSK_IAM"
    assert bundled["lake"]["root"] == "s3://lake/prod" and bundled["lake"]["erasure_key"]["aws_secret"].endswith(":k")

    pins = files["requirements.txt"].read_text().split()
    assert all("==" in p for p in pins) and not [p for p in pins if p.startswith("pyspark")], pins
    assert {p.split("==")[0] for p in pins} >= {"kafka-python", "great-expectations", "click"}
    assert subprocess.run(["bash", "-n", str(files["bootstrap.sh"])]).returncode == 0
    assert "python3.11 -m pip install" in files["bootstrap.sh"].read_text()
