"""`kubectl auth can-i --as` the chart's ServiceAccount: what the operator needs, and no more.

The same matrix in both modes: cluster-wide (ClusterRole) and namespaced (a Role in each
served namespace). `served` is a namespace the release serves, `other` one it does not."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from kvq.devcluster.clients import Kube
from tests.helm.chart import CHART, helm, values_file
from tests.helm.cluster_support import kubectl

pytestmark = pytest.mark.helm


class Check(NamedTuple):
    verb: str
    resource: str
    where: str  # "cluster", "served" or "other"
    cluster_wide: bool
    namespaced: bool


PEER = "{release}"
MATRIX = [
    # Needed: pool discovery, evidence, the kinds kvq renders, its own status, Events, peering.
    Check("list", "nodes", "cluster", True, True),
    Check("watch", "nodes", "cluster", True, True),
    Check("watch", "customresourcedefinitions.apiextensions.k8s.io", "cluster", True, True),
    Check("list", "pods", "served", True, True),
    Check("get", "pods --subresource=log", "served", True, True),
    Check("create", "deployments.apps", "served", True, True),
    Check("patch", "deployments.apps", "served", True, True),
    Check("delete", "deployments.apps", "served", True, True),
    Check("patch", "services", "served", True, True),
    Check("patch", "configmaps", "served", True, True),
    Check("patch", "poddisruptionbudgets.policy", "served", True, True),
    Check("patch", "scaledobjects.keda.sh", "served", True, True),
    Check("delete", "scaledobjects.keda.sh", "served", True, True),
    Check("patch", "httproutes.gateway.networking.k8s.io", "served", True, True),
    Check("patch", "inferencepools.inference.networking.k8s.io", "served", True, True),
    Check("patch", "scaledobjects.keda.sh", "other", True, False),
    Check("patch", "httproutes.gateway.networking.k8s.io", "other", True, False),
    Check("create", "gateways.gateway.networking.k8s.io", "served", False, False),
    Check("create", "triggerauthentications.keda.sh", "served", False, False),
    Check("watch", "inferenceservices.kvq.dev", "served", True, True),
    Check("patch", "inferenceservices.kvq.dev", "served", True, True),
    Check("update", "inferenceservices.kvq.dev --subresource=status", "served", True, True),
    Check("create", "events", "served", True, True),
    Check("patch", f"clusterkopfpeerings.kopf.dev/{PEER}", "cluster", True, False),
    Check("patch", f"kopfpeerings.kopf.dev/{PEER}", "served", False, True),
    # Outside the served namespaces (namespaced mode): nothing.
    Check("create", "deployments.apps", "other", True, False),
    Check("list", "pods", "other", True, False),
    Check("get", "inferenceservices.kvq.dev", "other", True, False),
    # Never: nodes, secrets, running code in pods, spec of InferenceServices, RBAC, CRDs.
    Check("delete", "nodes", "cluster", False, False),
    Check("patch", "nodes", "cluster", False, False),
    Check("get", "secrets", "served", False, False),
    Check("list", "secrets", "served", False, False),
    Check("update", "deployments.apps", "served", False, False),
    Check("patch", "inferenceservices.kvq.dev --subresource=status", "served", False, False),
    Check("create", "pods", "served", False, False),
    Check("delete", "pods", "served", False, False),
    Check("create", "pods --subresource=exec", "served", False, False),
    Check("create", "inferenceservices.kvq.dev", "served", False, False),
    Check("update", "inferenceservices.kvq.dev", "served", False, False),
    Check("delete", "inferenceservices.kvq.dev", "served", False, False),
    Check("create", "statefulsets.apps", "served", False, False),
    Check("create", "jobs.batch", "served", True, True),
    Check("create", "persistentvolumeclaims", "served", True, True),
    Check("delete", "persistentvolumes", "cluster", False, False),
    Check("create", "cronjobs.batch", "served", False, False),
    Check("create", "serviceaccounts --subresource=token", "served", False, False),
    Check("create", "rolebindings.rbac.authorization.k8s.io", "served", False, False),
    Check("create", "clusterroles.rbac.authorization.k8s.io", "cluster", False, False),
    Check("delete", "customresourcedefinitions.apiextensions.k8s.io", "cluster", False, False),
    Check("patch", "clusterkopfpeerings.kopf.dev/someone-else", "cluster", False, False),
    Check("list", "namespaces", "cluster", False, False),
]


@pytest.fixture
def release(kube: Kube, namespace: str) -> Iterator[str]:
    name = f"kvq-{uuid.uuid4().hex[:6]}"
    yield name
    helm(
        *("uninstall", name, "--namespace", namespace, "--ignore-not-found", "--wait"),
        kubeconfig=kube.state.kubeconfig,
        check=False,
    )


def can_i(kube: Kube, account: str, check: Check, release: str, namespace: str) -> bool:
    verb_args = [check.verb, *check.resource.replace(PEER, release).split()]
    where = {"cluster": [], "served": ["-n", namespace], "other": ["-n", "default"]}[check.where]
    done = kubectl(
        *("auth", "can-i", *verb_args, *where, f"--as={account}"),
        kubeconfig=kube.state.kubeconfig,
        check=False,
    )
    assert done.stdout.strip() in ("yes", "no"), done.stderr
    return done.stdout.strip() == "yes"


@pytest.mark.parametrize("mode", ["cluster-wide", "namespaced"])
def test_can_i_matrix(kube: Kube, namespace: str, release: str, tmp_path: Path, mode: str) -> None:
    values: dict[str, Any] = {"watchNamespaces": [namespace]} if mode == "namespaced" else {}
    helm(
        *("install", release, str(CHART), "--namespace", namespace),
        *("--values", str(values_file(tmp_path, values))),
        kubeconfig=kube.state.kubeconfig,
    )
    account = f"system:serviceaccount:{namespace}:{release}"
    rows, wrong = [], []
    for check in MATRIX:
        expected = check.cluster_wide if mode == "cluster-wide" else check.namespaced
        got = can_i(kube, account, check, release, namespace)
        rows.append(
            f"| {check.verb} | {check.resource} | {check.where} | {'yes' if got else 'no'} |"
        )
        if got != expected:
            wrong.append(f"{check.verb} {check.resource} in {check.where}: got {got}")
    print(f"\ncan-i as the chart's ServiceAccount ({mode}):\n" + "\n".join(rows))
    assert wrong == []
