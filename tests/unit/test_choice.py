"""Pool choice: each refusal names what is missing; policy picks among the rest."""

from __future__ import annotations

from typing import Any

import pytest
from e2e.devcluster.profiles import load_profile, node_manifests

from kvq.api.scheduling import Toleration
from kvq.catalog.engines import load_engine_catalog
from kvq.catalog.gpus import load_gpu_catalog
from kvq.catalog.models import load_model_catalog
from kvq.placement.choice import PoolRequest, choose_pool
from kvq.placement.discovery import discover_pools

ENGINE = load_engine_catalog().capability("0.26.0")
LLAMA = load_model_catalog().lookup("llama-3-8b")
assert LLAMA is not None


def inventory(profile: str = "hetero", extra_taint: dict[str, str] | None = None) -> Any:
    nodes = node_manifests(load_profile(profile))
    for node in nodes:
        node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
        if extra_taint:
            node["spec"]["taints"].append(extra_taint)
    return discover_pools(nodes, load_gpu_catalog())


def request(**overrides: Any) -> PoolRequest:
    fields: dict[str, Any] = {
        "kv_cache_dtype": "fp8",
        "weight_format": "bf16",
        "gpus_per_replica": 1,
        "gpu_memory_utilization": 0.9,
        "max_model_len": 8192,
        "max_num_seqs": None,
        "block_size": None,
        "min_concurrency": None,
    }
    fields.update(overrides)
    return PoolRequest(**fields)


def reasons(choice: Any, pool: str) -> str:
    return "; ".join(next(v for v in choice.verdicts if v.pool.name == pool).reasons)


def test_fp8_refused_on_turing_and_ampere_with_the_engines_reason() -> None:
    choice = choose_pool(request(), inventory(), ENGINE, LLAMA.architecture)
    assert "Turing" in reasons(choice, "t4-pool")
    assert "compute capability 8.0" in reasons(choice, "a100-80gb-pool")
    assert choice.chosen is not None
    assert choice.chosen.pool.gpu.fp8_native


def test_capacity_requirement_turns_small_pools_down_with_numbers() -> None:
    choice = choose_pool(request(min_concurrency=64), inventory(), ENGINE, LLAMA.architecture)
    assert "spec.capacity needs 64" in reasons(choice, "l4-pool")
    assert choice.chosen is not None
    assert choice.chosen.plan is not None and choice.chosen.plan.max_concurrency >= 64


def test_allow_list_and_node_selector_and_gpus_per_replica() -> None:
    inv = inventory()
    only_t4 = choose_pool(request(allowed_pools=("t4-pool",)), inv, ENGINE, LLAMA.architecture)
    assert "not in spec.placement.pools" in reasons(only_t4, "l4-pool")
    zone = choose_pool(
        request(node_selector={"topology.kubernetes.io/zone": "mars-1a"}),
        inv,
        ENGINE,
        LLAMA.architecture,
    )
    assert zone.chosen is None
    assert "nodes lack labels topology.kubernetes.io/zone=mars-1a" in zone.why_none()
    eight = choose_pool(request(gpus_per_replica=8), inv, ENGINE, LLAMA.architecture)
    assert "a replica needs 8" in reasons(eight, "l4-pool")
    assert eight.chosen is not None and eight.chosen.pool.gpus_per_node >= 8


@pytest.mark.parametrize(
    ("tolerations", "placeable"),
    [
        ((), False),
        ((Toleration(key="team", operator="Equal", value="ml", effect="NoSchedule"),), True),
        ((Toleration(operator="Exists"),), True),
    ],
)
def test_foreign_taints_need_a_toleration(
    tolerations: tuple[Toleration, ...], placeable: bool
) -> None:
    inv = inventory("single", {"key": "team", "value": "ml", "effect": "NoSchedule"})
    choice = choose_pool(request(tolerations=tolerations), inv, ENGINE, LLAMA.architecture)
    assert (choice.chosen is not None) is placeable
    if not placeable:
        assert "taints not tolerated: team=ml:NoSchedule" in choice.why_none()


def test_no_gpu_nodes_says_so() -> None:
    empty = discover_pools([], load_gpu_catalog())
    choice = choose_pool(request(), empty, ENGINE, LLAMA.architecture)
    assert choice.why_none() == "no GPU node pool was found"


def test_gpus_promised_to_other_services_are_not_room_but_ones_own_are() -> None:
    from kvq.placement.claims import GpuClaim

    nodes = node_manifests(load_profile("hetero"))
    for node in nodes:
        node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    other, me = ("team-a", "other"), ("team-a", "me")
    promised = [GpuClaim(other, "gpu-h100", replicas=3, gpus_per_replica=2)]
    found = discover_pools(nodes, load_gpu_catalog(), claims=promised)
    wanted = request(gpus_per_replica=2, replicas=2, allowed_pools=("gpu-h100",), owner=me)

    mine = choose_pool(wanted, found, ENGINE, LLAMA.architecture).chosen
    assert mine is not None and mine.slots == 1  # 8 GPUs, 6 promised: one replica of two
    assert "room for 1 of 2 replicas now (2 free GPUs" in mine.not_now
    assert "6 more promised to replicas not bound yet" in mine.not_now
    asked = request(gpus_per_replica=2, replicas=3, owner=other)
    theirs = choose_pool(asked, found, ENGINE, LLAMA.architecture)
    h100 = next(v for v in theirs.verdicts if v.pool.name == "gpu-h100")
    assert h100.slots == 4 and h100.runnable  # its own promise is room for itself


def test_a_pool_whose_nodes_cannot_hold_the_pods_memory_is_refused_with_the_cpu_tier_named() -> (
    None
):
    gib = 2**30
    # 29 GiB of engine (weights, shm, processes) + a 16 GiB CPU tier: the L4 nodes have 32.
    choice = choose_pool(
        request(memory_bytes=45 * gib, host_tier_bytes=16 * gib),
        inventory(),
        ENGINE,
        LLAMA.architecture,
    )
    assert reasons(choice, "l4-pool") == (
        "a replica asks for 45.0 GiB of host memory, 16.0 GiB of it the KV cache's CPU tier "
        "(memory.swapSpaceGiB x gpusPerReplica); the largest node has 32.0 GiB allocatable"
    )
    assert choice.chosen is not None and choice.chosen.pool.name != "l4-pool"
    small = choose_pool(request(memory_bytes=29 * gib), inventory(), ENGINE, LLAMA.architecture)
    assert small.chosen is not None and small.chosen.pool.name == "l4-pool"


def test_nodes_that_report_no_memory_are_not_judged_on_it() -> None:
    nodes = node_manifests(load_profile("hetero"))
    for node in nodes:
        node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
        node["status"]["allocatable"].pop("memory", None)
    inv = discover_pools(nodes, load_gpu_catalog())
    choice = choose_pool(request(memory_bytes=10**15), inv, ENGINE, LLAMA.architecture)
    assert choice.chosen is not None
