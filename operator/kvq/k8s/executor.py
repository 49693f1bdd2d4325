"""Carry out a Plan: apply, delete, write status, post events. Decides nothing.

Order matters for retries: objects first, then status (which may raise StatusConflictError),
then events, so a conflict re-runs the decision before any event about it is posted. A plan
that moves the ladder writes status first: the move is on record before anything acts on
it, so an operator killed in between resumes the move rather than undoing it. The objects
of one plan are independent (the API server takes them in any order: a pod waits for its
ConfigMap or claim), so they are applied side by side, as are the events, each a write on
the writers (kvq.k8s.writers: the most urgent pass's first, within the write rate limit).
Only objects that differ from the cache are sent. A Service is the exception to the order:
its apply goes on after the pass (`Detached`), since the API server creates Services one at
a time and nothing in the status depends on it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any, TypeVar

from kvq.decide.engine_workload import ENGINE_KINDS
from kvq.decide.types import Manifest, Plan
from kvq.k8s.apply import (
    ApplyResult,
    SameAsServer,
    apply_manifest,
    delete_object,
    in_place,
    manifest_digest,
)
from kvq.k8s.clients import Clients
from kvq.k8s.events import post_event
from kvq.k8s.status_writer import StoredForms, write_status
from kvq.k8s.writers import (
    FIRST,
    IN_ORDER,
    LAST,
    SERIAL,
    SERIAL_KINDS,
    SHARED,
    WRITES,
)

log = logging.getLogger("kvq.executor")
T = TypeVar("T")
R = TypeVar("R")


async def _each(
    work: Callable[[T], R],
    items: Iterable[T],
    urgency: int,
    key: Hashable | None,
    kind: Callable[[T], str] = lambda _: "",
) -> list[R]:
    """`work` on every item (one write each, of `kind(item)`), side by side in the writers'
    order; results in order, the first error raised."""
    futures = [
        WRITES.submit(urgency, partial(work, item), key, _rank(kind(item)), _lane(kind(item)))
        for item in items
    ]
    return list(await asyncio.gather(*(asyncio.wrap_future(f) for f in futures)))


def _rank(kind: str) -> int:
    return FIRST if kind in ENGINE_KINDS else IN_ORDER


def _lane(kind: str) -> int:
    return SERIAL if kind in SERIAL_KINDS else SHARED


ObjectIdent = tuple[str, str, str]
"""(kind, namespace, name)."""


@dataclass
class Detached:
    """Writes that go on after their pass: applies of SERIAL_KINDS, which the API server
    serves one at a time (a burst's Services took 110 s to create in `make bench`, and a
    pass that waited for its Service held its service's next pass, the one that writes
    Ready). At most one per object in flight; `settled(key, failed)` is called (from a
    writer thread) when one ends that failed, or that a later pass asked for again."""

    settled: Callable[[Hashable, bool], None] | None = None
    _in_flight: dict[ObjectIdent, tuple[str, Future[ApplyResult]]] = field(default_factory=dict)
    _asked_again: set[ObjectIdent] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(
        self, ident: ObjectIdent, digest: str, send: Callable[[], Future[ApplyResult]]
    ) -> Future[ApplyResult] | None:
        """`send()`'s write, unless one for `ident` is in flight (then None; if that one
        sends other content (`digest`), this is asked for again when it ends)."""
        with self._lock:
            if ident in self._in_flight:
                if self._in_flight[ident][0] != digest:
                    self._asked_again.add(ident)
                return None
            future = send()
            self._in_flight[ident] = (digest, future)
            return future

    def end(
        self, ident: ObjectIdent, key: Hashable, where: str, future: Future[ApplyResult]
    ) -> None:
        with self._lock:
            self._in_flight.pop(ident, None)
            again = ident in self._asked_again
            self._asked_again.discard(ident)
        error = future.exception()
        if error is not None:
            log.warning("%s: %s/%s not applied: %s", where, ident[0], ident[2], error)
        elif future.result().written:
            log.info("%s: applied %s/%s", where, ident[0], ident[2])
        if (error is not None or again) and self.settled is not None:
            self.settled(key, error is not None)


@dataclass
class Memory:
    """What the executor remembers between passes so that a settled service costs nothing."""

    same: SameAsServer = field(default_factory=SameAsServer)
    forms: StoredForms = field(default_factory=StoredForms)
    detached: Detached = field(default_factory=Detached)


@dataclass(frozen=True)
class ExecutionResult:
    """What one execution wrote (names as Kind/name)."""

    applied: tuple[str, ...]
    unchanged: tuple[str, ...]
    deleted: tuple[str, ...]
    status_written: bool
    events_posted: int
    """Events handed to the writers (no pass waits for them)."""
    events: tuple[Future[None], ...] = ()
    """Their posting, for a caller that must see them land (a failure is logged)."""
    detached: tuple[Future[ApplyResult], ...] = ()
    """Applies that go on after the pass (`Detached`), for a caller that must see them."""

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
            urgency,
            key,
        )
        return written

    status_written = plan.status_first and await status()
    detached: list[Future[ApplyResult]] = []
    if not plan.keep_live:

        def live_of(manifest: Manifest) -> Mapping[str, Any] | None:
            return by_name.get((manifest["kind"], manifest["metadata"]["name"]))

        # Only what differs goes to the writers: a check queued behind a burst's writes
        # made a pass with nothing to apply wait as long as one with everything. (Checked
        # here, well under a millisecond: a hop to a thread delayed a new service's
        # Deployment, first-100 p95 1.25 s against 0.92-0.96 s.)
        in_place_ = [in_place(m, live_of(m), memory.same) for m in plan.apply]
        pending = [m for m, same in zip(plan.apply, in_place_, strict=True) if not same]
        unchanged += [
            f"{m['kind']}/{m['metadata']['name']}"
            for m, same in zip(plan.apply, in_place_, strict=True)
            if same
        ]
        for manifest in [m for m in pending if m["kind"] in SERIAL_KINDS]:
            sent = _detach(clients, manifest, live_of(manifest), memory, urgency, key, where)
            if sent is not None:
                detached.append(sent)
        results = await _each(
            lambda manifest: apply_manifest(clients, manifest, live_of(manifest), memory.same),
            [m for m in pending if m["kind"] not in SERIAL_KINDS],
            urgency,
            key,
            lambda manifest: str(manifest["kind"]),
        )
        for result in results:
            (applied if result.written else unchanged).append(f"{result.kind}/{result.name}")
        gone = [(ref, by_name.get((ref.kind, ref.name))) for ref in plan.delete]
        removed = await _each(
            lambda pair: pair[1] is not None and delete_object(clients, pair[0], pair[1]),
            gone,
            urgency,
            key,
            lambda pair: pair[0].kind,
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
        WRITES.submit(urgency, partial(post_event, clients, isvc, event, now), key, LAST)
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
        detached=tuple(detached),
    )


def _detach(
    clients: Clients,
    manifest: Manifest,
    live: Mapping[str, Any] | None,
    memory: Memory,
    urgency: int,
    key: Hashable | None,
    where: str,
) -> Future[ApplyResult] | None:
    """Apply `manifest` on its own writers without the pass waiting (`Detached`)."""
    meta = manifest["metadata"]
    ident = (str(manifest["kind"]), str(meta.get("namespace", "")), str(meta["name"]))

    def send() -> Future[ApplyResult]:
        return WRITES.submit(
            urgency,
            partial(apply_manifest, clients, manifest, live, memory.same),
            key,
            IN_ORDER,
            SERIAL,
        )

    future = memory.detached.start(ident, manifest_digest(manifest), send)
    if future is not None:
        future.add_done_callback(partial(memory.detached.end, ident, key, where))
    return future


def _report_event_failure(where: str, reason: str, future: Future[None]) -> None:
    error = future.exception()
    if error is not None:
        log.warning("%s: event %s not posted: %s", where, reason, error)
