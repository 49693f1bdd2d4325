"""Rendered manifests compared with the files under tests/golden/render/.

Regenerate after an intended change: KVQ_UPDATE_GOLDEN=1 pytest tests/unit/test_render_golden.py
and review the diff.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvq.api.resource import InferenceService
from kvq.render import render_manifests
from kvq.render.manifests import evidence_script
from tests.unit.render_cases import isvc, pool, settings

GOLDEN = Path(__file__).parents[1] / "golden" / "render"
UPDATE = os.environ.get("KVQ_UPDATE_GOLDEN") == "1"


@dataclass(frozen=True)
class Case:
    name: str
    service: Callable[[], InferenceService]
    product: str
    rung: str = "requested"


CASES = [
    Case(
        "h100-fp8",
        lambda: isvc(
            model={
                "uri": "hf://meta-llama/Llama-3.1-8B-Instruct",
                "revision": "0e9e39f249a16976918f6564b8830bc894c89659",
            },
            kvCache={"dtype": "fp8"},
            memory={"maxModelLen": 8192, "maxNumSeqs": 256, "gpuMemoryUtilization": 0.92},
        ),
        "H100-SXM-80GB",
    ),
    Case(
        "a100-int8-v0.22",
        lambda: isvc(
            engine={"image": "vllm/vllm-openai:v0.22.0"},
            kvCache={"dtype": "int8", "blockSize": 32},
        ),
        "A100-SXM4-80GB",
    ),
    Case(
        # --swap-space still parses on 0.17 but does nothing (V0 is gone): KV offloading.
        "l40s-fp8-v0.17-offload",
        lambda: isvc(
            engine={"image": "vllm/vllm-openai:v0.17.1"},
            kvCache={"dtype": "fp8_e4m3", "calculateScales": True},
            memory={"swapSpaceGiB": 8},
        ),
        "L40S",
    ),
    Case(
        # V0 swap: --swap-space per GPU, the pod's memory holding it on each worker.
        "a100-auto-v0.10-swap",
        lambda: isvc(
            engine={"image": "vllm/vllm-openai:v0.10.2"},
            memory={"swapSpaceGiB": 6},
            placement={"gpusPerReplica": 2},
        ),
        "A100-SXM4-80GB",
    ),
    Case(
        "a10g-awq",
        lambda: isvc(
            model={
                "uri": "hf://meta-llama/Llama-3.1-8B-Instruct",
                "awq": {"uri": "hf://hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4"},
            },
            kvCache={"dtype": "fp8"},
            fallback={"rungs": ["auto", "awq"]},
        ),
        "A10G",
        "awq",
    ),
    Case(
        "pvc-token",
        lambda: isvc(
            name="qwen",
            model={
                "uri": "pvc://model-store/qwen2.5-7b-instruct",
                "tokenSecretRef": {"name": "hf-token", "key": "token"},
            },
            engine={
                "env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}],
                "extraArgs": ["--enable-prefix-caching"],
            },
            placement={"gpusPerReplica": 2},
        ),
        "L4",
    ),
    Case(
        "h200-replicas2",
        lambda: isvc(
            name="chat",
            namespace="prod",
            kvCache={"dtype": "fp8"},
            replicas=2,
            placement={
                "nodeSelector": {"topology.kubernetes.io/zone": "us-east-1a"},
                "tolerations": [
                    {"key": "dedicated", "operator": "Equal", "value": "inference"},
                ],
            },
        ),
        "H200",
    ),
    Case(
        "hf-cached-claim",
        lambda: isvc(
            name="llama-cached",
            model={
                "uri": "hf://meta-llama/Llama-3.1-8B-Instruct",
                "revision": "0e9e39f249a16976918f6564b8830bc894c89659",
                "tokenSecretRef": {"name": "hf-token", "key": "token"},
                "cache": {
                    "volumeClaim": {"storageClassName": "fast-rwx", "accessMode": "ReadWriteMany"}
                },
            },
            kvCache={"dtype": "fp8"},
            replicas=2,
        ),
        "H100-SXM-80GB",
    ),
    Case(
        "s3-service-account",
        lambda: isvc(
            name="qwen-s3",
            model={
                "uri": "s3://acme-models/qwen2.5-7b-instruct",
                "architecture": {
                    "numLayers": 28,
                    "numAttentionHeads": 28,
                    "numKvHeads": 4,
                    "headDim": 128,
                    "numParams": 7615616512,
                },
                "cache": {"emptyDir": {}},
                "env": [{"name": "AWS_REGION", "value": "us-east-1"}],
            },
            engine={
                "env": [
                    {
                        "name": "VLLM_API_KEY",
                        "valueFrom": {"secretKeyRef": {"name": "vllm", "key": "api-key"}},
                    }
                ],
                "envFrom": [{"configMapRef": {"name": "vllm-settings"}}],
            },
            pod={
                "serviceAccountName": "model-reader",
                "imagePullSecrets": [{"name": "registry"}],
                "labels": {"team": "search"},
                "annotations": {"prometheus.io/scrape": "true"},
            },
            placement={"priorityClassName": "inference-high"},
        ),
        "L40S",
    ),
    Case(
        "tp4-replica",
        lambda: isvc(
            name="llama70b",
            model={
                "uri": "hf://meta-llama/Llama-3.1-70B-Instruct",
                "cache": {"claimName": "models"},
            },
            kvCache={"dtype": "fp8"},
            memory={"maxModelLen": 32768},
            replicas=2,
            engine={"runAsUser": 1000},
            placement={
                "gpusPerReplica": 4,
                "topologySpreadConstraints": [
                    {
                        "topologyKey": "topology.kubernetes.io/zone",
                        "whenUnsatisfiable": "DoNotSchedule",
                    }
                ],
                "affinity": {
                    "podAntiAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": [
                            {
                                "weight": 100,
                                "podAffinityTerm": {
                                    "topologyKey": "kubernetes.io/hostname",
                                    "labelSelector": {
                                        "matchLabels": {"kvq.dev/inferenceservice": "llama70b"}
                                    },
                                },
                            }
                        ]
                    }
                },
            },
        ),
        "H100-SXM-80GB",
    ),
    Case(
        # Two pipeline stages of four GPUs on one 8-GPU node: both sizes rendered.
        "tp4-pp2-one-node",
        lambda: isvc(
            name="llama70b",
            model={"uri": "hf://meta-llama/Llama-3.1-70B-Instruct"},
            kvCache={"dtype": "fp8"},
            memory={"maxModelLen": 32768},
            placement={"parallelism": {"tensor": 4, "pipeline": 2}},
        ),
        "H100-SXM-80GB",
    ),
]


def rendered_yaml(case: Case) -> str:
    service = case.service()
    objects = render_manifests(
        service, pool(case.product), settings(service, case.product, case.rung)
    )
    return yaml.safe_dump_all([_readable(o) for o in objects], sort_keys=True, width=100)


def _readable(obj: dict[str, Any]) -> dict[str, Any]:
    """The wrapper script stands in the golden as its digest (it has its own tests)."""
    if obj["kind"] != "ConfigMap":
        return obj
    digest = hashlib.sha256(evidence_script().encode()).hexdigest()
    data = {key: f"<evidence wrapper, sha256 {digest}>" for key in obj["data"]}
    return {**obj, "data": data}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_rendered_manifests_match_golden(case: Case) -> None:
    path = GOLDEN / f"{case.name}.yaml"
    text = rendered_yaml(case)
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} is missing: run with KVQ_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{case.name} changed: run with KVQ_UPDATE_GOLDEN=1, review"


def test_rendering_is_deterministic() -> None:
    for case in CASES:
        assert rendered_yaml(case) == rendered_yaml(case)
