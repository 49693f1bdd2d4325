"""Shared pytest configuration and the local control plane fixtures.

Tests marked `cluster` ask for `kube` (or `namespace`, `viewer`): the first such test starts
one cluster for the whole session (building the pinned binaries if they are not cached), and
the session's end stops it. Tests that ask for none of these never start anything.

Opt-in add-ons on that cluster: a test that asks for `keda`, `gateway` or `lws` starts that add-on
once for the session (built on first use; see e2e.devcluster.addons).

Environment: KVQ_TEST_PROFILE picks the cluster profile (default hetero);
KVQ_TEST_CLUSTER names the run dir (default: one per checkout and pytest process, removed
after a passing session; kept, minus etcd's data, for its logs when a test failed).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e.devcluster import cluster
from e2e.devcluster.addons import start_addons
from e2e.devcluster.binaries import Binaries, BinaryBuildError, ensure_binaries
from e2e.devcluster.clients import Kube, api_client, close_client
from e2e.devcluster.waits import wait_until
from kubernetes import client as k8s

CLUSTER_START_TIMEOUT = 300.0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A test that uses the gateway add-on is marked `gateway`: `make test` leaves it out
    # (Traefik's cold build is not in CI's budget), `make test-gateway` runs it.
    for item in items:
        if "gateway" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.gateway)


def _session_cluster_name() -> str:
    # Checkout and pid: sessions running side by side (CI, a developer, a second terminal)
    # each get their own cluster instead of restarting each other's.
    checkout = hashlib.sha256(str(Path(__file__).resolve().parents[1]).encode()).hexdigest()[:8]
    return os.environ.get("KVQ_TEST_CLUSTER") or f"pytest-{checkout}-{os.getpid()}"


def _build_binaries(request: pytest.FixtureRequest) -> Binaries:
    """The pinned binaries, built when missing, with the build's progress on the terminal
    (not captured: a first build takes many minutes and a person should see it move)."""
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        return ensure_binaries()


def _start_cluster(request: pytest.FixtureRequest, name: str) -> cluster.ClusterState:
    failure = ""
    try:
        binaries = _build_binaries(request)
        # The start-up timeout counts from here: the build has its own budget.
        return cluster.up(
            name=name,
            profile=os.environ.get("KVQ_TEST_PROFILE", "hetero"),
            timeout=CLUSTER_START_TIMEOUT,
            binaries=binaries,
        )
    except (BinaryBuildError, cluster.ClusterStartError) as error:
        failure = str(error)
    # One line naming the log (outside the except: no chained traceback), for this test and
    # every later one that needs the cluster.
    pytest.fail(f"the local control plane did not start: {failure}", pytrace=False)


@pytest.fixture(scope="session")
def kube(request: pytest.FixtureRequest) -> Iterator[Kube]:
    name = _session_cluster_name()
    state = _start_cluster(request, name)
    api = api_client(state.kubeconfig)
    try:
        yield Kube(state, api)
    finally:
        close_client(api)
        cluster.down(name)
        # etcd's data is most of the run dir; the logs and PKI stay when a test failed.
        shutil.rmtree(Path(state.run_dir) / "etcd-data", ignore_errors=True)
        if request.session.testsfailed == 0 and "KVQ_TEST_CLUSTER" not in os.environ:
            shutil.rmtree(state.run_dir, ignore_errors=True)


def _start_addon(request: pytest.FixtureRequest, kube: Kube, name: str) -> dict[str, str]:
    """An opt-in add-on on the session's cluster, started once (the first test that asks);
    it stops with the cluster. Its build's progress is shown live; a failure is one line."""
    failure = ""
    capture = request.config.pluginmanager.getplugin("capturemanager")
    try:
        with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
            start_addons(kube.state, [name])
        return kube.state.addons[name]
    except (BinaryBuildError, cluster.ClusterStartError) as error:
        failure = str(error)
    pytest.fail(f"the {name} add-on did not start: {failure}", pytrace=False)


@pytest.fixture(scope="session")
def keda(request: pytest.FixtureRequest, kube: Kube) -> dict[str, str]:
    """KEDA (operator + external-metrics API server, CRDs) on the session's cluster; what it
    exposes: namespace, apiService, metricsServer, operatorMetrics."""
    return _start_addon(request, kube, "keda")


@pytest.fixture(scope="session")
def gateway(request: pytest.FixtureRequest, kube: Kube) -> dict[str, str]:
    """Traefik (Gateway API, standard channel; InferencePool CRD installed) on the session's
    cluster with GatewayClass `traefik` and Gateway `kvq-gateway/kvq-gateway`; what it exposes:
    url (the listener, http://127.0.0.1:PORT), gateway, namespace, gatewayClass, listenerPort,
    edgeNode and edgeAddress (empty when this machine has no non-loopback address)."""
    return _start_addon(request, kube, "gateway")


@pytest.fixture(scope="session")
def lws(request: pytest.FixtureRequest, kube: Kube) -> dict[str, str]:
    """LeaderWorkerSet's controller (CRDs, webhooks) on the session's cluster; what it
    exposes: namespace, webhook (its URL), version."""
    return _start_addon(request, kube, "lws")


@pytest.fixture(scope="session")
def viewer(kube: Kube) -> Iterator[k8s.ApiClient]:
    """API client of the non-admin identity (user kvq-dev-viewer, no RBAC bindings)."""
    api = api_client(kube.state.viewer_kubeconfig)
    try:
        yield api
    finally:
        close_client(api)


@pytest.fixture
def namespace(kube: Kube, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test, usable for pods (its default ServiceAccount exists)."""
    stem = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"{stem}-{uuid.uuid4().hex[:6]}"
    core = kube.core
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))

    def has_default_account() -> Any:
        return core.list_namespaced_service_account(name).items

    wait_until(has_default_account, what=f"default ServiceAccount in {name}", timeout=30)
    try:
        yield name
    finally:
        core.delete_namespace(name)
