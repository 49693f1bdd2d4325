"""What each service's latest decision promised its pools, until the watch shows it.

Reconciles run side by side, and a Deployment kvq has just applied reaches the watch
cache (the `Reservation` index) some hundreds of milliseconds later: services decided in
that window would all see the same free GPUs. Decisions are pure CPU work (the GIL runs
one at a time anyway), so they are made one at a time here, each with what the earlier
ones promised, at no cost to throughput.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from kvq.decide.types import Plan, Snapshot
from kvq.placement.discovery import Reservation, reservation
from kvq.placement.pool import OwnerKey


@dataclass
class Promises:
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _by_owner: dict[OwnerKey, tuple[Reservation, ...]] = field(default_factory=dict)

    def decide(
        self, owner: OwnerKey, snapshot: Snapshot, decide: Callable[[Snapshot], Plan]
    ) -> Plan:
        """`decide` with the watch's reservations, where this process knows newer ones."""
        with self._lock:
            known = self._by_owner
            merged = [r for r in snapshot.reservations if r.owner not in known]
            merged += [r for promised in known.values() for r in promised]
            plan = decide(replace(snapshot, reservations=merged))
            self._record(owner, plan)
        return plan

    def forget(self, owner: OwnerKey) -> None:
        with self._lock:
            self._by_owner.pop(owner, None)

    def _record(self, owner: OwnerKey, plan: Plan) -> None:
        if plan.keep_live:
            return  # nothing applied: what was promised stands
        deployments = [m for m in plan.apply if m.get("kind") == "Deployment"]
        found = [reservation(m) for m in deployments]
        if not deployments or any("replicas" not in m.get("spec", {}) for m in deployments):
            # No engine, or replicas another controller sets (KEDA): the watch knows best.
            self._by_owner.pop(owner, None)
            return
        self._by_owner[owner] = tuple(r for r in found if r is not None)
