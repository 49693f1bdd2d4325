"""Carry out a Plan: apply, delete, write status, post events. Decides nothing.

Order matters for retries: objects first, then status (which may raise StatusConflictError),
then events, so a conflict re-runs the decision before any event about it is posted. A plan
that moves the ladder writes status first: the move is on record before anything acts on
it, so an operator killed in between resumes the move rather than undoing it. The objects
of one plan are independent (the API server takes them in any order: a pod waits for its
ConfigMap or claim), so they are applied side by side, as are the events. Every write goes
through one small pool of writers, most urgent pass first: a crashed engine's fallback and
a new service's Deployment do not wait behind a fleet's routine status updates.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

from kvq.decide.types import Plan
from kvq.k8s.apply import SameAsServer, apply_manifest, delete_object
from kvq.k8s.clients import Clients
from kvq.k8s.events import post_event
from kvq.k8s.status import StoredForms, write_status

log = logging.getLogger("kvq.executor")
T = TypeVar("T")
R = TypeVar("R")

# Requests kvq has in flight at once: the API server serves them in its own order, so a
# longer line would be queued there, where an urgent write cannot pass a routine one.
WRITERS = 32
# Within one urgency, what a person or a pod waits for first: the engine's Deployment
# (it starts scheduling and pulling), then the other objects, then status, then Events.
_DEPLOYMENT, _OBJECT, _STATUS, _EVENT = range(4)


class Writers:
    """Threads that send API writes, the most urgent (lowest rank) first, then in order."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._queue: queue.PriorityQueue[tuple[tuple[int, int, int], Any]] = queue.PriorityQueue()
        self._order = itertools.count()
        self._started = False
        self._lock = threading.Lock()

    def submit(self, rank: tuple[int, int], work: Callable[[], R]) -> Future[R]:
        if not self._started:
            self._start()
        done: Future[R] = Future()
        self._queue.put(((*rank, next(self._order)), (work, done)))
        return done

    def _start(self) -> None:
        with self._lock:
            if self._started:
                return
            for index in range(self._size):
                name = f"kvq-write_{index}"
                threading.Thread(target=self._serve, name=name, daemon=True).start()
            self._started = True

    def _serve(self) -> None:
        while True:
            _, (work, done) = self._queue.get()
            if not done.set_running_or_notify_cancel():
                continue
            try:
                done.set_result(work())
            except BaseException as error:  # handed to the waiting pass, which raises it
                done.set_exception(error)


_WRITERS = Writers(WRITERS)


def _each(
    work: Callable[[T], R], items: Iterable[T], rank: Callable[[T], tuple[int, int]]
) -> list[R]:
    """`work` on every item, side by side in the writers' order; results in order, the
    first error raised."""
    futures = [_WRITERS.submit(rank(item), partial(work, item)) for item in items]
    return [future.result() for future in futures]


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
    urgency: int = 0,
) -> ExecutionResult:
    """Make the cluster match `plan` for `isvc` (the body the plan read); `live` holds the
    objects it owns, as the watch cache has them. Its writes wait behind the writes of
    passes with a lower `urgency`, never the other way round."""
    meta = isvc["metadata"]
    where = f"{meta['namespace']}/{meta['name']}"
    by_name = {(o["kind"], o["metadata"]["name"]): o for o in live}
    applied: list[str] = []
    unchanged: list[str] = []
    deleted: list[str] = []

    def status() -> bool:
        (written,) = _each(
            lambda _: write_status(clients, isvc, plan.status, memory.forms),
            [None],
            lambda _: (urgency, _STATUS),
        )
        return written

    status_written = plan.status_first and status()
    if not plan.keep_live:
        results = _each(
            lambda manifest: apply_manifest(
                clients,
                manifest,
                by_name.get((manifest["kind"], manifest["metadata"]["name"])),
                memory.same,
            ),
            plan.apply,
            lambda manifest: (
                urgency,
                _DEPLOYMENT if manifest["kind"] == "Deployment" else _OBJECT,
            ),
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
        status_written = status()
    if status_written:
        log.info("%s: status written", where)
    _each(
        lambda event: post_event(clients, isvc, event, now),
        plan.events,
        lambda _: (urgency, _EVENT),
    )
    for event in plan.events:
        log.info("%s: event %s %s", where, event.type, event.reason)
    return ExecutionResult(
        applied=tuple(applied),
        unchanged=tuple(unchanged),
        deleted=tuple(deleted),
        status_written=status_written,
        events_posted=len(plan.events),
    )
