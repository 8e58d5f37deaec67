# calque control plane. `make run` serves the embedded local control plane;
# `make test` runs the whole suite. Both set up everything on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export POWERTOOLS_TRACE_DISABLED ?= 1
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: install run test test-unit test-integration test-infra test-gpu lint format synth bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: install
	$(VENV)/bin/calque local up $(ARGS)

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

test-unit: install
	$(PY) -m pytest -m unit

test-integration: install
	$(PY) -m pytest -m integration

test-infra: install
	$(PY) -m pytest -m infra

# Read-only checks against a real GPU through NVML (needs a driver).
test-gpu: install
	$(PY) -m pytest -m gpu -o addopts="--strict-markers -ra"

# Opt-in, as root, on an operator's own MIG-capable GPU instance: CHANGES the GPU, then
# restores it (scripts/gpu_mig_check.sh says what it does). Never on a shared machine.
.PHONY: test-gpu-mig
test-gpu-mig:
	PY=$(PY) sh scripts/gpu_mig_check.sh

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy calque functions host_agent infra app.py

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

synth: install
	$(PY) app.py

bench: install
	$(PY) bench/cold_import.py
	$(PY) bench/checkout.py
	$(PY) bench/placement_race.py
	$(PY) bench/fleet.py
	$(PY) bench/pool_sim.py
	$(PY) bench/simulate.py

clean:
	rm -rf $(VENV) cdk.out .bundle-cache .pytest_cache .mypy_cache .ruff_cache
