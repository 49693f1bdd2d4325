"""Node pools from Node objects: group GPU nodes by their pool label, normalise the GPU.

Pure: takes the Node dicts the API server returns (the operator keeps them in a kopf
index) and the GPU catalog; never lists anything itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kvq.api import keys
from kvq.api.quantity import quantity_value
from kvq.catalog.gpus import GpuCatalog, GpuModel
from kvq.placement.claims import GpuClaim, claimed_by_pool
from kvq.placement.gpu_requests import gpus_of, whole_number
from kvq.placement.pool import GpuNode, NodePool, OwnerKey, Taint, TaintEffect
from kvq.placement.topology import TOPOLOGY_KEYS

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
# Taints that come and go with a node's life (readiness, pressure, autoscaler disruption,
# shutdown): a node carrying one cannot take a pod now, but the pool is not changed by it.
TRANSIENT_TAINT_KEYS = frozenset(
    {
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/unreachable",
        "node.kubernetes.io/unschedulable",
        "node.kubernetes.io/memory-pressure",
        "node.kubernetes.io/disk-pressure",
        "node.kubernetes.io/pid-pressure",
        "node.kubernetes.io/network-unavailable",
        "node.kubernetes.io/out-of-service",
        "node.cloudprovider.kubernetes.io/uninitialized",
        "node.cloudprovider.kubernetes.io/shutdown",
        "karpenter.sh/disrupted",
        "karpenter.sh/disruption",
        "karpenter.sh/unregistered",
        "ToBeDeletedByClusterAutoscaler",
        "DeletionCandidateOfClusterAutoscaler",
    }
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
class GpuPod:
    """A pod bound to a node and requesting GPUs (what makes a pool full)."""

    node: str
    gpus: int
    owner: OwnerKey | None
    """The InferenceService whose engine it is; None for anybody else's pod."""


@dataclass(frozen=True)
class _NodeFacts:
    pool: str
    pool_label: tuple[str, str] | None
    product_key: str
    product_label: str
    memory_mib: int | None
    gpus: int
    node: GpuNode
    labels: Mapping[str, str]


def discover_pools(
    nodes: Iterable[Mapping[str, Any]],
    catalog: GpuCatalog,
    pool_labels: Sequence[str] = DEFAULT_POOL_LABELS,
    gpu_pods: Iterable[GpuPod] = (),
    claims: Iterable[GpuClaim] = (),
) -> Inventory:
    """Group GPU nodes into pools (by pool label, then GPU product); others are ignored.
    A node's GPUs are taken by the pods bound to it; a pool's, also by the replicas of kvq's
    Deployments not bound yet (their `claims`), counted against the pool as a whole."""
    usage: dict[str, dict[OwnerKey | None, int]] = {}
    for pod in gpu_pods:
        per_node = usage.setdefault(pod.node, {})
        per_node[pod.owner] = per_node.get(pod.owner, 0) + pod.gpus
    facts = [facts_of(node, tuple(pool_labels)) for node in nodes]
    inventory = grouped(facts, catalog)
    return _with_usage(inventory, usage, _unbound_claims(inventory, usage, claims))


def _unbound_claims(
    inventory: Inventory,
    usage: Mapping[str, Mapping[OwnerKey | None, int]],
    claims: Iterable[GpuClaim],
) -> dict[str, dict[OwnerKey, int]]:
    """Per pool, the GPUs each owner's Deployments ask for beyond what its bound pods hold.

    Which node a replica not bound yet will land on is the scheduler's choice (it spreads
    them, by its scores); what is known is that the pool will have that many GPUs fewer. So
    they are counted per pool: a decision in a fleet's rollout costs one pass over the
    claims, not a placement of each."""
    pools = {pool.name for pool in inventory.pools}
    wanted = {key: gpus for key, gpus in claimed_by_pool(claims).items() if key[1] in pools}
    if not wanted:
        return {}
    pool_of = _pool_of(inventory)
    bound: dict[tuple[OwnerKey | None, str], int] = {}
    for node_name, owners in usage.items():
        pool = pool_of.get(node_name)
        if pool is not None:
            for who, held in owners.items():
                bound[who, pool] = bound.get((who, pool), 0) + held
    unbound: dict[str, dict[OwnerKey, int]] = {}
    for (owner, pool), gpus in wanted.items():
        outstanding = gpus - bound.get((owner, pool), 0)
        if outstanding > 0:
            unbound.setdefault(pool, {})[owner] = outstanding
    return unbound


_pools_of: dict[int, tuple[Inventory, dict[str, str]]] = {}


def _pool_of(inventory: Inventory) -> dict[str, str]:
    """Node name -> pool name, once per grouping (the entry keeps its inventory alive, so
    the id is not reused while it is kept)."""
    found = _pools_of.get(id(inventory))
    if found is None or found[0] is not inventory:
        if len(_pools_of) > 8:
            _pools_of.clear()
        found = _pools_of[id(inventory)] = (
            inventory,
            {node.name: pool.name for pool in inventory.pools for node in pool.nodes},
        )
    return found[1]


# A fleet's decisions read the same few hundred nodes again and again: a node is read once
# per resourceVersion, and the pools are grouped once per set of node readings (the last
# one kept). The GPUs pods hold, which change with every rollout, are added per decision.
_FACTS_LIMIT = 4096
_facts_memo: dict[tuple[str, str, tuple[str, ...]], _NodeFacts | None] = {}
_grouped_memo: dict[str, tuple[tuple[int, ...], list[_NodeFacts | None], Inventory]] = {}


def read_facts(node: Mapping[str, Any], pool_labels: tuple[str, ...]) -> _NodeFacts | None:
    """What placement reads of a node (None: not a GPU node)."""
    return _read_node(node, pool_labels, {})


def facts_of(node: Mapping[str, Any], pool_labels: tuple[str, ...]) -> _NodeFacts | None:
    """`read_facts`, once per resourceVersion (a fleet's decisions read the same nodes)."""
    meta = node.get("metadata") or {}
    version = meta.get("resourceVersion")
    if not version:
        return read_facts(node, pool_labels)
    key = (str(meta.get("name", "")), str(version), pool_labels)
    if key not in _facts_memo:
        if len(_facts_memo) >= _FACTS_LIMIT:
            _facts_memo.clear()
        _facts_memo[key] = read_facts(node, pool_labels)
    return _facts_memo[key]


def grouped(facts: list[_NodeFacts | None], catalog: GpuCatalog) -> Inventory:
    """The pools these nodes make (by pool label, then GPU product), without usage."""
    # The entry holds its readings, so their ids cannot be reused while it is kept.
    key = (id(catalog), *map(id, facts))
    last = _grouped_memo.get("last")  # one read: reconciles run on several threads
    if last is not None and last[0] == key:
        return last[2]
    grouped: dict[str, list[_NodeFacts]] = {}
    for found in facts:
        if found is not None:
            grouped.setdefault(found.pool, []).append(found)
    pools: list[NodePool] = []
    unknown: list[UnknownGpuPool] = []
    for name, members in sorted(grouped.items()):
        by_product: dict[str, list[_NodeFacts]] = {}
        for member in members:
            by_product.setdefault(member.product_label, []).append(member)
        mixed = len(by_product) > 1
        for product, same in sorted(by_product.items()):
            first = same[0]
            gpu = catalog.lookup(product, first.memory_mib)
            # A pool with several GPU products is several pools: a pod pinned to the pool
            # label alone would land on either product, depending on the scheduler.
            pool_name = f"{name}-{_slug(product)}" if mixed else name
            if gpu is None:
                unknown.append(UnknownGpuPool(pool_name, product, len(same)))
                continue
            pools.append(_pool(pool_name, name, gpu, same, pin_product=mixed))
    inventory = Inventory(tuple(pools), tuple(unknown))
    _grouped_memo["last"] = (key, facts, inventory)
    return inventory


def _with_usage(
    inventory: Inventory,
    usage: Mapping[str, Mapping[OwnerKey | None, int]],
    claimed: Mapping[str, Mapping[OwnerKey, int]],
) -> Inventory:
    if not usage and not claimed:
        return inventory
    pools = tuple(
        replace(
            pool,
            nodes=with_node_usage(pool.nodes, usage),
            claimed=dict(claimed.get(pool.name, {})),
        )
        if pool.name in claimed or any(node.name in usage for node in pool.nodes)
        else pool
        for pool in inventory.pools
    )
    return Inventory(pools, inventory.unknown)


def with_node_usage(
    nodes: Iterable[GpuNode], usage: Mapping[str, Mapping[OwnerKey | None, int]]
) -> tuple[GpuNode, ...]:
    """The nodes with the GPUs their bound pods hold."""
    return tuple(_used(node, usage.get(node.name)) for node in nodes)


def _used(node: GpuNode, used: Mapping[OwnerKey | None, int] | None) -> GpuNode:
    # Built directly, not by dataclasses.replace: a fleet's decision does this per node.
    if used is None:
        return node
    return GpuNode(
        node.name, node.allocatable, node.ready, node.taints, dict(used), node.memory, node.domains
    )


def node_fingerprint(
    node: Mapping[str, Any], pool_labels: Sequence[str] = DEFAULT_POOL_LABELS
) -> tuple[Any, ...] | None:
    """What placement reads of a GPU node, pool name first; None for a node without GPUs.
    Equal fingerprints mean a node event changed nothing kvq would decide differently."""
    facts = _read_node(node, pool_labels, {})
    if facts is None:
        return None
    status = node.get("status") or {}
    return (
        facts.pool,
        facts.product_label,
        facts.memory_mib,
        facts.gpus,
        facts.node.allocatable,
        facts.node.memory,
        facts.node.ready,
        facts.node.taints,
        tuple(sorted(facts.labels.items())),
        whole_number((status.get("capacity") or {}).get(keys.GPU_RESOURCE)),
    )


def gpu_pod(pod: Mapping[str, Any]) -> GpuPod | None:
    """The GPU request of a pod bound to a node; None when it holds no GPU (or no longer)."""
    spec = pod.get("spec") or {}
    node = spec.get("nodeName")
    if not node or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return None
    gpus = gpus_of(spec)
    if gpus == 0:
        return None
    meta = pod.get("metadata") or {}
    owner = (meta.get("labels") or {}).get(keys.LABEL_INFERENCESERVICE)
    namespace = meta.get("namespace")
    return GpuPod(str(node), gpus, (namespace, owner) if owner and namespace else None)


def _pool(
    name: str, group: str, gpu: GpuModel, members: list[_NodeFacts], *, pin_product: bool
) -> NodePool:
    first = members[0]
    if first.pool_label is not None:
        selector = {first.pool_label[0]: first.pool_label[1]}
    else:
        selector = {first.product_key: first.product_label}
    if pin_product:
        selector[first.product_key] = first.product_label
    common_labels = dict(first.labels)
    for member in members[1:]:
        common_labels = {k: v for k, v in common_labels.items() if member.labels.get(k) == v}
    lasting = frozenset.intersection(*(m.node.taints for m in members))
    taints = [t for t in lasting if t.key not in TRANSIENT_TAINT_KEYS]
    return NodePool(
        name=name,
        gpu=gpu,
        gpus_per_node=max(m.gpus for m in members),
        nodes=tuple(sorted((m.node for m in members), key=lambda n: n.name)),
        node_selector=selector,
        taints=tuple(sorted(taints, key=lambda t: (t.key, t.value or "", t.effect))),
        labels=common_labels,
        group=group,
    )


def _read_node(
    node: Mapping[str, Any],
    pool_labels: Sequence[str],
    usage: Mapping[str, Mapping[OwnerKey | None, int]],
) -> _NodeFacts | None:
    meta = node.get("metadata") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    status = node.get("status") or {}
    spec = node.get("spec") or {}
    found = _gpu_product(labels)
    allocatable = whole_number((status.get("allocatable") or {}).get(keys.GPU_RESOURCE))
    capacity = whole_number((status.get("capacity") or {}).get(keys.GPU_RESOURCE))
    counted = max((whole_number(labels.get(k)) for k in _GPU_COUNT_LABELS), default=0)
    gpus = capacity or allocatable or counted
    if found is None or gpus == 0:
        return None
    product_key, product, memory = found
    pool_label = next(((k, labels[k]) for k in pool_labels if labels.get(k)), None)
    name = str(meta.get("name", ""))
    return _NodeFacts(
        pool=pool_label[1] if pool_label else product.lower(),
        pool_label=pool_label,
        product_key=product_key,
        product_label=product,
        memory_mib=memory,
        gpus=gpus,
        node=GpuNode(
            name=name,
            allocatable=allocatable,
            ready=_is_ready(status) and not spec.get("unschedulable", False),
            taints=_interned(frozenset(_taints(spec.get("taints") or []))),
            used=dict(usage.get(name, {})),
            memory=_memory_bytes((status.get("allocatable") or {}).get("memory")),
            domains={k: labels[k] for k in TOPOLOGY_KEYS if k in labels},
        ),
        labels=labels,
    )


# Nodes of a pool carry the same few taint sets; one object per set lets placement tell
# them apart by identity (a dict lookup that never compares taints field by field).
_TAINT_SETS: dict[frozenset[Taint], frozenset[Taint]] = {}


def _interned(taints: frozenset[Taint]) -> frozenset[Taint]:
    if len(_TAINT_SETS) >= _FACTS_LIMIT:
        _TAINT_SETS.clear()
    return _TAINT_SETS.setdefault(taints, taints)


def _slug(product: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", product.lower()).strip("-")


def _gpu_product(labels: Mapping[str, str]) -> tuple[str, str, int | None] | None:
    """(label key, product, memory MiB) from the first provider label the node has."""
    for name_key, memory_key in _GPU_NAME_LABELS:
        if labels.get(name_key):
            memory = whole_number(labels.get(memory_key)) if memory_key else 0
            return name_key, labels[name_key], memory or None
    return None


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


def _memory_bytes(value: Any) -> int:
    """A node's allocatable memory ("2000Gi", "131072Ki", "17179869184") in bytes; 0 when
    absent or unreadable (placement then does not judge memory)."""
    try:
        return int(quantity_value(str(value))) if value is not None else 0
    except ValueError:
        return 0
