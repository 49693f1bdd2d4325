"""Carry out a Plan: apply, delete, write status, post events. Decides nothing.

Order matters for retries: objects first, then status (which may raise StatusConflictError),
then events, so a conflict re-runs the decision before any event about it is posted.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kvq.decide.types import Plan
from kvq.k8s.apply import apply_manifest, delete_object
from kvq.k8s.clients import Clients
from kvq.k8s.events import post_event
from kvq.k8s.status import write_status

log = logging.getLogger("kvq.executor")


@dataclass(frozen=True)
class Outcome:
    """What one execution wrote (names as Kind/name)."""

    applied: tuple[str, ...]
    unchanged: tuple[str, ...]
    deleted: tuple[str, ...]
    status_written: bool
    events_posted: int

    @property
    def writes(self) -> int:
        return len(self.applied) + len(self.deleted) + int(self.status_written) + self.events_posted


def execute(clients: Clients, plan: Plan, isvc: Mapping[str, Any], now: datetime) -> Outcome:
    """Make the cluster match `plan` for the InferenceService `isvc` (the body the plan read)."""
    meta = isvc["metadata"]
    where = f"{meta['namespace']}/{meta['name']}"
    applied: list[str] = []
    unchanged: list[str] = []
    for manifest in plan.apply:
        result = apply_manifest(clients, manifest)
        (applied if result.written else unchanged).append(f"{result.kind}/{result.name}")
    deleted = [f"{ref.kind}/{ref.name}" for ref in plan.delete if delete_object(clients, ref)]
    # Names and reasons only: manifests may carry secret references, never log their bodies.
    for name in applied:
        log.info("%s: applied %s", where, name)
    for name in deleted:
        log.info("%s: deleted %s", where, name)
    status_written = write_status(clients, isvc, plan.status)
    if status_written:
        log.info("%s: status written", where)
    for event in plan.events:
        post_event(clients, isvc, event, now)
        log.info("%s: event %s %s", where, event.type, event.reason)
    return Outcome(
        applied=tuple(applied),
        unchanged=tuple(unchanged),
        deleted=tuple(deleted),
        status_written=status_written,
        events_posted=len(plan.events),
    )
