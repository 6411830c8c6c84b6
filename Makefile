# leap-stream developer entry points. Everything installs itself: a fresh clone needs only `make demo` or `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv test unit lint demo clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

unit: venv
	$(BIN)/pytest -q tests/unit

lint: venv
	$(BIN)/ruff check leap_stream tests
	$(BIN)/ruff format --check leap_stream tests
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build dist *.egg-info
