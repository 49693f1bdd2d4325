"""GPU claims: what kvq's engine Deployments and LeaderWorkerSets ask of their pools before
their pods are bound,
and the cache of them that decisions count (kube-scheduler's "assume" cache, for
Deployments).

Pods are bound seconds after their Deployment is written, and many services are decided in
that time (a fleet applied at once, an operator restarted): counting only bound pods, each
of them sees the same free GPUs and a pool is promised several times over. So a claim's
replicas not bound yet count against its pool (`NodePool.claimed`).

A claim comes from two places: the Deployment watch, and kvq's own decision, which the
watch shows some hundreds of milliseconds later. Like the scheduler's assumed pods, a
service's decided claims stand in for what the watch shows of it until the next decision
(or `assume(owner, None)`: the watch knows best).

Pure: no I/O, no lock (the Fleet that holds the cache takes its own).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvq.api import keys
from kvq.placement.gpu_requests import gpus_of
from kvq.placement.pool import OwnerKey

DeploymentKey = tuple[str, str]
"""(namespace, name) of one of kvq's Deployments or LeaderWorkerSets (a LeaderWorkerSet's
name ends in -group, so the two never share a key)."""


@dataclass(frozen=True)
class GpuClaim:
    """What one of kvq's Deployments asks of its pool: GPUs its pods take once bound."""

    owner: OwnerKey
    pool: str
    replicas: int
    gpus_per_replica: int

    @property
    def gpus(self) -> int:
        return max(self.replicas, 0) * max(self.gpus_per_replica, 0)


def gpu_claim(workload: Mapping[str, Any]) -> GpuClaim | None:
    """The GPUs one of kvq's engine Deployments (or LeaderWorkerSets: a group of pods per
    replica) asks of its pool; None when it asks none (being deleted, no pool, no GPU)."""
    meta = workload.get("metadata") or {}
    owner = (meta.get("labels") or {}).get(keys.LABEL_INFERENCESERVICE)
    namespace = meta.get("namespace")
    if not owner or not namespace or meta.get("deletionTimestamp"):
        return None
    spec = workload.get("spec") or {}
    group = spec.get("leaderWorkerTemplate")
    if isinstance(group, Mapping):
        leader = group.get("leaderTemplate") or {}
        worker = group.get("workerTemplate") or leader
        size = group.get("size", 1)
        size = size if isinstance(size, int) and size > 0 else 1
        template = leader
        gpus = gpus_of(leader.get("spec") or {}) + (size - 1) * gpus_of(worker.get("spec") or {})
    else:
        template = spec.get("template") or {}
        gpus = gpus_of(template.get("spec") or {})
    pool = ((template.get("metadata") or {}).get("annotations") or {}).get(keys.ANNOTATION_POOL)
    replicas = spec.get("replicas", 1)
    if not pool or gpus <= 0 or not isinstance(replicas, int):
        return None
    return GpuClaim((str(namespace), str(owner)), str(pool), replicas, gpus)


def engine_claims(
    namespace: str | None, name: str, pool: str, replicas: int, gpus_per_replica: int
) -> tuple[GpuClaim, ...]:
    """What an engine Deployment kvq renders claims of `pool` (none without a GPU or a
    namespace, as `gpu_claim` reads such a Deployment)."""
    if not namespace or not name or gpus_per_replica <= 0:
        return ()
    return (GpuClaim((namespace, name), pool, replicas, gpus_per_replica),)


def claimed_by_pool(claims: Iterable[GpuClaim]) -> dict[tuple[OwnerKey, str], int]:
    """GPUs each owner claims of each pool (tiers on one pool add up)."""
    claimed: dict[tuple[OwnerKey, str], int] = {}
    for claim in claims:
        if claim.gpus > 0:
            key = (claim.owner, claim.pool)
            claimed[key] = claimed.get(key, 0) + claim.gpus
    return claimed


@dataclass
class ClaimsCache:
    """Every owner's claims: the decided ones (assumed), else the watch's. Each change
    answers the pools whose claimed GPUs it changed, for the holder to count again."""

    _watched: dict[OwnerKey, dict[DeploymentKey, GpuClaim]] = field(default_factory=dict)
    _watched_owner: dict[DeploymentKey, OwnerKey] = field(default_factory=dict)
    """Which owner's claim each watched Deployment is."""
    _assumed: dict[OwnerKey, tuple[GpuClaim, ...]] = field(default_factory=dict)
    _by_pool: dict[str, dict[OwnerKey, int]] = field(default_factory=dict)
    """Pool -> GPUs each owner claims of it."""
    _by_owner: dict[OwnerKey, dict[str, int]] = field(default_factory=dict)
    """Owner -> what it adds to `_by_pool`, by pool."""

    def watched(self, key: DeploymentKey, claim: GpuClaim | None) -> set[str]:
        """What one of kvq's Deployments claims, as the watch shows it (None: nothing)."""
        owners = set()
        before = self._watched_owner.pop(key, None)
        if before is not None:
            owners.add(before)
            self._watched[before].pop(key, None)
            if not self._watched[before]:
                del self._watched[before]
        if claim is not None:
            self._watched.setdefault(claim.owner, {})[key] = claim
            self._watched_owner[key] = claim.owner
            owners.add(claim.owner)
        return {pool for owner in owners for pool in self._count_again(owner)}

    def assume(self, owner: OwnerKey, claims: Sequence[GpuClaim] | None) -> set[str]:
        """What kvq's latest decision for `owner` claims (None: the watch knows best)."""
        if claims is None:
            self._assumed.pop(owner, None)
        else:
            self._assumed[owner] = tuple(claims)
        return self._count_again(owner)

    def on_pool(self, pool: str) -> Mapping[OwnerKey, int]:
        """GPUs each owner claims of `pool` (bound or not)."""
        return self._by_pool.get(pool, {})

    def claims(self) -> list[GpuClaim]:
        """Every claim counted: the decided ones, and the watch's for the rest."""
        owners = dict.fromkeys([*self._watched, *self._assumed])
        return [claim for owner in owners for claim in self._effective(owner)]

    def _effective(self, owner: OwnerKey) -> Iterable[GpuClaim]:
        if owner in self._assumed:
            return self._assumed[owner]
        return self._watched.get(owner, {}).values()

    def _count_again(self, owner: OwnerKey) -> set[str]:
        counted = {
            pool: gpus for (_, pool), gpus in claimed_by_pool(self._effective(owner)).items()
        }
        before = self._by_owner.get(owner, {})
        if counted == before:
            return set()
        changed = before.keys() | counted.keys()
        for pool in changed:
            on_pool = self._by_pool.setdefault(pool, {})
            if pool in counted:
                on_pool[owner] = counted[pool]
            else:
                on_pool.pop(owner, None)
            if not on_pool:
                del self._by_pool[pool]
        if counted:
            self._by_owner[owner] = counted
        else:
            self._by_owner.pop(owner, None)
        return set(changed)
