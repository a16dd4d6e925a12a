#!/usr/bin/env bash
# `make airflow`: Airflow standalone (api-server + scheduler + dag-processor + triggerer)
# with the project's DAGs, on 127.0.0.1 only, state in .airflow/ (git-ignored).
# Prints the URL and the login once the UI answers, then runs until Ctrl-C.
set -euo pipefail
project="$(cd "$(dirname "$0")/.." && pwd)"
port="${AIRFLOW_PORT:-8080}"
export AIRFLOW_HOME="${AIRFLOW_HOME:-$project/.airflow}"
export AIRFLOW__CORE__DAGS_FOLDER="$project/dags"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__API__HOST="${AIRFLOW_HOST:-127.0.0.1}"  # 0.0.0.0 in docker/compose.yaml
export AIRFLOW__API__PORT="$port"
export AIRFLOW__API__BASE_URL="http://127.0.0.1:$port"
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="${AIRFLOW_USER:-admin}:admin"
# The users' passwords: a file of your own (JSON, user to password), or the one standalone generates.
passwords="${AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE:-$AIRFLOW_HOME/simple_auth_manager_passwords.json.generated}"
# Where the lake is and which target runs the jobs come from the configuration (LAKEHOUSE_CONFIG and
# LAKEHOUSE_PROFILE, else ./lakehouse.toml, else the defaults: this checkout's lake/, the local target), which the
# DAGs and every Spark task they start read alike (dags/lakehouse_common.py).
# OpenLineage (docs/deploying.md, "Lineage"): the provider's events of every task, and those of the Spark jobs the tasks
# start (hudi_configs/spark.toml [lineage]), appended to one folder that `lakehouse lineage` reads. A real
# backend instead (Marquez): set AIRFLOW__OPENLINEAGE__TRANSPORT yourself, e.g. '{"type": "http", "url": "..."}'.
export LAKEHOUSE_LINEAGE_DIR="${LAKEHOUSE_LINEAGE_DIR:-${LAKEHOUSE_LOG_DIR:-$project/.logs}/lineage}"
export AIRFLOW__OPENLINEAGE__NAMESPACE="${AIRFLOW__OPENLINEAGE__NAMESPACE:-lakehouse}"
if [ -z "${AIRFLOW__OPENLINEAGE__TRANSPORT:-}" ]; then
  AIRFLOW__OPENLINEAGE__TRANSPORT="$(printf '{"type": "file", "log_file_path": "%s/airflow.jsonl", "append": true}' \
    "$LAKEHOUSE_LINEAGE_DIR")"
  export AIRFLOW__OPENLINEAGE__TRANSPORT
fi
mkdir -p "$LAKEHOUSE_LINEAGE_DIR"
# standalone starts its components as `airflow ...` from PATH.
export PATH="$project/.venv-airflow/bin:$PATH"
mkdir -p "$AIRFLOW_HOME"
# The pool the lake-writing jobs share (dags/lakehouse_common.py): without it their tasks never start.
"$project/.venv-airflow/bin/airflow" db migrate > "$AIRFLOW_HOME/migrate.log" 2>&1 \
  || { echo "airflow db migrate failed; its log:" >&2; tail -50 "$AIRFLOW_HOME/migrate.log" >&2; exit 1; }
"$project/.venv-airflow/bin/python" -c 'import sys; sys.path.insert(0, sys.argv[1]); import lakehouse_common as c; c.ensure_pool()' \
  "$project/dags" > "$AIRFLOW_HOME/pool.log" 2>&1 \
  || { echo "creating the lakehouse pool failed; its log:" >&2; tail -20 "$AIRFLOW_HOME/pool.log" >&2; exit 1; }
"$project/.venv-airflow/bin/airflow" standalone > "$AIRFLOW_HOME/standalone.log" 2>&1 &
airflow_pid=$!
trap 'kill -TERM $airflow_pid 2>/dev/null; wait $airflow_pid 2>/dev/null' EXIT INT TERM
for _ in $(seq 1 180); do
  if ! kill -0 $airflow_pid 2>/dev/null; then
    echo "airflow standalone exited; its log:" >&2; tail -50 "$AIRFLOW_HOME/standalone.log" >&2; exit 1
  fi
  if curl -fsS "http://127.0.0.1:$port/api/v2/monitor/health" >/dev/null 2>&1 \
     && [ -s "$passwords" ]; then
    password="$("$project/.venv-airflow/bin/python" -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' \
      "$passwords" "${AIRFLOW_USER:-admin}")"
    echo "Airflow UI: http://127.0.0.1:$port  login: ${AIRFLOW_USER:-admin} / $password"
    echo "(log: $AIRFLOW_HOME/standalone.log; Ctrl-C stops it)"
    wait $airflow_pid
    exit $?
  fi
  sleep 2
done
echo "Airflow did not answer on port $port within 6 minutes; log: $AIRFLOW_HOME/standalone.log" >&2
exit 1
