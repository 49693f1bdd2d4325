"""A node pool: identical GPU nodes, the labels that pin pods to them, and their free GPUs."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

from kvq.api import keys
from kvq.catalog.gpus import GpuModel
from kvq.planner.layout import Layout, LayoutError
from kvq.planner.layout import nodes_per_replica as layout_nodes

TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]
OwnerKey = tuple[str, str]
"""(namespace, InferenceService name) of an engine pod."""


@dataclass(frozen=True)
class Taint:
    key: str
    value: str | None
    effect: TaintEffect


@dataclass(frozen=True)
class GpuNode:
    """One node of a pool, as placement needs it."""

    name: str
    allocatable: int
    """Allocatable GPUs."""
    ready: bool
    """Ready and not cordoned."""
    taints: frozenset[Taint] = frozenset()
    used: Mapping[OwnerKey | None, int] = field(default_factory=dict)
    """GPUs requested by pods bound to the node, by owning InferenceService (None: others)."""
    memory: int = 0
    """Allocatable memory in bytes (status.allocatable.memory; 0: not reported)."""
    domains: Mapping[str, str] = field(default_factory=dict)
    """The node's topology labels (placement.topology.TOPOLOGY_KEYS) it carries."""

    @cached_property
    def taken(self) -> int:
        """GPUs requested by every pod bound to the node."""
        return sum(self.used.values())

    def free_for(self, owner: OwnerKey | None) -> int:
        """GPUs a replica of `owner` could use: free ones plus those `owner` holds already."""
        own = self.used.get(owner, 0) if owner is not None else 0
        return max(self.allocatable - self.taken + own, 0)


@dataclass(frozen=True)
class NodePool:
    """Nodes of one GPU product that a replica can be scheduled onto."""

    name: str
    gpu: GpuModel
    gpus_per_node: int
    nodes: tuple[GpuNode, ...]
    node_selector: dict[str, str] = field(default_factory=dict)
    """Labels that pin a pod to this pool (and only this pool)."""
    taints: tuple[Taint, ...] = ()
    """Taints every node carries (besides transient ones): tolerate them or stay away."""
    labels: dict[str, str] = field(default_factory=dict)
    """Labels every node of the pool carries (matched against spec.placement.nodeSelector)."""
    group: str = ""
    """The pool label's value; differs from `name` when the pool mixes GPU products."""
    claimed: Mapping[OwnerKey, int] = field(default_factory=dict)
    """GPUs kvq's Deployments claim of the pool beyond their bound pods, by InferenceService
    (placement.claims): taken once the scheduler binds their replicas, on nodes it chooses."""
    rooms: dict[Hashable, tuple[int, str]] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )
    """Room already counted for a request shape (owner, replica size, nodes, replicas,
    tolerations): every rung of a decision asks the same of each pool. The pool and its
    nodes never change, so neither does the answer. Not an init field, so a pool made from
    another with other usage (dataclasses.replace) counts afresh instead of sharing it."""

    @property
    def node_count(self) -> int:
        return len(self.nodes)

    @property
    def allocatable_gpus(self) -> int:
        return sum(n.allocatable for n in self.nodes if n.ready)

    @property
    def largest_memory(self) -> int:
        """The most allocatable memory of one node (0: no node reports it)."""
        return max((n.memory for n in self.nodes), default=0)

    def claimed_by_others(self, owner: OwnerKey | None) -> int:
        """GPUs claimed by every InferenceService but `owner` (whose own count as free
        for it, as its bound pods' do)."""
        return sum(gpus for who, gpus in self.claimed.items() if who != owner)

    def in_group(self, names: tuple[str, ...] | list[str]) -> bool:
        return self.name in names or (bool(self.group) and self.group in names)


def nodes_per_replica(tensor: int, pipeline: int, gpus_per_node: int) -> int | None:
    """Nodes one replica of tensor x pipeline GPUs spans on nodes of `gpus_per_node` GPUs:
    1 when it fits on one node; None when kvq does not split it over nodes (the planner's
    rule, planner.layout.nodes_per_replica, whose error says why)."""
    try:
        return layout_nodes(Layout(tensor=tensor, pipeline=pipeline), gpus_per_node)
    except LayoutError:
        return None


def pool_for_gpu(gpu: GpuModel, gpus_per_node: int = 8) -> NodePool:
    """A pool of one node of `gpu`, selected by the GFD product label (`kvq render --pool`)."""
    return NodePool(
        name=gpu.product.lower(),
        gpu=gpu,
        gpus_per_node=gpus_per_node,
        nodes=(GpuNode(name=f"{gpu.product.lower()}-0", allocatable=gpus_per_node, ready=True),),
        node_selector={keys.GFD_PRODUCT_LABEL: gfd_product_value(gpu)},
        taints=(Taint(key=keys.GPU_TAINT_KEY, value=None, effect="NoSchedule"),),
    )


def gfd_product_value(gpu: GpuModel) -> str:
    """How GPU Feature Discovery spells the product label (`NVIDIA-H100-80GB-HBM3`)."""
    for alias in gpu.aliases:
        if " " not in alias and alias.startswith(("NVIDIA-", "Tesla-")):
            return alias
    return gpu.product
