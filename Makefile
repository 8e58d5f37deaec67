# calque control plane. `make run` serves the embedded local control plane;
# `make test` runs the whole suite. Both set up everything on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export POWERTOOLS_TRACE_DISABLED ?= 1
# Python keeps its bytecode caches (__pycache__, ignored by git, by the bundles and by pool
# packages), even where the environment says otherwise: the suite starts hundreds of
# processes (planes, Lambda environments, host agents, workers), and without them each
# compiled every module it imported afresh.
unexport PYTHONDONTWRITEBYTECODE

# The suite runs in parallel (pytest-xdist): each worker is its own process with its own
# local plane; files are dealt to workers whole, so a module's fixtures start once.
# Most of an integration test's time is spent waiting on a plane, so more workers than
# cores pays: TEST_WORKERS=auto is one per core.
TEST_WORKERS ?= 4
XDIST := -n $(TEST_WORKERS) --dist loadfile

.PHONY: install host-tools browser-tools shell-tools run test test-fast test-unit test-integration test-infra test-gpu lint format synth bench bench-suite clean

# Each checkout keeps its own local plane (state directory, and a free port when another
# plane has 8787), so a second clone's `make run` runs beside the first; the venv's activate
# script names that state directory to the CLI. `calque local reset` starts it afresh.
LOCAL_STATE ?= $(CURDIR)/.calque/local

# Installs go through uv (from PyPI, into the venv) when it can be had: it resolves and unpacks
# in parallel, about ten seconds here where pip took a minute and a half. Where uv cannot be
# installed, pip does the same install.
UV := $(VENV)/bin/uv
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	@echo "installing calque and its dependencies into $(VENV)"
	@$(PY) -m pip install --quiet uv 2>&1 | grep -v "^WARNING: Location" || true
	@if [ -x $(UV) ] && $(UV) pip install --python $(PY) -e '.[dev]'; then :; else \
	  echo "installing with pip instead of uv (the first time takes a few minutes)"; \
	  $(PY) -m pip install --quiet --upgrade pip && $(PY) -m pip install --progress-bar on -e '.[dev]'; \
	fi
	@grep -q CALQUE_LOCAL_STATE_DIR $(VENV)/bin/activate || \
	  echo 'export CALQUE_LOCAL_STATE_DIR="$(LOCAL_STATE)"' >> $(VENV)/bin/activate
	touch $(STAMP)

install: $(STAMP)

# What the host-in-a-box tests (tests/integration/host_box) need on this machine: as root,
# the tools that make accounts, namespaces and firewall rules. Without root they skip.
HOST_TOOLS := iptables nsenter unshare ip useradd runuser curl
host-tools:
	@missing=""; for t in $(HOST_TOOLS); do command -v $$t >/dev/null 2>&1 || missing="$$missing $$t"; done; \
	if [ -n "$$missing" ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing the host box's tools:$$missing"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q iptables iproute2 util-linux passwd curl >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q iptables iproute2 util-linux passwd curl >/dev/null; }; \
	fi

# What the console's browser tests (tests/integration/console) need: Debian's Chromium and its
# driver, installed as root when missing (Selenium is told where they are and downloads nothing).
# Without them those tests skip, saying why.
browser-tools:
	@if { ! command -v chromedriver >/dev/null 2>&1 || ! command -v chromium >/dev/null 2>&1; } && \
	  [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing a headless browser for the console's tests: chromium chromium-driver"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium chromium-driver >/dev/null; }; \
	fi

# The shells the completion tests (tests/unit/cli/test_completion.py and
# tests/integration/test_completion_local.py) drive on a terminal: bash (make's own shell
# here) and zsh, installed as root when missing. Without it, the zsh tests skip, saying why.
shell-tools:
	@if ! command -v zsh >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing zsh for the shell completion tests"; \
	  export DEBIAN_FRONTEND=noninteractive; \
	  apt-get install -y -q zsh >/dev/null 2>&1 || \
	  { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q zsh >/dev/null; }; \
	fi

run: install
	CALQUE_LOCAL_STATE_DIR="$(LOCAL_STATE)" $(VENV)/bin/calque local up $(ARGS)

# The whole suite, as CI runs it; --durations lists the slowest tests after the summary.
test: install host-tools browser-tools shell-tools scan-tools
	$(PY) -m pytest $(XDIST) --durations=25 $(PYTEST_ARGS)

# The unit tests alone, for the edit-test loop (no network, no plane, no synth). They only
# compute, so one worker per core, dealt test by test so that none is left with a long tail;
# only tests/unit is collected (every test there is a unit test: tests/conftest.py marks it).
test-fast: install shell-tools
	$(PY) -m pytest tests/unit -m unit -n auto --dist load -q $(PYTEST_ARGS)

test-unit: test-fast

test-integration: install host-tools browser-tools shell-tools
	$(PY) -m pytest -m integration $(XDIST) --durations=25 $(PYTEST_ARGS)

test-infra: install scan-tools
	$(PY) -m pytest -m infra $(XDIST) --durations=25 $(PYTEST_ARGS)

# checkov in its own environment: it pins boto3/botocore older than the project's. The infra
# tests find it at .tools-venv/bin/checkov (or $CHECKOV) and run it over the templates.
SCAN_STAMP := .tools-venv/.installed-stamp
$(SCAN_STAMP): $(STAMP)
	@if [ -x $(UV) ]; then \
	  $(UV) venv --quiet --allow-existing --python $(PYTHON) .tools-venv && \
	  $(UV) pip install --quiet --python .tools-venv/bin/python checkov; \
	else \
	  $(PYTHON) -m venv .tools-venv && \
	  { .tools-venv/bin/pip install --quiet checkov 2>&1 | grep -v "^WARNING: Location" || true; }; \
	fi
	.tools-venv/bin/checkov --version >/dev/null
	touch $(SCAN_STAMP)

.PHONY: scan-tools
scan-tools: $(SCAN_STAMP)

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

# The wall time of each tier and the 20 slowest tests (bench/suite_time.py).
bench-suite: install
	$(PY) bench/suite_time.py -- $(XDIST)

clean:
	rm -rf $(VENV) cdk.out .bundle-cache .pytest_cache .mypy_cache .ruff_cache
