# redline: `make demo` and `make test` each do their own set-up on a fresh Debian machine.
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
              $(shell command -v docker-compose >/dev/null || echo docker-compose)
PYTEST_ARGS ?=

.PHONY: setup services demo test lint typecheck typecheck-tree generate-check pytest bench clean

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

# The stack stays up after the drills; `make demo DEMO_ARGS=--once` stops it.
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

typecheck: typecheck-tree
	cd build/typecheck && ../../$(VENV)/bin/mypy --config-file ../../pyproject.toml -p redline

generate-check: $(STAMP)
	$(REDLINE) generate --check

pytest: setup
	$(VENV)/bin/pytest $(PYTEST_ARGS)

test: setup lint typecheck generate-check pytest

bench: setup
	$(PY) -m bench

clean:
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
