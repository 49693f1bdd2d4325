"""The non-admin identity is really authenticated and really limited by RBAC."""

from __future__ import annotations

import json

import pytest
from e2e.devcluster.clients import Kube
from e2e.devcluster.waits import wait_until
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

pytestmark = pytest.mark.cluster


def test_viewer_is_forbidden_what_the_admin_may_do(
    kube: Kube, viewer: k8s.ApiClient, namespace: str
) -> None:
    assert kube.core.list_namespaced_pod(namespace).items == []

    with pytest.raises(ApiException) as denied:
        k8s.CoreV1Api(viewer).list_namespaced_pod(namespace)

    assert denied.value.status == 403
    message = json.loads(denied.value.body)["message"]
    assert 'User "kvq-dev-viewer" cannot list resource "pods"' in message


def test_a_role_binding_grants_the_viewer_read_access(
    kube: Kube, viewer: k8s.ApiClient, namespace: str
) -> None:
    kube.rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "viewer-can-view"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "view",
            },
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "kvq-dev-viewer"}
            ],
        },
    )
    core = k8s.CoreV1Api(viewer)

    pods = wait_until(
        lambda: core.list_namespaced_pod(namespace),
        what="the RoleBinding to take effect",
        timeout=10,
        retry_on=(ApiException,),
    )

    assert pods.items == []
    with pytest.raises(ApiException) as denied:
        core.delete_collection_namespaced_pod(namespace)
    assert denied.value.status == 403
