"""The executor against the real API server: apply, zero-write steady state, status, GC.

Plans here are built by hand (the executor decides nothing, so any plan will do); one test
runs the whole reconcile() without kopf to see a stale read become a retry.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from e2e.devcluster.clients import Kube
from e2e.devcluster.waits import wait_for_deletion, wait_until
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from kvq.api import keys
from kvq.api.keys import GROUP, PLURAL, VERSION
from kvq.api.status import InferenceServiceStatus
from kvq.catalog.engines import load_engine_catalog
from kvq.catalog.gpus import load_gpu_catalog
from kvq.catalog.models import load_model_catalog
from kvq.decide.types import Catalogs, EventSpec, ObjectRef, OperatorConfig, Plan
from kvq.handlers.reconcile import Observed, Runtime, reconcile
from kvq.k8s.clients import Clients
from kvq.k8s.executor import ExecutionResult, Memory, execute
from kvq.k8s.logs import read_log_tails
from kvq.k8s.status_writer import StatusConflictError
from tests.cluster import manifests
from tests.cluster.operator_support import (
    create_isvc,
    inference_service,
    install_kvq_crd,
    read_isvc,
    writes_so_far,
)

pytestmark = pytest.mark.cluster

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
NAME = "llama"


@pytest.fixture(scope="module")
def crd(kube: Kube) -> None:
    install_kvq_crd(kube)


@pytest.fixture
def clients(kube: Kube) -> Iterator[Clients]:
    yield Clients(kube.api)


@pytest.fixture
def isvc(kube: Kube, namespace: str, crd: None) -> dict[str, Any]:
    return create_isvc(kube, namespace, inference_service(NAME))


def labels() -> dict[str, str]:
    return {
        keys.LABEL_MANAGED_BY: keys.MANAGED_BY_VALUE,
        keys.LABEL_INFERENCESERVICE: NAME,
        keys.LABEL_NAME: keys.NAME_VALUE,
    }


def owned_metadata(isvc: dict[str, Any], name: str) -> dict[str, Any]:
    meta = isvc["metadata"]
    return {
        "name": name,
        "namespace": meta["namespace"],
        "labels": labels(),
        "ownerReferences": [
            {
                "apiVersion": isvc["apiVersion"],
                "kind": isvc["kind"],
                "name": meta["name"],
                "uid": meta["uid"],
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }


def hand_plan(
    isvc: dict[str, Any],
    *,
    spec_hash: str = "h1",
    ready: str = "False",
    events: tuple[EventSpec, ...] = (),
    delete: tuple[ObjectRef, ...] = (),
) -> Plan:
    """A ConfigMap and a Deployment (on the L4 pool), and a status: what decide() returns."""
    selector = {keys.LABEL_INFERENCESERVICE: NAME, keys.LABEL_NAME: keys.NAME_VALUE}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": owned_metadata(isvc, NAME),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {
                    "labels": labels(),
                    "annotations": {keys.ANNOTATION_SPEC_HASH: spec_hash},
                },
                "spec": {
                    "containers": [
                        {
                            "name": "vllm",
                            "image": "registry.invalid/vllm/vllm-openai:v0.26.0",
                            "args": ["--kv-cache-dtype", "fp8", "--spec-hash", spec_hash],
                            "resources": {"limits": {keys.GPU_RESOURCE: "1"}},
                        }
                    ],
                    "nodeSelector": {keys.GFD_PRODUCT_LABEL: "NVIDIA-L4"},
                    "tolerations": [
                        {"key": keys.GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}
                    ],
                },
            },
        },
    }
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": owned_metadata(isvc, f"{NAME}-kvq-evidence"),
        "data": {"wrapper.sh": '#!/bin/sh\nexec "$@"\n'},
    }
    status = {
        "observedGeneration": 1,
        "conditions": [
            {
                "type": "Ready",
                "status": ready,
                "reason": "Available" if ready == "True" else "Progressing",
                "message": "test",
                "lastTransitionTime": "2026-11-30T12:00:00Z",
                "observedGeneration": 1,
            }
        ],
    }
    return Plan(
        apply=(config_map, deployment),
        delete=delete,
        service_status=InferenceServiceStatus.model_validate(status),
        events=events,
    )


def deployment(kube: Kube, namespace: str) -> k8s.V1Deployment:
    return kube.apps.read_namespaced_deployment(NAME, namespace)


def rolled_out(found: k8s.V1Deployment) -> bool:
    status = found.status
    return bool(
        status
        and status.observed_generation == found.metadata.generation
        and (status.ready_replicas or 0) == found.spec.replicas
        and (status.updated_replicas or 0) == found.spec.replicas
    )


def live(kube: Kube, namespace: str) -> list[dict[str, Any]]:
    """What the operator's watch cache would hold: kvq's objects as the server stores them."""
    found: list[Any] = [
        *kube.core.list_namespaced_config_map(namespace).items,
        *kube.apps.list_namespaced_deployment(namespace).items,
    ]
    objects = []
    for item in found:
        body: dict[str, Any] = kube.api.sanitize_for_serialization(item)
        body.setdefault("apiVersion", "v1" if isinstance(item, k8s.V1ConfigMap) else "apps/v1")
        body.setdefault("kind", type(item).__name__.removeprefix("V1"))
        objects.append(body)
    return objects


def run(
    clients: Clients,
    plan: Plan,
    isvc: dict[str, Any],
    kube: Kube,
    memory: Memory | None = None,
) -> ExecutionResult:
    namespace = isvc["metadata"]["namespace"]
    result = asyncio.run(
        execute(clients, plan, isvc, live(kube, namespace), memory or Memory(), NOW)
    )
    for posted in result.events:
        posted.result(timeout=30)  # no pass waits for its Events; these tests read them
    return result


def test_apply_creates_the_objects_owned_by_the_inference_service(
    kube: Kube, namespace: str, clients: Clients, isvc: dict[str, Any]
) -> None:
    before = writes_so_far()

    outcome = run(clients, hand_plan(isvc), isvc, kube)

    assert outcome.applied == ("ConfigMap/llama-kvq-evidence", "Deployment/llama")
    assert outcome.status_written
    assert writes_so_far() - before == 3
    for obj in (
        deployment(kube, namespace),
        kube.core.read_namespaced_config_map(f"{NAME}-kvq-evidence", namespace),
    ):
        (owner,) = obj.metadata.owner_references
        assert (owner.kind, owner.uid, owner.controller) == (
            "InferenceService",
            isvc["metadata"]["uid"],
            True,
        )
        fields = {m.manager for m in obj.metadata.managed_fields}
        assert keys.FIELD_MANAGER in fields
    stored = read_isvc(kube, namespace, NAME)
    assert stored["status"]["conditions"][0]["reason"] == "Progressing"


def test_the_same_plan_again_writes_nothing(
    kube: Kube, namespace: str, clients: Clients, isvc: dict[str, Any]
) -> None:
    plan = hand_plan(isvc)
    run(clients, plan, isvc, kube)
    # The controllers fill in the Deployment's status and revision (not kvq's to undo);
    # once its pod is available they stop writing, so the resourceVersion is kvq's to keep.
    wait_until(
        lambda: deployment(kube, namespace).status.available_replicas == 1,
        what="the Deployment to settle with its pod available",
    )
    versions = {
        "deployment": deployment(kube, namespace).metadata.resource_version,
        "configmap": kube.core.read_namespaced_config_map(
            f"{NAME}-kvq-evidence", namespace
        ).metadata.resource_version,
    }
    fresh = read_isvc(kube, namespace, NAME)
    before = writes_so_far()

    again = run(clients, plan, fresh, kube)

    assert again.writes == 0
    assert again.unchanged == ("ConfigMap/llama-kvq-evidence", "Deployment/llama")
    assert writes_so_far() == before
    assert deployment(kube, namespace).metadata.resource_version == versions["deployment"]
    assert (
        kube.core.read_namespaced_config_map(
            f"{NAME}-kvq-evidence", namespace
        ).metadata.resource_version
        == versions["configmap"]
    )
    assert (
        read_isvc(kube, namespace, NAME)["metadata"]["resourceVersion"]
        == (fresh["metadata"]["resourceVersion"])
    )


def test_a_changed_plan_updates_the_deployment_in_place(
    kube: Kube, namespace: str, clients: Clients, isvc: dict[str, Any]
) -> None:
    run(clients, hand_plan(isvc, spec_hash="h1"), isvc, kube)
    first = deployment(kube, namespace)

    outcome = run(clients, hand_plan(isvc, spec_hash="h2"), read_isvc(kube, namespace, NAME), kube)

    second = deployment(kube, namespace)
    assert outcome.applied == ("Deployment/llama",)
    assert second.metadata.uid == first.metadata.uid
    assert second.metadata.generation == first.metadata.generation + 1
    annotations = second.spec.template.metadata.annotations
    assert annotations[keys.ANNOTATION_SPEC_HASH] == "h2"
    assert second.spec.template.spec.containers[0].args[-1] == "h2"


def test_a_field_someone_else_changed_is_taken_back(
    kube: Kube, namespace: str, clients: Clients, isvc: dict[str, Any]
) -> None:
    plan = hand_plan(isvc)
    run(clients, plan, isvc, kube)
    kube.apps.patch_namespaced_deployment_scale(NAME, namespace, {"spec": {"replicas": 3}})

    outcome = run(clients, plan, read_isvc(kube, namespace, NAME), kube)

    assert outcome.applied == ("Deployment/llama",)
    assert deployment(kube, namespace).spec.replicas == 1


def test_status_is_written_once_and_not_rewritten_when_equal(
    kube: Kube, namespace: str, clients: Clients, isvc: dict[str, Any]
) -> None:
    run(clients, hand_plan(isvc, ready="True"), isvc, kube)
    stored = read_isvc(kube, namespace, NAME)

    again = run(clients, hand_plan(isvc, ready="True"), stored, kube)

    assert not again.status_written
    after = read_isvc(kube, namespace, NAME)
    assert after["metadata"]["resourceVersion"] == stored["metadata"]["resourceVersion"]
    assert after["status"]["conditions"][0]["status"] == "True"


def test_status_from_a_stale_read_is_a_conflict_not_an_overwrite(
    kube: Kube, namespace: str, clients: Clients, isvc: dict[str, Any]
) -> None:
    stale = copy.deepcopy(isvc)
    kube.custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, NAME, {"metadata": {"labels": {"team": "a"}}}
    )

    with pytest.raises(StatusConflictError):
        run(clients, hand_plan(isvc), stale, kube)

    assert not read_isvc(kube, namespace, NAME).get("status")


def runtime_for(clients: Clients, kube: Kube) -> Runtime:
    runtime = Runtime(
        catalogs=Catalogs(load_gpu_catalog(), load_engine_catalog(), load_model_catalog()),
        config=OperatorConfig(),
        clients=clients,
    )
    for node in kube.core.list_node().items:  # what the operator's node watch feeds it
        runtime.fleet.node(node.metadata.name, kube.api.sanitize_for_serialization(node))
    return runtime


def observed(kube: Kube, body: dict[str, Any]) -> Observed:
    namespace = body["metadata"]["namespace"]
    return Observed(body=body, pods=[], owned=live(kube, namespace))


def test_reconcile_from_a_stale_read_is_a_conflict_then_converges(
    kube: Kube, namespace: str, clients: Clients, isvc: dict[str, Any]
) -> None:
    runtime = runtime_for(clients, kube)
    stale = copy.deepcopy(isvc)
    kube.custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, NAME, {"metadata": {"labels": {"team": "a"}}}
    )

    first = reconcile(runtime, observed(kube, stale))

    assert first.passed.conflict
    assert not read_isvc(kube, namespace, NAME).get("status")
    second = reconcile(runtime, observed(kube, read_isvc(kube, namespace, NAME)))
    assert second.result is not None and second.result.status_written
    owner = deployment(kube, namespace).metadata.owner_references[0]
    assert owner.uid == isvc["metadata"]["uid"]
    stored = read_isvc(kube, namespace, NAME)
    assert stored["metadata"]["labels"] == {"team": "a"}
    placed = {c["type"]: c for c in stored["status"]["conditions"]}
    assert placed["Placed"]["status"] == "True"
    # kvq's status follows the Deployment's: once the rollout has settled and a pass has
    # read it, a pass over what the watch cache holds writes nothing at all.
    wait_until(
        lambda: rolled_out(deployment(kube, namespace)),
        what="the Deployment rolled out",
        timeout=60,
    )
    reconcile(runtime, observed(kube, read_isvc(kube, namespace, NAME)))
    before = writes_so_far()
    third = reconcile(runtime, observed(kube, read_isvc(kube, namespace, NAME)))
    assert third.result is not None and third.result.writes == 0
    assert writes_so_far() == before


def test_events_are_posted_about_the_inference_service(
    kube: Kube, namespace: str, clients: Clients, isvc: dict[str, Any]
) -> None:
    event = EventSpec("Warning", "FallbackToAuto", "fp8 rejected by the engine; serving auto")

    run(clients, hand_plan(isvc, events=(event,)), isvc, kube)

    selector = f"involvedObject.uid={isvc['metadata']['uid']}"
    posted = kube.core.list_namespaced_event(namespace, field_selector=selector).items
    assert [(e.type, e.reason, e.message) for e in posted] == [
        ("Warning", "FallbackToAuto", "fp8 rejected by the engine; serving auto")
    ]


def test_delete_removes_kvq_objects_only(
    kube: Kube, namespace: str, clients: Clients, isvc: dict[str, Any]
) -> None:
    ours = {"metadata": owned_metadata(isvc, "ours"), "data": {}}
    theirs = {"metadata": {"name": "theirs"}, "data": {}}
    for body in (ours, theirs):
        kube.core.create_namespaced_config_map(namespace, body)
    refs = tuple(ObjectRef("v1", "ConfigMap", namespace, n) for n in ("ours", "theirs", "gone"))

    outcome = run(clients, hand_plan(isvc, delete=refs), isvc, kube)

    assert outcome.deleted == ("ConfigMap/ours",)
    wait_for_deletion(
        lambda: kube.core.read_namespaced_config_map("ours", namespace), what="ours deleted"
    )
    assert kube.core.read_namespaced_config_map("theirs", namespace).metadata.name == "theirs"


def test_deleting_the_inference_service_collects_its_children(
    kube: Kube, namespace: str, clients: Clients, isvc: dict[str, Any]
) -> None:
    run(clients, hand_plan(isvc), isvc, kube)

    kube.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, NAME)

    for read in (
        lambda: deployment(kube, namespace),
        lambda: kube.core.read_namespaced_config_map(f"{NAME}-kvq-evidence", namespace),
    ):
        wait_for_deletion(read, what="the garbage collector to delete a child")
    with pytest.raises(ApiException) as gone:
        read_isvc(kube, namespace, NAME)
    assert gone.value.status == 404


def test_an_unreadable_spec_is_ready_false_with_one_warning(
    kube: Kube, namespace: str, clients: Clients, isvc: dict[str, Any]
) -> None:
    # The CRD refuses this at apply time; an older CRD would not: kvq must still cope.
    runtime = runtime_for(clients, kube)

    def as_if_invalid() -> Observed:
        body = read_isvc(kube, namespace, NAME)
        body["spec"]["memory"]["gpuMemoryUtilization"] = 1.5
        return Observed(body=body, pods=[], owned=[])

    assert reconcile(runtime, as_if_invalid()).plan is None
    assert reconcile(runtime, as_if_invalid()).plan is None

    conditions = {c["type"]: c for c in read_isvc(kube, namespace, NAME)["status"]["conditions"]}
    ready = conditions["Ready"]
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert conditions["Stalled"]["status"] == "True"
    assert "gpuMemoryUtilization" in ready["message"]
    selector = f"involvedObject.uid={isvc['metadata']['uid']},type=Warning"
    warnings = kube.core.list_namespaced_event(namespace, field_selector=selector).items
    assert [e.reason for e in warnings] == ["InvalidSpec"]
    assert not kube.apps.list_namespaced_deployment(namespace).items


def test_a_log_tail_the_node_cannot_serve_is_left_out(
    kube: Kube, namespace: str, clients: Clients
) -> None:
    pod = kube.core.create_namespaced_pod(namespace, manifests.pod("engine"))
    wait_until(
        lambda: kube.core.read_namespaced_pod("engine", namespace).status.pod_ip,
        what="the KWOK pod to start",
    )
    body = kube.api.sanitize_for_serialization(pod)

    tails = read_log_tails(clients, namespace, ["engine", "absent"], [body], OperatorConfig())

    assert tails == {}
