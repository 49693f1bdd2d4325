"""Real LeaderWorkerSet on the local control plane: a group becomes its leader and worker pods.

Upstream's controller and webhooks (the `lws` add-on) on KWOK nodes: a LeaderWorkerSet of
size 2 becomes a leader pod and a worker pod that knows its leader's address, its status
counts the group ready, its scale subresource (what KEDA and the HPA drive) adds a group,
and deleting it removes every pod.
"""

from __future__ import annotations

from typing import Any

import pytest
from e2e.devcluster.clients import Kube
from e2e.devcluster.waits import has_condition, is_running_and_ready, wait_until

pytestmark = pytest.mark.cluster

NAME = "engine-group"
GROUP = "leaderworkerset.x-k8s.io"
PLURAL = "leaderworkersets"
SIZE = 2
TIMEOUT = 120
NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"


def leader_worker_set(replicas: int) -> dict[str, Any]:
    pod = {
        "spec": {
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "containers": [{"name": "engine", "image": "vllm/vllm-openai:v0.26.0"}],
        }
    }
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": NAME},
        "spec": {
            "replicas": replicas,
            "leaderWorkerTemplate": {"size": SIZE, "workerTemplate": pod},
        },
    }


def group_pods(kube: Kube, namespace: str) -> list[Any]:
    pods = kube.core.list_namespaced_pod(namespace, label_selector=f"{NAME_LABEL}={NAME}")
    return list(pods.items)


def ready_pods(kube: Kube, namespace: str, count: int) -> list[Any] | None:
    pods = group_pods(kube, namespace)
    if len(pods) == count and all(is_running_and_ready(p) for p in pods):
        return pods
    return None


def read_lws(kube: Kube, namespace: str) -> Any:
    return kube.custom.get_namespaced_custom_object(GROUP, "v1", namespace, PLURAL, NAME)


def env_of(pod: Any) -> dict[str, str]:
    return {e.name: e.value for e in pod.spec.containers[0].env or [] if e.value is not None}


def test_a_group_becomes_its_leader_and_worker_and_scales_by_its_subresource(
    kube: Kube, lws: dict[str, str], namespace: str
) -> None:
    kube.custom.create_namespaced_custom_object(
        GROUP, "v1", namespace, PLURAL, leader_worker_set(replicas=1)
    )
    pods = wait_until(
        lambda: ready_pods(kube, namespace, SIZE),
        what="the group's leader and worker pods running and ready",
        timeout=TIMEOUT,
    )
    by_index = {p.metadata.labels[WORKER_INDEX]: p for p in pods}
    assert sorted(by_index) == ["0", "1"]
    leader, worker = by_index["0"], by_index["1"]
    # The pod webhook tells every pod of the group where its leader is (the launch's
    # --master-addr); the leader's pod is the group's first.
    assert env_of(worker)["LWS_LEADER_ADDRESS"].startswith(f"{leader.metadata.name}.{NAME}.")
    assert env_of(worker)["LWS_WORKER_INDEX"] == "1"
    assert leader.spec.node_name and worker.spec.node_name

    def counted_ready() -> Any:
        found = read_lws(kube, namespace)
        status = found.get("status") or {}
        ready = status.get("readyReplicas") == 1 and has_condition(found, "Available")
        return found if ready else None

    wait_until(counted_ready, what="the LeaderWorkerSet Available, 1 group ready", timeout=TIMEOUT)

    # What KEDA's HPA does: write the scale subresource; a second group is two more pods.
    kube.custom.patch_namespaced_custom_object_scale(
        GROUP, "v1", namespace, PLURAL, NAME, {"spec": {"replicas": 2}}
    )
    pods = wait_until(
        lambda: ready_pods(kube, namespace, 2 * SIZE),
        what="two groups of pods running and ready",
        timeout=TIMEOUT,
    )
    assert sorted({p.metadata.labels[GROUP_INDEX] for p in pods}) == ["0", "1"]
    scale: Any = kube.custom.get_namespaced_custom_object_scale(
        GROUP, "v1", namespace, PLURAL, NAME
    )
    assert scale["spec"]["replicas"] == 2
    wait_until(
        lambda: (
            kube.custom.get_namespaced_custom_object_scale(GROUP, "v1", namespace, PLURAL, NAME)[
                "status"
            ].get("replicas")
            == 2
        ),
        what="the scale subresource's status counting two groups",
        timeout=TIMEOUT,
    )

    kube.custom.delete_namespaced_custom_object(GROUP, "v1", namespace, PLURAL, NAME)
    wait_until(
        lambda: not group_pods(kube, namespace),
        what="every pod of the deleted LeaderWorkerSet gone",
        timeout=TIMEOUT,
    )
