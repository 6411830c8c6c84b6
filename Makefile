# leap-stream developer entry points. Everything installs itself: a fresh clone needs only `make demo` or `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv skypilot-venv system-deps-test system-deps-demo test unit integration lint demo dev-up dev-down dev-status topics clean

venv: $(STAMP)

# System packages (Java, Maven, redis-server; for the tests also Slurm, munge, promtool): installed
# when missing as root or with passwordless sudo; otherwise the exact apt-get line, before anything runs.
system-deps-test:
	@scripts/system-deps test

system-deps-demo:
	@scripts/system-deps demo

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

# The whole suite. Kafka and Redis come up through the session fixtures (tests/conftest.py):
# LEAP_KAFKA_BOOTSTRAP / LEAP_REDIS_URL when set, else native ones under $$LEAP_HOME, stopped at the
# end unless something else still uses them. `make dev-up` first keeps them between runs.
# pytest exit 5 (nothing collected) is a failure with a message; PYTEST_RC_FILE, when set, receives
# pytest's own exit code (make itself only ever exits 2), which .ci/run reports.
# SkyPilot's client pins its own uvicorn and weighs ~450 MB: it gets a venv of its own, with
# leap-stream's `skypilot` extra, for the tests that run SkyPilot's classes (marker `skypilot`).
# Test processes (pytest-xdist): every test has its own topics, consumer group, key prefix and
# folders, and the tests that stop a service stop their own, so they share the broker and Redis.
PYTEST_WORKERS ?= 2
SKY_VENV ?= .venv-skypilot
SKY_STAMP := $(SKY_VENV)/.installed

skypilot-venv: $(SKY_STAMP)

$(SKY_STAMP): pyproject.toml
	$(PY) -m venv $(SKY_VENV)
	$(SKY_VENV)/bin/pip install -q --upgrade pip
	$(SKY_VENV)/bin/pip install -q -e '.[skypilot]'
	touch $(SKY_STAMP)

# Every run prints its 30 slowest tests and its wall time against the suite's budget (docs/development.md).
TEST_BUDGET_S ?= 480

test: system-deps-test venv skypilot-venv
	@rc=0; t0=$$(date +%s); \
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist worksteal --durations=30 $(PYTEST_ARGS) || rc=$$?; \
	took=$$(( $$(date +%s) - t0 )); \
	if [ $$took -le $(TEST_BUDGET_S) ]; then echo "make test: pytest took $$took s of its $(TEST_BUDGET_S) s budget"; \
	else echo "make test: OVER BUDGET: pytest took $$took s, budget $(TEST_BUDGET_S) s: see the slowest tests above" >&2; fi; \
	if [ -n "$(PYTEST_RC_FILE)" ]; then echo $$rc > "$(PYTEST_RC_FILE)"; fi; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests (exit 5)" >&2; fi; \
	exit $$rc

unit: venv
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) tests/unit

integration: venv
	$(BIN)/pytest -q tests/integration

# Native Kafka + Redis that stay up until `make dev-down`; `eval "$$(.venv/bin/leap-stream dev up --env)"`
# puts their addresses in your shell (they are also in $$LEAP_HOME/dev.env).
dev-up: venv
	$(BIN)/leap-stream dev up

dev-down: venv
	$(BIN)/leap-stream dev down

dev-status: venv
	$(BIN)/leap-stream dev status

topics: venv
	eval "$$($(BIN)/leap-stream dev up --env)" && $(BIN)/leap-stream topics create

# One command, fresh machine: venv + install, native Kafka/Redis, a simulated week, the worker,
# one streamed day, the nightly retrain, report in ./demo-report/. DEMO_ARGS=--fast for a ~30 s run.
demo: system-deps-demo venv
	$(BIN)/leap-stream demo $(DEMO_ARGS)

lint: venv
	$(BIN)/ruff check leap_stream tests benchmarks
	$(BIN)/ruff format --check leap_stream tests benchmarks
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build dist *.egg-info
