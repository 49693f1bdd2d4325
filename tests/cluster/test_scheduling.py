"""Pods asking for GPUs land on the KWOK node of the product they select, and run."""

from __future__ import annotations

import pytest
from e2e.devcluster.clients import Kube
from e2e.devcluster.waits import condition, has_condition, is_running_and_ready, wait_for_pod

from tests.cluster.manifests import gpu_deployment, pod

pytestmark = pytest.mark.cluster


@pytest.mark.parametrize(
    ("product", "pool"),
    [
        ("Tesla-T4", "gke-t4"),
        ("NVIDIA-A100-SXM4-80GB", "gke-a100-80gb"),
        ("NVIDIA-L4", "gke-l4"),
        ("NVIDIA-H100-80GB-HBM3", "aws-h100"),
        ("NVIDIA-H200", "aws-h200"),
        ("NVIDIA-B200", "aws-b200"),
    ],
)
def test_gpu_deployment_runs_on_the_selected_product(
    kube: Kube, namespace: str, product: str, pool: str
) -> None:
    kube.apps.create_namespaced_deployment(namespace, gpu_deployment("engine", product))

    running = wait_for_pod(
        kube.core,
        namespace,
        is_running_and_ready,
        label_selector="app=engine",
        what=f"the engine pod Running and Ready on {product}",
    )

    node = kube.core.read_node(running.spec.node_name)
    assert node.metadata.labels["nvidia.com/gpu.product"] == product
    assert running.spec.node_name.startswith(f"{pool}-")
    assert running.spec.containers[0].resources.limits["nvidia.com/gpu"] == "1"


def test_pod_without_gpu_toleration_is_not_scheduled(kube: Kube, namespace: str) -> None:
    kube.core.create_namespaced_pod(namespace, pod("untolerated", tolerate_gpu=False))

    pending = wait_for_pod(
        kube.core,
        namespace,
        lambda p: (
            has_condition(p, "PodScheduled", "False")
            and condition(p, "PodScheduled").reason == "Unschedulable"
        ),
        what="the scheduler to report the pod Unschedulable",
    )

    assert "untolerated taint" in condition(pending, "PodScheduled").message
    assert pending.spec.node_name is None


def test_more_gpus_than_any_node_has_is_not_scheduled(kube: Kube, namespace: str) -> None:
    kube.core.create_namespaced_pod(namespace, pod("too-big", gpus=9))

    pending = wait_for_pod(
        kube.core,
        namespace,
        lambda p: has_condition(p, "PodScheduled", "False"),
        what="the scheduler to report 9 GPUs unschedulable",
    )

    assert "Insufficient nvidia.com/gpu" in condition(pending, "PodScheduled").message
