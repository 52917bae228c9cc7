# Both entry points bootstrap .venv themselves: a fresh clone needs only python3 (>= 3.11).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint typecheck pytest system-packages clean

run: $(STAMP)
	$(BIN)/swapgate demo --config config/demo.yaml

test: $(STAMP) lint typecheck pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy
	$(BIN)/mypy --config-file pyproject.toml --check-untyped-defs tests

pytest: $(STAMP) system-packages
	$(BIN)/pytest

system-packages:
	bash .ci/ensure-packages

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
