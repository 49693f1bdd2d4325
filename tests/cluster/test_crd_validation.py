"""The API server itself enforces a CRD's CEL rules and reports the rule's message."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from e2e.devcluster.clients import Kube
from e2e.devcluster.waits import has_condition, wait_until
from kubernetes.client.exceptions import ApiException

pytestmark = pytest.mark.cluster

GROUP = "cel.test.kvq.dev"
RULE_MESSAGE = "gpuMemoryUtilization must be in (0, 1]"


def _crd(plural: str) -> dict[str, Any]:
    spec_schema = {
        "type": "object",
        "properties": {
            "gpuMemoryUtilization": {"type": "number"},
            "kvCacheDtype": {"type": "string"},
        },
        "x-kubernetes-validations": [
            {
                "rule": "self.gpuMemoryUtilization > 0.0 && self.gpuMemoryUtilization <= 1.0",
                "message": RULE_MESSAGE,
            }
        ],
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": plural[:-1], "kind": plural.capitalize()[:-1]},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {"spec": spec_schema},
                        }
                    },
                }
            ],
        },
    }


@pytest.fixture
def crd(kube: Kube) -> Iterator[tuple[str, str]]:
    plural = f"celtests{uuid.uuid4().hex[:6]}s"
    body = _crd(plural)
    kind = body["spec"]["names"]["kind"]
    kube.extensions.create_custom_resource_definition(body)

    def established() -> bool:
        read = kube.extensions.read_custom_resource_definition(body["metadata"]["name"])
        return has_condition(read, "Established")

    wait_until(established, what="the CRD to be Established", timeout=30)
    # Established can precede the discovery of the new resource by a moment.
    wait_until(
        lambda: kube.custom.list_cluster_custom_object(GROUP, "v1", plural),
        what="the new resource to be served",
        timeout=30,
        retry_on=(ApiException,),
    )
    try:
        yield plural, kind
    finally:
        kube.extensions.delete_custom_resource_definition(body["metadata"]["name"])


def _object(kind: str, name: str, utilization: float) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": kind,
        "metadata": {"name": name},
        "spec": {"gpuMemoryUtilization": utilization, "kvCacheDtype": "fp8"},
    }


def test_cel_rule_rejects_a_bad_object_with_its_message(
    kube: Kube, namespace: str, crd: tuple[str, str]
) -> None:
    plural, kind = crd

    with pytest.raises(ApiException) as rejected:
        kube.custom.create_namespaced_custom_object(
            GROUP, "v1", namespace, plural, _object(kind, "too-greedy", 1.5)
        )

    assert rejected.value.status == 422
    assert RULE_MESSAGE in str(rejected.value.body)


def test_cel_rule_admits_a_good_object(kube: Kube, namespace: str, crd: tuple[str, str]) -> None:
    plural, kind = crd

    created = kube.custom.create_namespaced_custom_object(
        GROUP, "v1", namespace, plural, _object(kind, "fine", 0.9)
    )

    assert created["spec"]["gpuMemoryUtilization"] == 0.9
