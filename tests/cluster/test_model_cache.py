"""The engine pod kvq renders with a model cache, on the real control plane (KWOK nodes):
it binds and mounts the cache kvq asked for, runs the download step before the engine,
and a failed download shows up as the init container's failure, which kvq classifies as
ModelUnavailable (never as the KV-cache dtype's fault)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from e2e.devcluster.clients import Kube
from e2e.devcluster.waits import wait_for_pod, wait_until

from kvq.api.resource import InferenceService
from kvq.catalog.engines import load_engine_catalog
from kvq.catalog.gpus import load_gpu_catalog
from kvq.catalog.models import load_model_catalog
from kvq.fallback.evidence import evidence_from_pod
from kvq.fetch.failures import classify_fetch_failure, fetch_termination_message
from kvq.placement.pool import pool_for_gpu
from kvq.planner.architecture import resolve_architecture
from kvq.render import effective_settings, render_manifests

pytestmark = pytest.mark.cluster

HUB_404 = (
    "kvq fetch hf://meta-llama/Llama-3.1-8B-Instruct failed\n"
    "huggingface_hub.errors.RepositoryNotFoundError: 404 Client Error. (Request ID: Root=1-6)"
    "\n\nRepository Not Found for url: https://huggingface.co/api/models/meta-llama/"
    "Llama-3.1-8B-Instruct/revision/main."
)


def _manifests(name: str, namespace: str, **model: Any) -> list[dict[str, Any]]:
    body = {
        "apiVersion": "kvq.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"uri": "hf://meta-llama/Llama-3.1-8B-Instruct", **model},
            "kvCache": {"dtype": "fp8"},
        },
    }
    isvc = InferenceService.model_validate(body)
    gpu = load_gpu_catalog().lookup("H100")
    assert gpu is not None
    arch = resolve_architecture(isvc.spec.model, load_model_catalog())
    effective = effective_settings(isvc, gpu, engines=load_engine_catalog(), arch=arch)
    return render_manifests(isvc, pool_for_gpu(gpu), effective)


def _create(kube: Kube, namespace: str, objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        kind = obj["kind"]
        if kind == "ConfigMap":
            kube.core.create_namespaced_config_map(namespace, obj)
        elif kind == "Deployment":
            kube.apps.create_namespaced_deployment(namespace, obj)
        elif kind == "Service":
            kube.core.create_namespaced_service(namespace, obj)
        elif kind == "PersistentVolumeClaim":
            kube.core.create_namespaced_persistent_volume_claim(namespace, obj)


@pytest.fixture
def volume(kube: Kube) -> Iterator[str]:
    """A PersistentVolume of a class no provisioner serves: only kvq's claim can bind it."""
    name = f"kvq-cache-{uuid.uuid4().hex[:8]}"
    kube.core.create_persistent_volume(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": name},
            "spec": {
                "capacity": {"storage": "100Gi"},
                "accessModes": ["ReadWriteMany"],
                "storageClassName": name,
                "persistentVolumeReclaimPolicy": "Delete",
                "hostPath": {"path": f"/tmp/{name}"},
            },
        }
    )
    try:
        yield name
    finally:
        kube.core.delete_persistent_volume(name)


def test_pod_binds_and_mounts_the_cache_and_downloads_first(
    kube: Kube, namespace: str, volume: str
) -> None:
    objects = _manifests(
        "cached",
        namespace,
        revision="main",
        cache={"volumeClaim": {"storageClassName": volume, "accessMode": "ReadWriteMany"}},
    )
    _create(kube, namespace, objects)
    [claim] = [o for o in objects if o["kind"] == "PersistentVolumeClaim"]
    claim_name = claim["metadata"]["name"]

    def bound() -> Any:
        pvc = kube.core.read_namespaced_persistent_volume_claim(claim_name, namespace)
        return pvc if pvc.status.phase == "Bound" else None

    pvc = wait_until(bound, what=f"claim {claim_name} Bound")
    assert pvc.spec.volume_name == volume
    assert pvc.spec.resources.requests["storage"] == "19Gi"  # 14.96 GiB x 1.2 + 1 GiB

    running = wait_for_pod(
        kube.core,
        namespace,
        lambda p: p.status.phase == "Running" and bool(p.status.init_container_statuses),
        what="the engine pod Running after its download step",
    )
    volumes = {v.name: v for v in running.spec.volumes}
    assert volumes["kvq-cache"].persistent_volume_claim.claim_name == claim_name
    [fetch] = running.spec.init_containers
    assert fetch.name == "kvq-fetch"
    assert {m.mount_path: m.read_only for m in fetch.volume_mounts}["/kvq-cache"] in (None, False)
    [engine] = running.spec.containers
    mounts = {m.mount_path: m for m in engine.volume_mounts}
    assert mounts["/kvq-cache"].read_only is True
    assert mounts["/kvq-model"].read_only is True
    assert engine.command[engine.command.index("--model") + 1] == "/kvq-model/model"
    # The API server took the derived fields as they are (and the GPU request from its limit).
    assert engine.resources.requests == {"cpu": "4", "memory": "21Gi", "nvidia.com/gpu": "1"}
    assert engine.resources.limits == {"memory": "21Gi", "nvidia.com/gpu": "1"}
    assert running.spec.security_context.fs_group == 65532
    assert running.spec.automount_service_account_token is False
    [init_status] = running.status.init_container_statuses
    assert init_status.state.terminated.reason == "Completed"


def test_failed_download_is_the_init_containers_and_model_unavailable(
    kube: Kube, namespace: str
) -> None:
    objects = _manifests(
        "unavailable",
        namespace,
        cache={"emptyDir": {}},
        # Read by the KWOK stages only: the download step fails with the Hub's 404.
        env=[
            {"name": "KVQ_SIM_FAILURE", "value": "crash-loop"},
            {"name": "KVQ_SIM_TERMINATION_MESSAGE", "value": HUB_404},
        ],
    )
    _create(kube, namespace, objects)

    failed = wait_for_pod(
        kube.core,
        namespace,
        lambda p: (
            bool(p.status.init_container_statuses)
            and p.status.init_container_statuses[0].state.waiting is not None
        ),
        what="the download step in CrashLoopBackOff",
    )
    assert failed.status.phase == "Pending"
    assert failed.status.container_statuses[0].state.waiting.reason == "PodInitializing"

    pod = kube.api.sanitize_for_serialization(failed)
    message = fetch_termination_message(pod)
    assert message == HUB_404
    reason, text = classify_fetch_failure(message)
    assert reason == "ModelUnavailable"
    assert "has no such repository" in text
    assert "RepositoryNotFoundError: 404 Client Error" in text
    # The engine container has not failed: evidence read from it alone sees nothing, so no
    # KV-cache fallback can start from this pod.
    assert evidence_from_pod(pod) is None
