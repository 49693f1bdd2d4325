"""A cluster's GPU pools kept up to date from watch events: what a decision reads of them.

`discover_pools` groups every node and counts every pod and GPU claim. On a fleet of a
thousand services that was most of each decision, and a rollout makes thousands. The
operator feeds each watch event to a `Fleet` once instead, and each decision takes its
`inventory()`, in which only the pools an event touched since the last one are rebuilt.
The result is the one `discover_pools` gives for the same nodes, pods and GPU claims
(tested on random sequences of events). The claims are placement's `ClaimsCache`: the
watch's, and the ones kvq's decisions assumed (`assume`).

Pure: no I/O. kopf's handlers feed it on the event loop while decisions read it on worker
threads, so every method takes the lock.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kvq.catalog.gpus import GpuCatalog
from kvq.placement.claims import ClaimsCache, DeploymentKey, GpuClaim
from kvq.placement.discovery import (
    DEFAULT_POOL_LABELS,
    GpuPod,
    Inventory,
    grouped,
    read_facts,
    with_node_usage,
)
from kvq.placement.pool import NodePool, OwnerKey


@dataclass
class Fleet:
    catalog: GpuCatalog
    pool_labels: tuple[str, ...] = DEFAULT_POOL_LABELS
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    _facts: dict[str, Any] = field(default_factory=dict, repr=False)
    """Node name -> what placement reads of it (None: no GPU node)."""
    _grouping: Inventory | None = field(default=None, repr=False)
    """The pools the nodes make, without usage; None: group again."""
    _pool_of: dict[str, str] = field(default_factory=dict, repr=False)
    _pods: dict[str, GpuPod] = field(default_factory=dict, repr=False)
    _usage: dict[str, dict[OwnerKey | None, int]] = field(default_factory=dict, repr=False)
    """Node name -> GPUs its bound pods hold, by owner."""
    _claims: ClaimsCache = field(default_factory=ClaimsCache, repr=False)
    _pools: dict[str, NodePool] = field(default_factory=dict, repr=False)
    _dirty: set[str] | None = field(default=None, repr=False)
    """Pools to build again before the next inventory; None: all of them."""
    _built: Inventory | None = field(default=None, repr=False)

    # --- what the watches say ------------------------------------------------------------

    def node(self, name: str, body: Mapping[str, Any] | None) -> None:
        """A node was listed, changed (body) or deleted (None)."""
        with self._lock:
            # Read once per event: each event brings a new resourceVersion, so discovery's
            # memo (facts_of) would only hold readings nobody asks for again.
            facts = read_facts(body, self.pool_labels) if body is not None else None
            before = self._facts.get(name, _ABSENT)
            if body is None:
                self._facts.pop(name, None)
            else:
                self._facts[name] = facts
            if before is _ABSENT and facts is None:
                return  # a node without GPUs, seen for the first time
            if before != facts:
                self._grouping = None  # what the pools are may have changed

    def pod(self, uid: str, found: GpuPod | None) -> None:
        """A pod's GPUs on its node (None: it holds none, or no longer exists)."""
        with self._lock:
            before = self._pods.get(uid)
            if before == found:
                return
            if before is not None:
                self._hold(before, -before.gpus)
                del self._pods[uid]
            if found is not None:
                self._hold(found, found.gpus)
                self._pods[uid] = found

    def deployment(self, key: DeploymentKey, found: GpuClaim | None) -> None:
        """What one of kvq's Deployments claims of its pool, as the watch shows it."""
        with self._lock:
            for pool in self._claims.watched(key, found):
                self._touch(pool)

    # --- what kvq's decisions say --------------------------------------------------------

    def assume(self, owner: OwnerKey, claims: Sequence[GpuClaim] | None) -> None:
        """What kvq's latest decision for `owner` claims (None: the watch knows best)."""
        with self._lock:
            for pool in self._claims.assume(owner, claims):
                self._touch(pool)

    # --- what a decision reads -----------------------------------------------------------

    def inventory(self) -> Inventory:
        with self._lock:
            if self._grouping is None:
                facts = [self._facts[name] for name in sorted(self._facts)]
                self._grouping = grouped(facts, self.catalog)
                self._pool_of = {n.name: p.name for p in self._grouping.pools for n in p.nodes}
                self._dirty = None
            if self._dirty is None or self._dirty or self._built is None:
                self._build()
            assert self._built is not None
            return self._built

    def claims(self) -> list[GpuClaim]:
        """Every GPU claim counted: the decided ones, and the watch's for the rest."""
        with self._lock:
            return self._claims.claims()

    # --- inside --------------------------------------------------------------------------

    def _hold(self, pod: GpuPod, gpus: int) -> None:
        held = self._usage.setdefault(pod.node, {})
        held[pod.owner] = held.get(pod.owner, 0) + gpus
        if held[pod.owner] <= 0:
            del held[pod.owner]
        if not held:
            del self._usage[pod.node]
        self._touch(self._pool_of.get(pod.node))

    def _touch(self, pool: str | None) -> None:
        if pool is not None and self._dirty is not None:
            self._dirty.add(pool)
        self._built = None

    def _build(self) -> None:
        assert self._grouping is not None
        dirty = self._dirty
        for base in self._grouping.pools:
            if dirty is None or base.name in dirty or base.name not in self._pools:
                self._pools[base.name] = self._pool(base)
        for stale in set(self._pools) - {p.name for p in self._grouping.pools}:
            del self._pools[stale]
        pools = tuple(self._pools[p.name] for p in self._grouping.pools)
        self._built = Inventory(pools, self._grouping.unknown)
        self._dirty = set()

    def _pool(self, base: NodePool) -> NodePool:
        """`base` with its nodes' bound pods and the GPUs claimed beyond them."""
        bound: dict[OwnerKey, int] = {}
        for node in base.nodes:
            for owner, gpus in self._usage.get(node.name, {}).items():
                if owner is not None:
                    bound[owner] = bound.get(owner, 0) + gpus
        claimed = {
            owner: gpus - bound.get(owner, 0)
            for owner, gpus in self._claims.on_pool(base.name).items()
            if gpus > bound.get(owner, 0)
        }
        if not claimed and not any(node.name in self._usage for node in base.nodes):
            return base
        return replace(base, nodes=with_node_usage(base.nodes, self._usage), claimed=claimed)


_ABSENT = object()
