"""Decisions a platform team can trust, seen on the local control plane.

- A transient failure (the Hugging Face Hub answering 503 once) ends on the requested
  dtype, with no fallback; the crash is reported while it lasts.
- A dtype change on a one-replica service never leaves it without an available replica
  when the pool has a spare GPU (kvq surges).
- `kubectl scale` on an InferenceService (the scale subresource) changes the replicas
  without restarting the running one or touching the ladder.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e.devcluster.binaries import locate_binaries
from e2e.devcluster.clients import Kube
from e2e.devcluster.waits import wait_until
from kubernetes import watch

from kvq.api.keys import GROUP, PLURAL, VERSION
from tests.cluster.operator_support import (
    OperatorProcess,
    create_isvc,
    inference_service,
    install_kvq_crd,
    operator_running,
    read_isvc,
)

pytestmark = pytest.mark.cluster

HUB_503 = (
    "engine exited with code 1\nerror lines, most specific first:\n"
    "huggingface_hub.errors.HfHubHTTPError: 503 Server Error: Service Unavailable for url: "
    "https://huggingface.co/api/models/meta-llama/Meta-Llama-3-8B/revision/main"
)


@pytest.fixture
def operator(kube: Kube, namespace: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    install_kvq_crd(kube)
    with operator_running(kube, namespace, tmp_path / "operator.log") as process:
        yield process


def conditions(kube: Kube, namespace: str, name: str) -> dict[str, dict[str, Any]]:
    status = read_isvc(kube, namespace, name).get("status") or {}
    return {c["type"]: c for c in status.get("conditions") or []}


def is_ready(kube: Kube, namespace: str, name: str, dtype: str) -> bool:
    status = read_isvc(kube, namespace, name).get("status") or {}
    ready = conditions(kube, namespace, name).get("Ready", {}).get("status") == "True"
    return ready and (status.get("effective") or {}).get("kvCacheDtype") == dtype


def test_a_transient_hub_failure_ends_on_the_requested_dtype(
    kube: Kube, namespace: str, operator: OperatorProcess
) -> None:
    name = "hub-blip"
    env = [
        {"name": "KVQ_SIM_FAILURE", "value": "crash-then-run"},
        {"name": "KVQ_SIM_TERMINATION_MESSAGE", "value": HUB_503},
    ]
    create_isvc(kube, namespace, inference_service(name, engine={"env": env}))

    def reported() -> bool:
        found = conditions(kube, namespace, name)
        return found.get("Degraded", {}).get("reason") == "HubUnavailable"

    wait_until(reported, what="Degraded=HubUnavailable", timeout=90, describe=operator.log_tail)
    found = conditions(kube, namespace, name)
    assert found["Reconciling"]["status"] == "True"
    assert found["Stalled"]["status"] == "False"  # nothing for a person to do yet

    wait_until(
        lambda: is_ready(kube, namespace, name, "fp8"),
        what="Ready on fp8 after the restart",
        timeout=90,
        describe=operator.log_tail,
    )
    status = read_isvc(kube, namespace, name)["status"]
    assert status["fallback"]["attempts"] == []
    assert status["fallback"]["activeRung"] == "requested"
    assert conditions(kube, namespace, name)["Degraded"]["status"] == "False"


def test_a_dtype_change_keeps_a_replica_available_when_a_gpu_is_spare(
    kube: Kube, namespace: str, operator: OperatorProcess
) -> None:
    name = "no-downtime"
    # One replica on the H100 pool: one node, eight GPUs, so a surge replica fits.
    create_isvc(kube, namespace, inference_service(name, placement={"pools": ["gpu-h100"]}))
    wait_until(
        lambda: is_ready(kube, namespace, name, "fp8"),
        what="Ready on fp8",
        timeout=120,
        describe=operator.log_tail,
    )
    available: list[int] = []
    stop = threading.Event()

    def record() -> None:
        stream = watch.Watch()
        for event in stream.stream(
            kube.apps.list_namespaced_deployment,
            namespace,
            field_selector=f"metadata.name={name}",
            timeout_seconds=120,
        ):
            available.append(int(event["object"].status.available_replicas or 0))
            if stop.is_set():
                stream.stop()

    watcher = threading.Thread(target=record, daemon=True)
    watcher.start()
    wait_until(lambda: available, what="the watch's first event", timeout=30)

    kube.custom.patch_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name, {"spec": {"kvCache": {"dtype": "auto"}}}
    )
    wait_until(
        lambda: is_ready(kube, namespace, name, "auto"),
        what="Ready on auto after the rollout",
        timeout=120,
        describe=operator.log_tail,
    )
    stop.set()
    kube.custom.patch_namespaced_custom_object(  # one more event to end the watch
        GROUP, VERSION, namespace, PLURAL, name, {"metadata": {"labels": {"done": "yes"}}}
    )
    watcher.join(timeout=30)
    assert len(available) > 1
    assert min(available) >= 1, available
    deployment = kube.apps.read_namespaced_deployment(name, namespace)
    assert deployment.spec.strategy.rolling_update.max_unavailable == 0


def test_kubectl_scale_changes_replicas_without_restarting_or_resetting(
    kube: Kube, namespace: str, operator: OperatorProcess
) -> None:
    import subprocess

    name = "scaled"
    create_isvc(kube, namespace, inference_service(name, placement={"pools": ["gpu-h100"]}))
    wait_until(
        lambda: is_ready(kube, namespace, name, "fp8"),
        what="Ready",
        timeout=120,
        describe=operator.log_tail,
    )
    (first,) = kube.core.list_namespaced_pod(
        namespace, label_selector=f"kvq.dev/inferenceservice={name}"
    ).items

    scaled = subprocess.run(
        [
            str(locate_binaries().kubectl),
            f"--kubeconfig={kube.state.kubeconfig}",
            f"--namespace={namespace}",
            "scale",
            f"kis/{name}",
            "--replicas=2",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert scaled.returncode == 0, scaled.stderr

    def two_ready() -> bool:
        status = read_isvc(kube, namespace, name).get("status") or {}
        return status.get("readyReplicas") == 2 and is_ready(kube, namespace, name, "fp8")

    wait_until(two_ready, what="two ready replicas", timeout=120, describe=operator.log_tail)
    pods = kube.core.list_namespaced_pod(
        namespace, label_selector=f"kvq.dev/inferenceservice={name}"
    ).items
    assert first.metadata.uid in {p.metadata.uid for p in pods}  # not restarted
    status = read_isvc(kube, namespace, name)["status"]
    assert status["replicas"] == 2
    assert status["selector"] == f"app.kubernetes.io/name=vllm,kvq.dev/inferenceservice={name}"
    assert status["fallback"]["attempts"] == []
