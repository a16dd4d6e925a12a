"""The EMR target's code bundle: what `lakehouse_code_uri` (an s3:// prefix) must hold.

An EMR step runs `spark-submit --deploy-mode cluster --py-files <uri>/lakehouse.zip <uri>/cli.py`
(pipelines/deploy/jobs.py). The cluster brings Spark and the Hudi bundle; the bundle brings the rest:

- `lakehouse.zip` (pipelines/runtime/code_archive.py): the `pipelines` and `hudi_configs` packages, TOML
  files included (they are read through importlib.resources, which reads them inside the zip), without the dev tools
  (`dev/lakehouse_dev`: the generator, the local services and the benchmarks; the CLI then
  offers the pipeline's commands only);
  and the declaration of tables in force where it is built (`LAKEHOUSE_TABLES`, or the shop's) as
  `pipelines/lake/tables.toml`, which the jobs on the cluster read (`pipelines.lake.declaration`): a
  declaration changed here reaches EMR with the next `lakehouse package` and upload; and the configuration of
  the profile it is built with (`lakehouse --profile emr package`), its file's values alone (not this machine's
  environment), every setting written out, as `pipelines/runtime/bundled.toml`, which the jobs read when given
  no file (pipelines.runtime.config);
- `cli.py`: the entry point, pipelines/cli/__main__.py as is;
- `aws-msk-iam-auth.jar`: Amazon MSK's IAM login for Spark's Kafka source (`[kafka] sasl_mechanism =
  "AWS_MSK_IAM"`), on every step's classpath (`--jars`); resolved by `make setup` from jvm/pom.xml;
- `requirements.txt`: the project's pure-Python dependencies, pinned as installed here,
  without pyspark (the cluster's own Spark is used);
- `bootstrap.sh`: the cluster's bootstrap action (argument: the code URI). The code needs
  Python 3.11 (tomllib, datetime.UTC) and EMR 7's system Python is 3.9, so it installs
  python3.11 from Amazon Linux 2023's repository and the requirements into it;
  spark.toml [emr] points PySpark at that interpreter.

Pure Python: no Spark is needed to build it.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from pipelines.deploy.jobs import MSK_IAM_JAR
from pipelines.errors import SetupError
from pipelines.lake.declaration import Declaration
from pipelines.runtime.code_archive import write_archive
from pipelines.runtime.config import Config, config_text
from pipelines.runtime.settings import PROJECT_ROOT, jvm_dir

DISTRIBUTION = "lakehouse-cdc"

# Provided by the cluster.
NOT_SHIPPED = {"pyspark"}
PYTHON = "/usr/bin/python3.11"

BOOTSTRAP = """#!/bin/bash
# EMR bootstrap action of the lakehouse jobs: Python 3.11 and the jobs' dependencies on every node.
# Argument: the code URI (the s3:// prefix that holds this file and requirements.txt).
set -euo pipefail
code_uri="${{1:?usage: bootstrap.sh s3://bucket/prefix}}"
sudo dnf install -y python3.11 python3.11-pip
aws s3 cp "${{code_uri%/}}/requirements.txt" /tmp/lakehouse-requirements.txt
sudo {python} -m pip install --quiet -r /tmp/lakehouse-requirements.txt
"""


def requirements() -> list[str]:
    """`name==version` of each runtime dependency of the project, as installed in this environment."""
    pins = []
    for spec in metadata.requires(DISTRIBUTION) or []:
        if "extra ==" in spec:
            continue
        name = spec.split(";")[0].strip()
        for sep in ("==", ">=", "<=", "~=", ">", "<", "["):
            name = name.split(sep)[0]
        name = name.strip()
        if name.lower() not in NOT_SHIPPED:
            pins.append(f"{name}=={metadata.version(name)}")
    return sorted(pins, key=str.lower)


def build(out: Path, decl: Declaration, config: Config | None = None) -> list[Path]:
    """Write the bundle into `out`, with `decl` as the tables its jobs declare and `config` as their configuration
    (none: the defaults); returns its files."""
    out.mkdir(parents=True, exist_ok=True)
    config = config or Config()
    # The declaration travels in the bundle on its own: a path of this machine in [lake] tables would mislead.
    steps = config.model_copy(update={"lake": config.lake.model_copy(update={"tables": None})})
    archive = write_archive(out / "lakehouse.zip", decl,
                            config_text(steps, "The EMR steps' configuration, written by `lakehouse package`: edit "
                                               "the file it was built from instead."))
    cli = out / "cli.py"
    cli.write_text((PROJECT_ROOT / "pipelines" / "cli" / "__main__.py").read_text())
    reqs = out / "requirements.txt"
    reqs.write_text("\n".join(requirements()) + "\n")
    bootstrap = out / "bootstrap.sh"
    bootstrap.write_text(BOOTSTRAP.format(python=PYTHON))
    bootstrap.chmod(0o755)
    msk = out / MSK_IAM_JAR
    msk.write_bytes(_msk_iam_jar().read_bytes())
    return [archive, cli, reqs, bootstrap, msk]


def _msk_iam_jar() -> Path:
    """The resolved aws-msk-iam-auth jar (jvm/pom.xml, profile msk)."""
    found = sorted((jvm_dir() / "msk").glob("aws-msk-iam-auth-*.jar"))
    if not found:
        raise SetupError(f"no aws-msk-iam-auth jar in {jvm_dir() / 'msk'}: run `make setup`")
    return found[-1]
