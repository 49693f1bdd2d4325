"""Carry out a Plan: apply, delete, write status, post events. Decides nothing.

Order matters for retries: objects first, then status (which may raise StatusConflictError),
then events, so a conflict re-runs the decision before any event about it is posted. A plan
that moves the ladder writes status first: the move is on record before anything acts on
it, so an operator killed in between resumes the move rather than undoing it. The objects
of one plan are independent (the API server takes them in any order: a pod waits for its
ConfigMap or claim), so they are applied side by side, as are the events.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from kvq.decide.types import Plan
from kvq.k8s.apply import SameAsServer, apply_manifest, delete_object
from kvq.k8s.clients import Clients
from kvq.k8s.events import post_event
from kvq.k8s.status import StoredForms, write_status

log = logging.getLogger("kvq.executor")
T = TypeVar("T")
R = TypeVar("R")

# Shared by every reconcile: a write waits on the API server, not on the CPU.
_WRITERS = ThreadPoolExecutor(16, thread_name_prefix="kvq-write")


def _each(work: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """`work` on every item, side by side; results in order, the first error raised."""
    listed = list(items)
    if len(listed) < 2:
        return [work(item) for item in listed]
    return list(_WRITERS.map(work, listed))


@dataclass
class Memory:
    """What the executor remembers between passes so that a settled service costs nothing."""

    same: SameAsServer = field(default_factory=SameAsServer)
    forms: StoredForms = field(default_factory=StoredForms)


@dataclass(frozen=True)
class ExecutionResult:
    """What one execution wrote (names as Kind/name)."""

    applied: tuple[str, ...]
    unchanged: tuple[str, ...]
    deleted: tuple[str, ...]
    status_written: bool
    events_posted: int

    @property
    def writes(self) -> int:
        return len(self.applied) + len(self.deleted) + int(self.status_written) + self.events_posted


def execute(
    clients: Clients,
    plan: Plan,
    isvc: Mapping[str, Any],
    live: Sequence[Mapping[str, Any]],
    memory: Memory,
    now: datetime,
) -> ExecutionResult:
    """Make the cluster match `plan` for `isvc` (the body the plan read); `live` holds the
    objects it owns, as the watch cache has them."""
    meta = isvc["metadata"]
    where = f"{meta['namespace']}/{meta['name']}"
    by_name = {(o["kind"], o["metadata"]["name"]): o for o in live}
    applied: list[str] = []
    unchanged: list[str] = []
    deleted: list[str] = []
    status_written = plan.status_first and write_status(clients, isvc, plan.status, memory.forms)
    if not plan.keep_live:
        results = _each(
            lambda manifest: apply_manifest(
                clients,
                manifest,
                by_name.get((manifest["kind"], manifest["metadata"]["name"])),
                memory.same,
            ),
            plan.apply,
        )
        for result in results:
            (applied if result.written else unchanged).append(f"{result.kind}/{result.name}")
        for ref in plan.delete:
            current = by_name.get((ref.kind, ref.name))
            if current is not None and delete_object(clients, ref, current):
                deleted.append(f"{ref.kind}/{ref.name}")
    # Names and reasons only: manifests may carry secret references, never log their bodies.
    for name in applied:
        log.info("%s: applied %s", where, name)
    for name in deleted:
        log.info("%s: deleted %s", where, name)
    if not plan.status_first:
        status_written = write_status(clients, isvc, plan.status, memory.forms)
    if status_written:
        log.info("%s: status written", where)
    _each(lambda event: post_event(clients, isvc, event, now), plan.events)
    for event in plan.events:
        log.info("%s: event %s %s", where, event.type, event.reason)
    return ExecutionResult(
        applied=tuple(applied),
        unchanged=tuple(unchanged),
        deleted=tuple(deleted),
        status_written=status_written,
        events_posted=len(plan.events),
    )
