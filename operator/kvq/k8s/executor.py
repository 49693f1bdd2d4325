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

import asyncio
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
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
from kvq.metrics import WRITE_WAIT_SECONDS

log = logging.getLogger("kvq.executor")
T = TypeVar("T")
R = TypeVar("R")

# Requests kvq has in flight at once: the API server serves them in its own order, so a
# longer line would be queued there, where an urgent write cannot pass a routine one.
WRITERS = 32
# Within one urgency, what a person or a pod waits for first: the engine's Deployment (it
# starts scheduling and pulling), then the other objects and status in the order they
# come, then Events (which no pass waits for).
_DEPLOYMENT, _OBJECT, _STATUS, _EVENT = 0, 1, 1, 2


@dataclass(eq=False)
class _Write:
    work: Callable[[], Any]
    done: Future[Any]
    key: Hashable | None
    urgency: int
    kind: int
    queued: float = field(default_factory=time.monotonic)


class Writers:
    """Threads that send API writes, the most urgent (lowest urgency, then kind) first,
    then in the order they came. A waiting write can be moved up (`promote`)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._queue: queue.PriorityQueue[tuple[int, int, int, _Write]] = queue.PriorityQueue()
        self._order = itertools.count()
        self._pending: dict[Hashable, set[_Write]] = {}
        self._floor: dict[Hashable, int] = {}
        """The urgency a key's writes have been moved up to, for writes still to come."""
        self._lock = threading.Lock()
        self._started = False

    def submit(
        self, urgency: int, kind: int, work: Callable[[], R], key: Hashable | None = None
    ) -> Future[R]:
        if not self._started:
            self._start()
        with self._lock:
            if key is not None:
                urgency = min(urgency, self._floor.get(key, urgency))
            write = _Write(work, Future(), key, urgency, kind)
            if key is not None:
                self._pending.setdefault(key, set()).add(write)
            self._queue.put((urgency, kind, next(self._order), write))
        return write.done

    def promote(self, key: Hashable, urgency: int) -> None:
        """`key`'s waiting writes, and those it sends until `settle`, go with `urgency`
        if that is more urgent. (A moved write is queued a second time; whichever entry is
        taken first runs, the other is skipped.)"""
        with self._lock:
            self._floor[key] = min(urgency, self._floor.get(key, urgency))
            for write in self._pending.get(key, ()):
                if urgency < write.urgency:
                    write.urgency = urgency
                    self._queue.put((urgency, write.kind, next(self._order), write))

    def settle(self, key: Hashable) -> None:
        """`key`'s pass is over: its next one sends with its own urgency."""
        with self._lock:
            self._floor.pop(key, None)

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
            *_, write = self._queue.get()
            with self._lock:
                if write.done.running() or write.done.done():
                    continue  # taken already by its other entry
                write.done.set_running_or_notify_cancel()
                if write.key is not None:
                    waiting = self._pending.get(write.key)
                    if waiting is not None:
                        waiting.discard(write)
                        if not waiting:
                            del self._pending[write.key]
            WRITE_WAIT_SECONDS.labels(urgency=str(write.urgency)).observe(
                time.monotonic() - write.queued
            )
            try:
                write.done.set_result(write.work())
            except BaseException as error:  # handed to the waiting pass, which raises it
                write.done.set_exception(error)


WRITES = Writers(WRITERS)


async def _each(
    work: Callable[[T], R],
    items: Iterable[T],
    kind: Callable[[T], int],
    urgency: int,
    key: Hashable | None,
) -> list[R]:
    """`work` on every item, side by side in the writers' order; results in order, the
    first error raised."""
    futures = [WRITES.submit(urgency, kind(item), partial(work, item), key) for item in items]
    return list(await asyncio.gather(*(asyncio.wrap_future(f) for f in futures)))


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
    """Events handed to the writers (last in their order: no pass waits for them)."""
    events: tuple[Future[None], ...] = ()
    """Their posting, for a caller that must see them land (a failure is logged)."""

    @property
    def writes(self) -> int:
        return len(self.applied) + len(self.deleted) + int(self.status_written) + self.events_posted


async def execute(
    clients: Clients,
    plan: Plan,
    isvc: Mapping[str, Any],
    live: Sequence[Mapping[str, Any]],
    memory: Memory,
    now: datetime,
    urgency: int = 0,
    key: Hashable | None = None,
) -> ExecutionResult:
    """Make the cluster match `plan` for `isvc` (the body the plan read); `live` holds the
    objects it owns, as the watch cache has them. Its writes wait behind the writes of
    passes with a lower `urgency`, never the other way round (`key` names the pass's
    service, whose waiting writes `WRITES.promote` can move up)."""
    meta = isvc["metadata"]
    where = f"{meta['namespace']}/{meta['name']}"
    by_name = {(o["kind"], o["metadata"]["name"]): o for o in live}
    applied: list[str] = []
    unchanged: list[str] = []
    deleted: list[str] = []

    async def status() -> bool:
        (written,) = await _each(
            lambda _: write_status(clients, isvc, plan.status, memory.forms),
            [None],
            lambda _: _STATUS,
            urgency,
            key,
        )
        return written

    status_written = plan.status_first and await status()
    if not plan.keep_live:
        results = await _each(
            lambda manifest: apply_manifest(
                clients,
                manifest,
                by_name.get((manifest["kind"], manifest["metadata"]["name"])),
                memory.same,
            ),
            plan.apply,
            lambda manifest: _DEPLOYMENT if manifest["kind"] == "Deployment" else _OBJECT,
            urgency,
            key,
        )
        for result in results:
            (applied if result.written else unchanged).append(f"{result.kind}/{result.name}")
        gone = [(ref, by_name.get((ref.kind, ref.name))) for ref in plan.delete]
        removed = await _each(
            lambda pair: pair[1] is not None and delete_object(clients, pair[0], pair[1]),
            gone,
            lambda _: _OBJECT,
            urgency,
            key,
        )
        pairs = zip(gone, removed, strict=True)
        deleted += [f"{ref.kind}/{ref.name}" for (ref, _), yes in pairs if yes]
    # Names and reasons only: manifests may carry secret references, never log their bodies.
    for name in applied:
        log.info("%s: applied %s", where, name)
    for name in deleted:
        log.info("%s: deleted %s", where, name)
    if not plan.status_first:
        status_written = await status()
    if status_written:
        log.info("%s: status written", where)
    posting = tuple(
        WRITES.submit(urgency, _EVENT, partial(post_event, clients, isvc, event, now), key)
        for event in plan.events
    )
    for event, future in zip(plan.events, posting, strict=True):
        log.info("%s: event %s %s", where, event.type, event.reason)
        future.add_done_callback(partial(_report_event_failure, where, event.reason))
    return ExecutionResult(
        applied=tuple(applied),
        unchanged=tuple(unchanged),
        deleted=tuple(deleted),
        status_written=status_written,
        events_posted=len(plan.events),
        events=posting,
    )


def _report_event_failure(where: str, reason: str, future: Future[None]) -> None:
    error = future.exception()
    if error is not None:
        log.warning("%s: event %s not posted: %s", where, reason, error)
