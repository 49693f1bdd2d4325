"""A replica over several nodes placed whole: every pod of the group on a node of the same
pool with its share of the GPUs free, bound pods and other services' unbound groups counted
(kvq.placement.choice, kvq.placement.claims), each pod's memory checked against a node."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from e2e.devcluster.profiles import load_profile, node_manifests

from kvq.catalog.gpus import load_gpu_catalog
from kvq.catalog.models import load_model_catalog
from kvq.placement.choice import PoolChoice, PoolRequest, choose_pool
from kvq.placement.claims import GpuClaim, gpu_claim
from kvq.placement.discovery import GpuPod, Inventory, discover_pools
from kvq.placement.fleet import Fleet
from kvq.placement.pool import nodes_per_replica
from tests.unit.test_choice import ENGINE, request

LLAMA_405B = load_model_catalog().lookup("meta-llama/Llama-3.1-405B-Instruct")
MINE = ("team-a", "big")
OTHER = ("team-b", "other")


def h100_nodes(count: int) -> list[dict[str, Any]]:
    """`count` p5.48xlarge nodes (8 H100 each) of Karpenter node pool gpu-h100."""
    [base] = [
        n
        for n in node_manifests(load_profile("hetero"))
        if n["metadata"]["labels"].get("karpenter.sh/nodepool") == "gpu-h100"
    ]
    found = []
    for i in range(count):
        node = copy.deepcopy(base)
        node["metadata"]["name"] = f"aws-h100-{i}"
        node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
        found.append(node)
    return found


def pools(
    count: int, pods: tuple[GpuPod, ...] = (), claims: tuple[GpuClaim, ...] = ()
) -> Inventory:
    return discover_pools(h100_nodes(count), load_gpu_catalog(), gpu_pods=pods, claims=claims)


def group(replicas: int = 1, **overrides: Any) -> PoolRequest:
    """Llama-3.1-405B in fp8 KV, tensor 8 x pipeline 2: 16 GPUs, two 8-GPU nodes a replica."""
    fields: dict[str, Any] = {
        "gpus_per_replica": 16,
        "pipeline_parallel": 2,
        "parallelism_declared": True,
        "replicas": replicas,
        "owner": MINE,
        "allowed_pools": ("gpu-h100",),
    }
    return request(**{**fields, **overrides})


def place(req: PoolRequest, inventory: Inventory) -> PoolChoice:
    assert LLAMA_405B is not None
    return choose_pool(req, inventory, ENGINE, LLAMA_405B.architecture)


@pytest.mark.parametrize(
    ("tensor", "pipeline", "per_node", "nodes"),
    [
        (8, 2, 8, 2),  # Llama-3.1-405B on two p5.48xlarge
        (4, 4, 8, 2),  # two stages of TP 4 on each node
        (8, 4, 8, 4),
        (4, 2, 8, 1),  # fits on one node
        (8, 1, 4, None),  # tensor parallel over nodes: not how kvq splits
        (16, 1, 8, None),
        (2, 3, 4, None),  # 6 GPUs do not fill whole 4-GPU nodes
    ],
)
def test_nodes_a_replica_spans(tensor: int, pipeline: int, per_node: int, nodes: int) -> None:
    assert nodes_per_replica(tensor, pipeline, per_node) == nodes


def test_a_group_takes_whole_free_nodes_of_one_pool() -> None:
    # Three nodes, one half taken by somebody's 4-GPU pod: 20 GPUs free, but only two nodes
    # can take a pod of 8, so one group fits, not two.
    busy = (GpuPod("aws-h100-2", 4, None),)
    choice = place(group(replicas=2), pools(3, busy))
    assert choice.chosen is not None and choice.chosen.fits
    assert choice.chosen.slots == 1
    assert choice.why_not_now() == (
        "pool gpu-h100: room for 1 of 2 replicas now (20 free GPUs on 3 usable nodes, "
        "2 nodes of 8 per replica)"
    )
    assert place(group(replicas=1), pools(3, busy)).chosen.runnable  # type: ignore[union-attr]
    # Its own pods' GPUs count as free for it (a group already running stays placed).
    own = tuple(GpuPod(f"aws-h100-{i}", 8, MINE) for i in range(2))
    mine = place(group(replicas=1), pools(2, own)).chosen
    assert mine is not None and mine.runnable


def test_another_services_unbound_group_keeps_a_second_group_off_its_nodes() -> None:
    # `other` applied its LeaderWorkerSet a moment ago: 16 GPUs claimed, no pod bound yet.
    claimed = (GpuClaim(OTHER, "gpu-h100", replicas=1, gpus_per_replica=16),)
    choice = place(group(), pools(3, claims=claimed))
    assert choice.chosen is not None and not choice.chosen.runnable
    assert "16 more promised to replicas not bound yet" in choice.why_not_now()
    # Once its pods are bound the claim is theirs, and the third node is still one short.
    bound = tuple(GpuPod(f"aws-h100-{i}", 8, OTHER) for i in range(2))
    assert not place(group(), pools(3, bound, claimed)).chosen.runnable  # type: ignore[union-attr]
    assert place(group(), pools(4, bound, claimed)).chosen.runnable  # type: ignore[union-attr]


def test_each_pod_of_a_group_must_fit_a_nodes_memory() -> None:
    gib = 2**30
    # A whole replica's memory would not fit one node (2000 GiB); each pod's share does.
    fits = place(group(memory_bytes=2400 * gib, pod_memory_bytes={2: 1200 * gib}), pools(2))
    assert fits.chosen is not None and fits.chosen.fits
    too_big = place(group(memory_bytes=4800 * gib, pod_memory_bytes={2: 2400 * gib}), pools(2))
    assert too_big.chosen is None
    assert (
        "each pod of a replica over 2 nodes asks for 2400.0 GiB of host memory; the largest "
        "node has 2000.0 GiB allocatable"
    ) in too_big.why_none()


def lws(replicas: Any = 2, size: int = 2, per_pod: str = "8") -> dict[str, Any]:
    """kvq's LeaderWorkerSet as the watch shows it (the parts a claim reads)."""

    def pod() -> dict[str, Any]:
        return {
            "metadata": {"annotations": {"kvq.dev/pool": "gpu-h100"}},
            "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": per_pod}}}]},
        }

    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {
            "name": "big-group",
            "namespace": "team-a",
            "labels": {"kvq.dev/inferenceservice": "big"},
        },
        "spec": {
            "replicas": replicas,
            "leaderWorkerTemplate": {
                "size": size,
                "leaderTemplate": pod(),
                "workerTemplate": pod(),
            },
        },
    }


def test_a_leader_worker_set_claims_every_pod_of_every_group() -> None:
    assert gpu_claim(lws()) == GpuClaim(MINE, "gpu-h100", replicas=2, gpus_per_replica=16)
    assert gpu_claim(lws(replicas=1, size=4)) == GpuClaim(MINE, "gpu-h100", 1, 32)
    deleting = lws()
    deleting["metadata"]["deletionTimestamp"] = "2026-12-04T12:00:00Z"
    assert gpu_claim(deleting) is None
    assert gpu_claim(lws(per_pod="0")) is None


def test_a_waiting_group_is_placed_once_the_fleet_frees_the_nodes() -> None:
    # The operator's Fleet rebuilds a pool as pods and claims come and go: a room counted on
    # one version of the pool must not answer for the next (it did, through the shared cache
    # of dataclasses.replace, and a waiting group never saw the nodes freed).
    fleet = Fleet(load_gpu_catalog())
    for node in h100_nodes(3):
        fleet.node(node["metadata"]["name"], node)
    fleet.deployment(("team-b", "other-group"), GpuClaim(OTHER, "gpu-h100", 1, 16))
    assert not place(group(), fleet.inventory()).chosen.runnable  # type: ignore[union-attr]
    fleet.deployment(("team-b", "other-group"), None)  # the other service was deleted
    assert place(group(), fleet.inventory()).chosen.runnable  # type: ignore[union-attr]
