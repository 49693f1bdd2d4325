"""Decisions made one at a time, each seeing the GPUs the earlier ones claimed.

Reconciles run side by side, and a Deployment kvq has just applied reaches the watch cache
some hundreds of milliseconds later: services decided in that window would all see the
same free GPUs. Decisions are pure CPU work (the GIL runs one at a time anyway), so they
are made one at a time here, each on the fleet's pools with the claims of the earlier
decisions assumed (`Fleet.assume`, the scheduler's assume cache), at no cost to throughput.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from kvq.decide.types import Plan, Snapshot
from kvq.placement.fleet import Fleet
from kvq.placement.pool import OwnerKey


@dataclass
class SerialDecisions:
    fleet: Fleet
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def decide(
        self, owner: OwnerKey, snapshot: Snapshot, decide: Callable[[Snapshot], Plan]
    ) -> Plan:
        """`decide` on the fleet's pools as they are now, then assume what it claimed."""
        with self._lock:
            plan = decide(replace(snapshot, inventory=self.fleet.inventory()))
            self._assume(owner, plan)
        return plan

    def forget(self, owner: OwnerKey) -> None:
        self.fleet.assume(owner, None)

    def _assume(self, owner: OwnerKey, plan: Plan) -> None:
        if plan.keep_live:
            return  # nothing applied: what was claimed stands
        self.fleet.assume(owner, plan.claims)
