"""What the chart's ServiceAccount may do (`kubectl auth can-i`): what kvq needs, no more.

The same matrix in both modes: cluster-wide (ClusterRole) and namespaced (a Role in each
served namespace). `served` is a namespace the release serves, `other` one it does not."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from e2e.devcluster.clients import Kube
from kubernetes import client as k8s

from tests.helm.chart import CHART, helm, values_file

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
    Check("patch", "leaderworkersets.leaderworkerset.x-k8s.io", "served", True, True),
    Check("delete", "leaderworkersets.leaderworkerset.x-k8s.io", "served", True, True),
    Check("patch", "leaderworkersets.leaderworkerset.x-k8s.io", "other", True, False),
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
    Check("update", "leaderworkersets.leaderworkerset.x-k8s.io", "served", False, False),
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
    """A SubjectAccessReview, as `kubectl auth can-i --as` sends it, with the API group
    given explicitly: kubectl sends `scaledobjects.keda.sh` as a core resource when the
    kind's CRD is not installed (KEDA and the Gateway API are optional)."""
    resource, *flags = check.resource.replace(PEER, release).split()
    resource, _, name = resource.partition("/")
    plural, _, group = resource.partition(".")
    subresource = next((f.split("=", 1)[1] for f in flags if f.startswith("--subresource=")), "")
    where = {"cluster": None, "served": namespace, "other": "default"}[check.where]
    review = k8s.V1SubjectAccessReview(
        spec=k8s.V1SubjectAccessReviewSpec(
            user=account,
            groups=["system:serviceaccounts", f"system:serviceaccounts:{namespace}"],
            resource_attributes=k8s.V1ResourceAttributes(
                verb=check.verb,
                group=group,
                resource=plural,
                subresource=subresource or None,
                name=name or None,
                namespace=where,
            ),
        )
    )
    done: Any = k8s.AuthorizationV1Api(kube.api).create_subject_access_review(review)
    return bool(done.status.allowed)


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
