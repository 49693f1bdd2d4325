"""Cluster profiles are valid data with the labels placement code reads (no cluster needed)."""

from __future__ import annotations

import ipaddress

import pytest
from e2e.devcluster.profiles import load_profile, node_manifests, scale_profile

GFD_KEYS = [
    "nvidia.com/gpu.product",
    "nvidia.com/gpu.memory",
    "nvidia.com/gpu.family",
    "nvidia.com/gpu.compute.major",
    "nvidia.com/gpu.compute.minor",
    "nvidia.com/gpu.count",
]


@pytest.mark.parametrize(
    ("profile", "products"),
    [
        (
            "hetero",
            {
                "Tesla-T4",
                "NVIDIA-A100-SXM4-80GB",
                "NVIDIA-L4",
                "NVIDIA-H100-80GB-HBM3",
                "NVIDIA-H200",
                "NVIDIA-B200",
            },
        ),
        ("legacy", {"Tesla-T4", "Tesla-V100-SXM2-16GB"}),
        ("single", {"NVIDIA-H100-80GB-HBM3"}),
        ("fleet", {"NVIDIA-H100-80GB-HBM3", "NVIDIA-H200", "NVIDIA-L4", "NVIDIA-A100-SXM4-80GB"}),
    ],
)
def test_profile_has_the_gpu_products(profile: str, products: set[str]) -> None:
    nodes = node_manifests(load_profile(profile))

    assert {n["metadata"]["labels"]["nvidia.com/gpu.product"] for n in nodes} == products


@pytest.mark.parametrize("profile", ["hetero", "legacy", "single", "fleet"])
def test_every_gpu_node_is_kwok_managed_tainted_and_labelled(profile: str) -> None:
    for node in node_manifests(load_profile(profile)):
        labels = node["metadata"]["labels"]
        assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
        assert all(labels[k] for k in GFD_KEYS)
        assert labels["nvidia.com/gpu.count"] == node["status"]["allocatable"]["nvidia.com/gpu"]
        assert {"key": "nvidia.com/gpu", "effect": "NoSchedule"}.items() <= node["spec"]["taints"][
            0
        ].items()
        pool_keys = {"cloud.google.com/gke-nodepool", "karpenter.sh/nodepool"}
        assert pool_keys & labels.keys()


def test_unknown_profile_names_the_known_ones() -> None:
    with pytest.raises(FileNotFoundError, match="hetero"):
        load_profile("no-such-profile")


@pytest.mark.parametrize(("profile", "loopback"), [("hetero", True), ("fleet", False)])
def test_pods_get_loopback_ips_unless_the_profile_gives_slice_ready_ones(
    profile: str, loopback: bool
) -> None:
    # The API server refuses loopback EndpointSlice addresses (and tests bind real servers
    # to loopback pod IPs); a fleet's Services get their slices written as on a real cluster.
    network = ipaddress.ip_network(load_profile(profile).pod_cidr)
    assert network.is_loopback is loopback
    assert network.num_addresses >= 65536


def test_fleet_is_500_eight_gpu_nodes() -> None:
    nodes = node_manifests(load_profile("fleet"))

    assert len(nodes) == 500
    assert {n["status"]["allocatable"]["nvidia.com/gpu"] for n in nodes} == {"8"}
    assert len({n["metadata"]["name"] for n in nodes}) == 500


@pytest.mark.parametrize(
    ("total", "counts"),
    [(4, [1, 1, 1, 1]), (10, [3, 2, 3, 2]), (100, [30, 20, 30, 20]), (1000, [300, 200, 300, 200])],
)
def test_scaling_keeps_the_pools_in_proportion(total: int, counts: list[int]) -> None:
    scaled = scale_profile(load_profile("fleet"), total)

    assert [p.nodes for p in scaled.pools] == counts
    assert [p.labels for p in scaled.pools] == [p.labels for p in load_profile("fleet").pools]


def test_scaling_below_one_node_per_pool_is_refused() -> None:
    with pytest.raises(ValueError, match="4 pools: it needs at least 4 nodes, not 3"):
        scale_profile(load_profile("fleet"), 3)
