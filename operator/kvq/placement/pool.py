"""A node pool: a set of identical GPU nodes and the labels/taints that pin pods to it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from kvq.api import keys
from kvq.catalog.gpus import GpuModel

TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


@dataclass(frozen=True)
class Taint:
    key: str
    value: str | None
    effect: TaintEffect


@dataclass(frozen=True)
class NodePool:
    """Nodes of one GPU product that a replica can be scheduled onto."""

    name: str
    gpu: GpuModel
    gpus_per_node: int
    node_count: int
    allocatable_gpus: int
    node_selector: dict[str, str] = field(default_factory=dict)
    """Labels that pin a pod to this pool (and only this pool)."""
    taints: tuple[Taint, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)
    """Labels every node of the pool carries (matched against spec.placement.nodeSelector)."""


def pool_for_gpu(gpu: GpuModel, gpus_per_node: int = 8) -> NodePool:
    """A pool of one node of `gpu`, selected by the GFD product label (`kvq render --pool`)."""
    return NodePool(
        name=gpu.product.lower(),
        gpu=gpu,
        gpus_per_node=gpus_per_node,
        node_count=1,
        allocatable_gpus=gpus_per_node,
        node_selector={keys.GFD_PRODUCT_LABEL: gfd_product_value(gpu)},
        taints=(Taint(key=keys.GPU_TAINT_KEY, value=None, effect="NoSchedule"),),
    )


def gfd_product_value(gpu: GpuModel) -> str:
    """How GPU Feature Discovery spells the product label (`NVIDIA-H100-80GB-HBM3`)."""
    for alias in gpu.aliases:
        if " " not in alias and alias.startswith(("NVIDIA-", "Tesla-")):
            return alias
    return gpu.product
