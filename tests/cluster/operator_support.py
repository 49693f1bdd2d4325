"""What the executor and operator tests share: the kvq CRD, InferenceServices, metric reads."""

from __future__ import annotations

from typing import Any

from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from prometheus_client import REGISTRY

from kvq.api.crd import crd_manifest
from kvq.api.models import GROUP, PLURAL, VERSION
from kvq.devcluster.clients import Kube
from kvq.devcluster.waits import wait_until


def install_kvq_crd(kube: Kube) -> None:
    """Server-side apply the committed-schema CRD (idempotent) and wait until it is served."""
    body = crd_manifest()
    name = body["metadata"]["name"]
    dynamic = DynamicClient(kube.api)
    crds = dynamic.resources.get(api_version="apiextensions.k8s.io/v1", kind=body["kind"])
    dynamic.server_side_apply(crds, body=body, field_manager="kvq-tests", force_conflicts=True)

    def established() -> bool:
        crd = kube.extensions.read_custom_resource_definition(name)
        return any(
            c.type == "Established" and c.status == "True" for c in crd.status.conditions or []
        )

    wait_until(established, what="the InferenceService CRD to be Established", timeout=30)
    wait_until(
        lambda: kube.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL) is not None,
        what="InferenceServices to be served",
        timeout=30,
        retry_on=(ApiException,),
    )


def inference_service(name: str, **spec: Any) -> dict[str, Any]:
    """Llama-3-8B with an FP8 KV cache: the hetero profile has pools that can run it."""
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "model": {"uri": "hf://meta-llama/Meta-Llama-3-8B"},
            "kvCache": {"dtype": "fp8"},
            "memory": {"maxModelLen": 8192},
        },
    }
    body["spec"].update(spec)
    return body


def create_isvc(kube: Kube, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    created: dict[str, Any] = kube.custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, body
    )
    return created


def read_isvc(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = kube.custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name
    )
    return found


def writes_so_far() -> float:
    """kvq_writes_total summed over kinds and verbs, in this process."""
    total = 0.0
    for metric in REGISTRY.collect():
        if metric.name == "kvq_writes":
            total += sum(s.value for s in metric.samples if s.name == "kvq_writes_total")
    return total
