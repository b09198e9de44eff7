# redline: `make demo` and `make test` each do their own set-up on a fresh Debian machine.
# `make test-fast` is the quick loop (no Debian services): lint, types, generated files, layers,
# unit tests.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
REDLINE := $(VENV)/bin/redline
STAMP := $(VENV)/.installed
APT_NEEDED := $(shell command -v prometheus >/dev/null && command -v promtool >/dev/null || echo prometheus) \
              $(shell command -v prometheus-alertmanager >/dev/null && command -v amtool >/dev/null || echo prometheus-alertmanager) \
              $(shell command -v redis-server >/dev/null || echo redis-server) \
              $(shell command -v chromium >/dev/null || echo chromium) \
              $(shell command -v pdftoppm >/dev/null || echo poppler-utils) \
              $(shell command -v docker-compose >/dev/null || echo docker-compose) \
              $(shell command -v softhsm2-util >/dev/null || echo softhsm2)
PYTEST := $(VENV)/bin/pytest
# Extra pytest arguments for `make pytest`/`test`/`test-fast` (e.g. PYTEST_ARGS='-k receiver').
PYTEST_ARGS ?=
# Parallel pytest workers of `make test` (tests/run.py reads it). The tests wait on real
# services far more than they compute, so twice as many workers as cores pays off.
export PYTEST_WORKERS ?= 4

.PHONY: setup services demo test test-fast lint lint-imports typecheck typecheck-tree \
        generate-check pytest bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP) services

# The services the tests and the demo start by hand (Debian packages; none is started as a daemon).
services:
	@if [ -n "$(strip $(APT_NEEDED))" ]; then \
	  echo "installing: $(strip $(APT_NEEDED))"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $(strip $(APT_NEEDED)) >/dev/null; \
	fi

# Everything the demo starts stops when it ends or is interrupted; `DEMO_ARGS=--keep` leaves the
# stack up (`redline down` stops it).
DEMO_ARGS ?=
demo: setup
	$(REDLINE) demo $(DEMO_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# mypy cannot follow setuptools' editable finder (package-dir maps redline.slo -> slo/), so it
# checks a tree of symlinks laid out as the installed package.
typecheck-tree: $(STAMP)
	rm -rf build/typecheck && mkdir -p build/typecheck/redline
	for entry in redline/*; do ln -s "$$PWD/$$entry" build/typecheck/redline/; done
	for pkg in slo rules dashboards exporters remediation; do ln -s "$$PWD/$$pkg" build/typecheck/redline/$$pkg; done

# The cache lives beside the tree, which is laid anew each time.
typecheck: typecheck-tree
	cd build/typecheck && ../../$(VENV)/bin/mypy --config-file ../../pyproject.toml \
	  --cache-dir ../mypy-cache -p redline

# The layers contract of pyproject.toml ([tool.importlinter]), over the same tree: import-linter
# finds `redline` on PYTHONPATH there, with every package-dir package in place.
lint-imports: typecheck-tree
	cd build/typecheck && PYTHONPATH=. ../../$(VENV)/bin/lint-imports --no-cache \
	  --config ../../pyproject.toml

generate-check: $(STAMP)
	$(REDLINE) generate --check

# The e2e drills (one process: they share one local stack, on an otherwise idle machine), then
# the unit and integration tests (parallel workers, a file stays in one worker so its module
# fixtures start once): tests/run.py, exec'ed so that a SIGTERM to make reaches it and it can
# stop the running part cleanly.
pytest: setup
	exec $(PY) -m tests.run $(PYTEST_ARGS)

test: setup lint typecheck generate-check lint-imports pytest

# Under two minutes, and no Debian service needed: unit tests start no process (tests/unit's
# conftest makes sure of it).
test-fast: $(STAMP) lint typecheck generate-check lint-imports
	$(PYTEST) tests/unit $(PYTEST_ARGS)

# The LiteLLM proxy the gateway is measured against lives in a venv of its own: it pins other
# versions of packages the suite uses (rich, uvloop, tokenizers).
LITELLM_VENV := build/bench-litellm
$(LITELLM_VENV)/.installed:
	test -x $(LITELLM_VENV)/bin/python || python3 -m venv $(LITELLM_VENV)
	$(LITELLM_VENV)/bin/pip install -q 'litellm[proxy]>=1.108'
	touch $@

bench: setup $(LITELLM_VENV)/.installed
	$(PY) -m bench

clean:
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
