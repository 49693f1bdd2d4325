# kvq: every target does its own setup (venv and Go binaries cached under ~/.cache/kvq).
SHELL := /bin/bash
VENV = $(shell e2e/scripts/venv.sh)
PY = $(VENV)/bin/python
export PATH := $(VENV)/bin:$(PATH)

.PHONY: help venv test test-unit lint typecheck crd demo cluster-up cluster-down

help:
	@echo "make demo   - local control plane with GPU pools, the operator, examples, a fallback"
	@echo "make test   - lint, types, layer contract, unit and integration tests"

venv:
	@echo $(VENV)

lint:
	$(VENV)/bin/ruff check operator tests e2e
	$(VENV)/bin/ruff format --check operator tests e2e
	$(VENV)/bin/lint-imports

typecheck:
	$(VENV)/bin/mypy

test-unit:
	$(PY) -m pytest -m "not cluster and not engine and not helm" tests

test: lint typecheck
	$(PY) -m pytest tests

crd:
	$(VENV)/bin/kvq crd > crds/kvq.dev_inferenceservices.yaml
