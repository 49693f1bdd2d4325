#!/usr/bin/env python3
"""Prints a List of N x (Deployment of one 1-GPU pod, Service, PodDisruptionBudget) spread
over the `fleet` profile's four pools: what kvq renders per InferenceService, without kvq.
Used to measure the dev cluster's capacity (e2e/README.md "Measurements"):

    kubectl create namespace load
    python3 e2e/scripts/fleet-objects.py 1000 | kubectl create -f -
"""

from __future__ import annotations

import json
import sys

POOLS = (
    ("karpenter.sh/nodepool", "gpu-h100"),
    ("karpenter.sh/nodepool", "gpu-h200"),
    ("cloud.google.com/gke-nodepool", "l4-pool"),
    ("cloud.google.com/gke-nodepool", "a100-80gb-pool"),
)


def objects(count: int, namespace: str) -> list[dict[str, object]]:
    items: list[dict[str, object]] = []
    for i in range(count):
        name, labels = f"svc-{i:04d}", {"app": f"svc-{i:04d}"}
        key, pool = POOLS[i % len(POOLS)]
        meta = {"name": name, "namespace": namespace}
        pod = {
            "nodeSelector": {key: pool},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "containers": [
                {
                    "name": "engine",
                    "image": "vllm/vllm-openai:v0.26.0",
                    "ports": [{"containerPort": 8000, "name": "http"}],
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        }
        items += [
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": meta,
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": labels},
                    "template": {"metadata": {"labels": labels}, "spec": pod},
                },
            },
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": meta,
                "spec": {"selector": labels, "ports": [{"port": 8000, "name": "http"}]},
            },
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": meta,
                "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels}},
            },
        ]
    return items


if __name__ == "__main__":
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    namespace = sys.argv[2] if len(sys.argv) > 2 else "load"
    json.dump({"apiVersion": "v1", "kind": "List", "items": objects(count, namespace)}, sys.stdout)
