"""Node pools from Node objects: group GPU nodes by their pool label, normalise the GPU.

Pure: takes the Node dicts the API server returns (the operator keeps them in a kopf
index) and the GPU catalog; never lists anything itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvq.api import keys
from kvq.catalog.gpus import GpuCatalog, GpuModel
from kvq.placement.pool import NodePool, Taint, TaintEffect

# Pool label keys in the order they are tried: the node's autoscaler or cloud pool.
DEFAULT_POOL_LABELS: tuple[str, ...] = (
    "kvq.dev/pool",
    "karpenter.sh/nodepool",
    "cloud.google.com/gke-nodepool",
    "eks.amazonaws.com/nodegroup",
    "kubernetes.azure.com/agentpool",
)

# Where each provider writes the GPU product (and, if it does, the per-GPU memory in MiB).
_GPU_NAME_LABELS: tuple[tuple[str, str | None], ...] = (
    (keys.GFD_PRODUCT_LABEL, "nvidia.com/gpu.memory"),
    ("cloud.google.com/gke-accelerator", None),
    ("karpenter.k8s.aws/instance-gpu-name", "karpenter.k8s.aws/instance-gpu-memory"),
    ("karpenter.azure.com/sku-gpu-name", None),
)
_GPU_COUNT_LABELS = (
    "nvidia.com/gpu.count",
    "karpenter.k8s.aws/instance-gpu-count",
    "karpenter.azure.com/sku-gpu-count",
)


@dataclass(frozen=True)
class UnknownGpuPool:
    """GPU nodes whose product kvq's catalog does not know: never chosen, always reported."""

    name: str
    product_label: str
    node_count: int


@dataclass(frozen=True)
class Inventory:
    """Every pool found, and the GPU nodes kvq could not use."""

    pools: tuple[NodePool, ...]
    unknown: tuple[UnknownGpuPool, ...] = ()


@dataclass(frozen=True)
class _GpuNode:
    pool: str
    pool_label: tuple[str, str] | None
    product_label: str
    memory_mib: int | None
    gpus: int
    allocatable: int
    ready: bool
    labels: Mapping[str, str]
    taints: frozenset[Taint]


def discover_pools(
    nodes: Iterable[Mapping[str, Any]],
    catalog: GpuCatalog,
    pool_labels: Sequence[str] = DEFAULT_POOL_LABELS,
) -> Inventory:
    """Group GPU nodes into pools; nodes without GPUs are ignored."""
    grouped: dict[str, list[_GpuNode]] = {}
    for node in nodes:
        gpu_node = _read_node(node, pool_labels)
        if gpu_node is not None:
            grouped.setdefault(gpu_node.pool, []).append(gpu_node)
    pools: list[NodePool] = []
    unknown: list[UnknownGpuPool] = []
    for name, members in sorted(grouped.items()):
        first = members[0]
        gpu = catalog.lookup(first.product_label, first.memory_mib)
        if gpu is None:
            unknown.append(UnknownGpuPool(name, first.product_label, len(members)))
            continue
        pools.append(_pool(name, gpu, members))
    return Inventory(tuple(pools), tuple(unknown))


def _pool(name: str, gpu: GpuModel, members: list[_GpuNode]) -> NodePool:
    ready = [m for m in members if m.ready]
    first = members[0]
    if first.pool_label is not None:
        selector = {first.pool_label[0]: first.pool_label[1]}
    else:
        selector = {keys.GFD_PRODUCT_LABEL: first.product_label}
    common_labels = dict(first.labels)
    for member in members[1:]:
        common_labels = {k: v for k, v in common_labels.items() if member.labels.get(k) == v}
    taints = frozenset.intersection(*(m.taints for m in members))
    return NodePool(
        name=name,
        gpu=gpu,
        gpus_per_node=max(m.gpus for m in members),
        node_count=len(ready),
        allocatable_gpus=sum(m.allocatable for m in ready),
        node_selector=selector,
        taints=tuple(sorted(taints, key=lambda t: (t.key, t.value or "", t.effect))),
        labels=common_labels,
    )


def _read_node(node: Mapping[str, Any], pool_labels: Sequence[str]) -> _GpuNode | None:
    meta = node.get("metadata") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    status = node.get("status") or {}
    spec = node.get("spec") or {}
    product, memory = _gpu_product(labels)
    allocatable = _quantity((status.get("allocatable") or {}).get(keys.GPU_RESOURCE))
    capacity = _quantity((status.get("capacity") or {}).get(keys.GPU_RESOURCE))
    counted = max((_quantity(labels.get(k)) for k in _GPU_COUNT_LABELS), default=0)
    gpus = capacity or allocatable or counted
    if product is None or gpus == 0:
        return None
    pool_label = next(((k, labels[k]) for k in pool_labels if labels.get(k)), None)
    pool = pool_label[1] if pool_label else product.lower()
    return _GpuNode(
        pool=pool,
        pool_label=pool_label,
        product_label=product,
        memory_mib=memory,
        gpus=gpus,
        allocatable=allocatable if not spec.get("unschedulable") else 0,
        ready=_is_ready(status) and not spec.get("unschedulable", False),
        labels=labels,
        taints=frozenset(_taints(spec.get("taints") or [])),
    )


def _gpu_product(labels: Mapping[str, str]) -> tuple[str | None, int | None]:
    for name_key, memory_key in _GPU_NAME_LABELS:
        if labels.get(name_key):
            memory = _quantity(labels.get(memory_key)) if memory_key else 0
            return labels[name_key], memory or None
    return None, None


def _is_ready(status: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


_EFFECTS: tuple[TaintEffect, ...] = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def _taints(raw: Iterable[Mapping[str, Any]]) -> Iterable[Taint]:
    for taint in raw:
        effect = taint.get("effect")
        if effect in _EFFECTS and taint.get("key"):
            yield Taint(key=taint["key"], value=taint.get("value"), effect=effect)


def _quantity(value: Any) -> int:
    """Whole-number quantities (GPU counts, MiB labels); anything else counts as 0."""
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0
