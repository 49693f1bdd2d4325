"""Pools found from Node objects as the cluster profiles (and real providers) label them."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from e2e.devcluster.profiles import load_profile, node_manifests
from hypothesis import given, settings
from hypothesis import strategies as st

from kvq.api import keys
from kvq.catalog.gpus import load_gpu_catalog
from kvq.placement.claims import GpuClaim, gpu_claim
from kvq.placement.discovery import GpuPod, Inventory, discover_pools
from kvq.placement.pool import OwnerKey

CATALOG = load_gpu_catalog()


def ready_nodes(profile: str) -> list[dict[str, Any]]:
    nodes = node_manifests(load_profile(profile))
    for node in nodes:
        node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    return nodes


def test_hetero_profile_yields_one_pool_per_gpu_generation() -> None:
    inventory = discover_pools(ready_nodes("hetero"), CATALOG)
    by_name = {p.name: p for p in inventory.pools}
    products = {name: pool.gpu.product for name, pool in by_name.items()}
    assert len(products) == 6, products
    assert inventory.unknown == ()
    ccs = sorted(p.gpu.compute_capability for p in inventory.pools)
    assert ccs == [(7, 5), (8, 0), (8, 9), (9, 0), (9, 0), (10, 0)]


def test_pool_selector_uses_the_pool_label_and_keeps_the_gpu_taint() -> None:
    inventory = discover_pools(ready_nodes("hetero"), CATALOG)
    l4 = next(p for p in inventory.pools if p.gpu.product.startswith("L4"))
    assert l4.node_selector == {"cloud.google.com/gke-nodepool": l4.name}
    assert [t.key for t in l4.taints] == ["nvidia.com/gpu"]
    assert l4.node_count == 2
    assert l4.allocatable_gpus == 2 * l4.gpus_per_node


def test_karpenter_pool_reads_gpu_count_and_memory() -> None:
    inventory = discover_pools(ready_nodes("hetero"), CATALOG)
    h100 = next(
        p for p in inventory.pools if p.node_selector.get("karpenter.sh/nodepool") == "gpu-h100"
    )
    assert h100.gpu.compute_capability == (9, 0)
    assert h100.gpus_per_node == 8


def test_not_ready_and_cordoned_nodes_give_no_allocatable_gpus() -> None:
    nodes = ready_nodes("single")
    total = discover_pools(nodes, CATALOG).pools[0].allocatable_gpus
    nodes[0]["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    assert discover_pools(nodes, CATALOG).pools[0].allocatable_gpus < total


def test_nodes_without_gpus_are_ignored_and_unknown_gpus_reported() -> None:
    cpu_node = {"metadata": {"name": "cpu-0", "labels": {}}, "status": {"capacity": {"cpu": "8"}}}
    mystery = copy.deepcopy(ready_nodes("single")[0])
    mystery["metadata"]["labels"] = {
        "nvidia.com/gpu.product": "NVIDIA-Imaginary-9000",
        "karpenter.sh/nodepool": "lab",
    }
    inventory = discover_pools([cpu_node, mystery], CATALOG)
    assert inventory.pools == ()
    [unknown] = inventory.unknown
    assert (unknown.name, unknown.product_label) == ("lab", "NVIDIA-Imaginary-9000")


@pytest.mark.parametrize(
    ("labels", "product_prefix"),
    [
        ({"cloud.google.com/gke-accelerator": "nvidia-tesla-t4"}, "T4"),
        ({"karpenter.k8s.aws/instance-gpu-name": "a10g"}, "A10G"),
        ({"nvidia.com/gpu.product": "NVIDIA-H200", "nvidia.com/gpu.memory": "143771"}, "H200"),
    ],
)
def test_gpu_product_from_each_provider_label(labels: dict[str, str], product_prefix: str) -> None:
    node = {
        "metadata": {"name": "n", "labels": labels},
        "status": {
            "capacity": {"nvidia.com/gpu": "1"},
            "allocatable": {"nvidia.com/gpu": "1"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    [pool] = discover_pools([node], CATALOG).pools
    assert pool.gpu.product.startswith(product_prefix)


def test_a_configured_pool_label_wins() -> None:
    nodes = ready_nodes("hetero")
    for node in nodes:
        labels = node["metadata"]["labels"]
        labels["team.example.com/gpu-pool"] = "team-" + labels["nvidia.com/gpu.product"].lower()
    inventory = discover_pools(nodes, CATALOG, pool_labels=("team.example.com/gpu-pool",))
    assert len(inventory.pools) == 6
    h200 = next(p for p in inventory.pools if p.name == "team-nvidia-h200")
    assert h200.node_selector == {"team.example.com/gpu-pool": "team-nvidia-h200"}
    assert h200.gpu.product == "H200"


def test_nodes_read_once_per_version_still_count_each_decisions_pods() -> None:
    from kvq.placement.discovery import GpuPod

    nodes = ready_nodes("hetero")
    for version, node in enumerate(nodes, start=1):
        node["metadata"]["resourceVersion"] = str(version)
    catalog = load_gpu_catalog()
    h100 = next(n for n in nodes if "h100" in n["metadata"]["name"])
    name = h100["metadata"]["name"]
    busy = discover_pools(nodes, catalog, gpu_pods=[GpuPod(name, 3, ("a", "x"))])
    idle = discover_pools(nodes, catalog)

    def free(inventory: Any) -> int:
        node = next(n for p in inventory.pools for n in p.nodes if n.name == name)
        return int(node.free_for(None))

    assert (free(busy), free(idle)) == (5, 8)  # the pods of one decision never stay behind
    # A new version of a node is read again: cordoned, it is no longer ready.
    cordoned = copy.deepcopy(h100)
    cordoned["spec"]["unschedulable"] = True
    cordoned["metadata"]["resourceVersion"] = "999"
    later = discover_pools([cordoned if n is h100 else n for n in nodes], catalog)
    node = next(n for p in later.pools for n in p.nodes if n.name == name)
    assert not node.ready


def _free(inventory: Inventory, pool: str) -> int:
    """What another service sees free on `pool`: bound pods and claims taken."""
    found = next(p for p in inventory.pools if p.name == pool)
    free = sum(node.free_for(None) for node in found.nodes)
    return max(free - found.claimed_by_others(None), 0)


def test_replicas_not_bound_yet_take_their_gpus_once() -> None:
    nodes = ready_nodes("hetero")
    pool = "gpu-h100"  # one node of 8 GPUs
    owner = ("team-a", "llama")
    claims = [GpuClaim(owner, pool, replicas=3, gpus_per_replica=2)]
    assert _free(discover_pools(nodes, CATALOG, claims=claims), pool) == 8 - 6
    # Two of the three bound: they are counted as pods, not a second time as a claim.
    h100 = next(p for p in discover_pools(nodes, CATALOG).pools if p.name == pool)
    bound = [GpuPod(h100.nodes[0].name, 2, owner), GpuPod(h100.nodes[0].name, 2, owner)]
    both = discover_pools(nodes, CATALOG, gpu_pods=bound, claims=claims)
    assert _free(both, pool) == 8 - 6
    assert next(p for p in both.pools if p.name == pool).claimed == {owner: 2}
    # A claim larger than the pool fills it; the owner's own claim is room for itself.
    huge = discover_pools(nodes, CATALOG, claims=[GpuClaim(owner, pool, 5, 3)])
    assert _free(huge, pool) == 0
    assert next(p for p in huge.pools if p.name == pool).claimed_by_others(owner) == 0


def test_a_deployment_of_kvq_claims_its_replicas_gpus_on_its_pool() -> None:
    deployment: dict[str, Any] = {
        "metadata": {
            "name": "llama",
            "namespace": "team-a",
            "labels": {keys.LABEL_INFERENCESERVICE: "llama"},
        },
        "spec": {
            "replicas": 2,
            "template": {
                "metadata": {"annotations": {keys.ANNOTATION_POOL: "l4-pool"}},
                "spec": {
                    "containers": [{"resources": {"limits": {keys.GPU_RESOURCE: "2"}}}],
                },
            },
        },
    }
    assert gpu_claim(deployment) == GpuClaim(("team-a", "llama"), "l4-pool", 2, 2)
    deleting = copy.deepcopy(deployment)
    deleting["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    assert gpu_claim(deleting) is None


_OWNERS = [("team", f"svc-{i}") for i in range(6)]


@settings(max_examples=300, deadline=None)
@given(
    shape=st.lists(st.tuples(st.integers(0, 8), st.booleans()), min_size=1, max_size=8),
    bound=st.lists(st.tuples(st.integers(0, 7), st.sampled_from(_OWNERS), st.integers(1, 4))),
    claimed=st.lists(
        st.tuples(st.sampled_from(_OWNERS), st.integers(1, 3), st.sampled_from([1, 2, 4, 8])),
        max_size=10,
    ),
)
def test_a_pool_counts_what_each_service_asks_beyond_its_bound_pods(
    shape: list[tuple[int, bool]],
    bound: list[tuple[int, OwnerKey, int]],
    claimed: list[tuple[OwnerKey, int, int]],
) -> None:
    pool = "gpu-h100"
    template = next(n for n in ready_nodes("hetero") if pool in n["metadata"]["labels"].values())
    nodes = []
    for index, (gpus, ready) in enumerate(shape):
        node = copy.deepcopy(template)
        node["metadata"]["name"] = f"h100-{index}"
        node["status"]["capacity"][keys.GPU_RESOURCE] = node["status"]["allocatable"][
            keys.GPU_RESOURCE
        ] = str(gpus)
        node["status"]["conditions"] = [{"type": "Ready", "status": str(ready)}]
        nodes.append(node)
    names = sorted(n["metadata"]["name"] for n in nodes)
    pods = [GpuPod(names[i % len(names)], gpus, owner) for i, owner, gpus in bound]
    claims = [GpuClaim(owner, pool, replicas, step) for owner, replicas, step in claimed]

    found = discover_pools(nodes, CATALOG, gpu_pods=pods, claims=claims)

    (h100,) = [p for p in found.pools if p.name == pool]
    asked = {o: sum(r * s for who, r, s in claimed if who == o) for o, _, _ in claimed}
    held = {o: sum(p.gpus for p in pods if p.owner == o) for o in asked}
    assert h100.claimed == {o: asked[o] - held[o] for o in asked if asked[o] > held[o]}
    # Bound pods stay on their nodes; what is claimed is the pool's, not a node's.
    assert {n.name: dict(n.used) for n in h100.nodes if n.used} == {
        name: {o: sum(p.gpus for p in pods if p.node == name and p.owner == o)
               for o in {p.owner for p in pods if p.node == name}}
        for name in {p.node for p in pods}
    }  # fmt: skip
