# thaw: two commands for a newcomer — `make up` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed

.PHONY: up test install system-deps lint typecheck pytest bench clean

$(STAMP): pyproject.toml
	./scripts/system-deps.sh fuse3 libfuse3-dev pkg-config
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test,bench]'
	touch $(STAMP)

install: $(STAMP)

# Debian packages the suite needs beyond the install (docker engine, debootstrap
# for test images, a browser, promtool for the alert rules); no-op when present.
system-deps:
	./scripts/system-deps.sh docker.io debootstrap chromium
	./scripts/install-promtool.sh
	./scripts/start-dockerd.sh

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install
	$(VENV)/bin/mypy

pytest: install
	$(VENV)/bin/pytest -q -p no:cacheprovider -rfEs --durations=25

# Every check runs even when an earlier one fails, so one run shows everything.
test: system-deps install
	@status=0; \
	$(MAKE) --no-print-directory lint || status=1; \
	$(MAKE) --no-print-directory typecheck || status=1; \
	$(MAKE) --no-print-directory pytest || status=1; \
	exit $$status

up: install
	$(VENV)/bin/thaw up

bench: install
	$(PY) bench/load.py

clean:
	rm -rf $(VENV) .thaw build *.egg-info
