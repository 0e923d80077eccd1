# shardsim — the two set-up commands are `make run` and `make test`; both install first when needed.
# `make run PORT=27018` serves the router on another port (default 27017).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
SPEC_COMMIT ?= 92b3c0b9
SPEC_CACHE  ?= .cache/specs
COMPOSE := $(shell if docker compose version >/dev/null 2>&1; then echo "docker compose"; elif command -v docker-compose >/dev/null 2>&1; then echo docker-compose; else echo "docker compose"; fi)
# MEMBERS=3 (make up / down / logs): the cluster of replica-set shards, every member its own
# container (deploy/docker-compose.members.yml: 2 shards x 3 members); MEMBERS=1 (default): one
# container per shard (deploy/docker-compose.yml).
MEMBERS ?= 1
COMPOSE_FILE := $(if $(filter 3,$(MEMBERS)),deploy/docker-compose.members.yml,deploy/docker-compose.yml)
AUTH_FILE := $(if $(filter 3,$(MEMBERS)),,-f deploy/docker-compose.auth.yml)

.PHONY: install run test unit integration spec load bench faults fetch-specs up up-auth down logs docker-base docker-build clean

# setuptools' deprecation warnings (BuildBackendWarning, ~40 lines of banners) are silenced in
# the build backend with PYTHONWARNINGS; errors still fail the install and are printed.
PIP := PYTHONWARNINGS=ignore $(PY) -m pip --disable-pip-version-check

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

PORT ?= 27017
run: $(STAMP)
	$(VENV)/bin/shardsim up --shards 3 --port $(PORT)

# `make test`: every test on TEST_WORKERS workers (pytest-xdist; groups and their order in
# tests/conftest.py), then the tests marked `serial` (latency bounds) alone; fails if either fails.
TEST_WORKERS ?= 3
test: $(STAMP)
	$(PY) -m pytest tests -p no:cacheprovider -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder -m "not serial"; a=$$?; \
	$(PY) -m pytest tests -p no:cacheprovider -m serial; b=$$?; \
	test $$a -eq 0 && test $$b -eq 0

unit: $(STAMP)
	$(PY) -m pytest tests/unit tests/sim

integration: $(STAMP)
	$(PY) -m pytest tests/integration

spec: $(STAMP)
	$(VENV)/bin/shardsim spec --suite all

load: $(STAMP)
	$(VENV)/bin/shardsim load --ops 1000000 --shards 3

# Fault trials: 100 kill -9 trials per role and scenario (docs/testing.md, Fault trials) on a
# durable cluster, with one summary table; FAULT_ARGS="--seed N --trials 1 --role shard" replays one.
FAULT_ARGS ?= --trials 100
faults: $(STAMP)
	$(PY) -m tests.faults $(FAULT_ARGS)

bench: $(STAMP)
	for b in bench/bench_*.py; do $(PY) $$b || exit 1; done

# The official change-stream spec tests at a pinned commit of the public specifications repository.
fetch-specs: $(STAMP)
	$(PY) -m shardsim.tools.specfetch --commit $(SPEC_COMMIT) --dest $(SPEC_CACHE)

docker-base:
	bash deploy/make-base-image.sh

docker-build: $(STAMP)
	bash deploy/build-image.sh

up: docker-build
	MEMBERS=$(MEMBERS) bash deploy/up.sh

# The compose cluster with authentication: a root user from MONGO_INITDB_ROOT_USERNAME /
# MONGO_INITDB_ROOT_PASSWORD (default root / root) and a key file shared by the members.
up-auth: docker-build
	SHARDSIM_AUTH=1 bash deploy/up.sh

down:
	$(COMPOSE) -f $(COMPOSE_FILE) $(AUTH_FILE) down -v --remove-orphans

logs:
	$(COMPOSE) -f $(COMPOSE_FILE) logs --tail=200

clean:
	rm -rf $(VENV) .cache build dist *.egg-info
