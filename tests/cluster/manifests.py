"""Small manifests the cluster tests create (dicts, as a user would write YAML)."""

from __future__ import annotations

from typing import Any

GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def container(name: str = "main", gpus: int = 0) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": "100m", "memory": "64Mi"}}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    return {"name": name, "image": "registry.invalid/kvq/fake:1", "resources": resources}


def pod(
    name: str,
    *,
    annotations: dict[str, str] | None = None,
    gpus: int = 1,
    node_selector: dict[str, str] | None = None,
    tolerate_gpu: bool = True,
    restart_policy: str = "Always",
    containers: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {
            "containers": containers or [container(gpus=gpus)],
            "nodeSelector": node_selector or {},
            "tolerations": [GPU_TOLERATION] if tolerate_gpu else [],
            "restartPolicy": restart_policy,
        },
    }


def gpu_deployment(name: str, product: str, gpus: int = 1) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [container(gpus=gpus)],
                    "nodeSelector": {"nvidia.com/gpu.product": product},
                    "tolerations": [GPU_TOLERATION],
                },
            },
        },
    }
