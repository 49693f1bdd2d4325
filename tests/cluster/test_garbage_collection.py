"""The controller manager's garbage collector deletes children with their owner."""

from __future__ import annotations

import pytest
from e2e.devcluster.clients import Kube
from e2e.devcluster.waits import is_running_and_ready, wait_for_deletion, wait_for_pod, wait_until
from kubernetes import client as k8s

from tests.cluster.manifests import gpu_deployment

pytestmark = pytest.mark.cluster


def test_owned_config_map_is_deleted_with_its_owner(kube: Kube, namespace: str) -> None:
    owner = kube.core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "owner"}, "data": {"a": "1"}}
    )
    reference = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": "owner",
        "uid": owner.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }
    kube.core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "child", "ownerReferences": [reference]}}
    )

    kube.core.delete_namespaced_config_map(
        "owner", namespace, body=k8s.V1DeleteOptions(propagation_policy="Background")
    )

    wait_for_deletion(
        lambda: kube.core.read_namespaced_config_map("child", namespace),
        what="the garbage collector to delete the child",
    )


def test_deleting_a_deployment_removes_its_replica_set_and_pods(kube: Kube, namespace: str) -> None:
    kube.apps.create_namespaced_deployment(namespace, gpu_deployment("engine", "NVIDIA-L4"))
    wait_for_pod(
        kube.core, namespace, is_running_and_ready, label_selector="app=engine", what="a Ready pod"
    )
    assert kube.apps.list_namespaced_replica_set(namespace).items

    kube.apps.delete_namespaced_deployment(
        "engine", namespace, body=k8s.V1DeleteOptions(propagation_policy="Foreground")
    )

    wait_until(
        lambda: (
            not kube.apps.list_namespaced_replica_set(namespace).items
            and not kube.core.list_namespaced_pod(namespace).items
        ),
        what="the ReplicaSet and its pods to be collected",
    )
