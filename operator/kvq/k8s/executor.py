"""Carry out a Plan: apply, delete, write status, post events. Decides nothing.

Order matters for retries: objects first, then status (which may raise StatusConflictError),
then events, so a conflict re-runs the decision before any event about it is posted. A plan
that moves the ladder writes status first: the move is on record before anything acts on
it, so an operator killed in between resumes the move rather than undoing it. The objects
of one plan are independent (the API server takes them in any order: a pod waits for its
ConfigMap or claim), so they are applied side by side, as are the events. Every write goes
through one small pool of writers, most urgent pass first: a crashed engine's fallback and
a new service's Deployment do not wait behind a fleet's routine status updates. Some of
the writers send only Deployments, and Services have writers of their own, so neither a
burst's ConfigMaps and status writes nor its Service creates (each allocates a cluster IP)
hold up the next Deployment; and while Deployments are waiting or being sent, the writes
of passes no more urgent wait for them (up to HOLD_SECONDS), since the API server shares
its CPU among the requests in flight.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import threading
import time
from collections import Counter
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
from kvq.k8s.status_writer import StoredForms, write_status
from kvq.metrics import WRITE_WAIT_SECONDS

log = logging.getLogger("kvq.executor")
T = TypeVar("T")
R = TypeVar("R")

# Writes of any kind kvq has in flight at once: the API server serves them in its own
# order, so a longer line would be queued there, where an urgent write cannot pass a
# routine one.
WRITERS = 32
# A Service create costs the API server several times a ConfigMap's (it allocates a
# cluster IP: an IPAddress object), so Services have writers of their own: on the shared
# ones, a burst's Service creates took 1.7 s each and held most writers while the
# Deployments behind them waited (make bench, 100 services).
SERVICE_WRITERS = 8
# Writers only for Deployments, beside the shared ones: a burst of 100 new services
# arrives faster than 32 writers, busy with its ConfigMaps and status writes, free up.
DEPLOYMENT_WRITERS = 16
# The queue of every kind no crew names.
ANY_KIND = "*"
# Within one urgency, what a person or a pod waits for first: the engine's Deployment (it
# starts scheduling and pulling), then the other objects and status in the order they
# come, then Events (which no pass waits for).
_RANKS = {"Deployment": 0, "Event": 2}
_DEPLOYMENT_RANK = _RANKS["Deployment"]
_OTHER_RANK = 1
# The longest any other write waits for Deployments before it is sent beside them.
HOLD_SECONDS = 1.0
# A status write's kind: the InferenceService's status subresource.
_STATUS = "InferenceService"


@dataclass(eq=False)
class _Write:
    work: Callable[[], Any]
    done: Future[Any]
    key: Hashable | None
    urgency: int
    queue: str
    rank: int
    queued: float = field(default_factory=time.monotonic)


_Entry = tuple[int, int, int, _Write]


def _taken(write: _Write) -> bool:
    return write.done.running() or write.done.done()


@dataclass(frozen=True)
class Crew:
    """Writer threads that take writes of some kinds only (ANY_KIND: every kind that no
    crew names), the most urgent of those first."""

    threads: int
    kinds: tuple[str, ...]


class Writers:
    """Threads that send API writes, the most urgent (lowest urgency, then rank: a
    Deployment, other objects and status, an Event) first, then in the order they came. A
    waiting write can be moved up (`promote`).

    Each write waits in its kind's queue (or ANY_KIND's), which only some crews take
    from: a crew of their own keeps Service creates off the shared writers, and one that
    takes only Deployments sends a new service's Deployment while every shared writer is
    held by a burst's status writes and ConfigMaps. A write other than a Deployment is
    held while a Deployment of a pass as urgent or more is waiting or being sent, for
    `hold_seconds` at most."""

    def __init__(self, crews: Mapping[str, Crew], hold_seconds: float = HOLD_SECONDS) -> None:
        self._crews = dict(crews)
        self._hold_seconds = hold_seconds
        self._queues: dict[str, list[_Entry]] = {
            kind: [] for crew in crews.values() for kind in crew.kinds
        }
        self._order = itertools.count()
        self._pending: dict[Hashable, set[_Write]] = {}
        self._floor: dict[Hashable, int] = {}
        """The urgency a key's writes have been moved up to, for writes still to come."""
        self._lock = threading.Lock()
        self._ready = {name: threading.Condition(self._lock) for name in crews}
        self._started = False
        self._sending: Counter[int] = Counter()
        """Deployments waiting or being sent, by urgency: what holds the other writes."""

    def submit(
        self, urgency: int, kind: str, work: Callable[[], R], key: Hashable | None = None
    ) -> Future[R]:
        """`work` (a write of `kind`: a Kubernetes kind) queued; its result when sent."""
        if not self._started:
            self._start()
        queue = kind if kind in self._queues else ANY_KIND
        if queue not in self._queues:
            raise ValueError(f"no writer takes {kind} writes")
        with self._lock:
            if key is not None:
                urgency = min(urgency, self._floor.get(key, urgency))
            write = _Write(work, Future(), key, urgency, queue, _RANKS.get(kind, _OTHER_RANK))
            if key is not None:
                self._pending.setdefault(key, set()).add(write)
            if write.rank == _DEPLOYMENT_RANK:
                self._sending[urgency] += 1
            self._put(write)
        return write.done

    def promote(self, key: Hashable, urgency: int) -> None:
        """`key`'s waiting writes, and those it sends until `settle`, go with `urgency`
        if that is more urgent. (A moved write is queued a second time; whichever entry is
        taken first runs, the other is skipped.)"""
        with self._lock:
            self._floor[key] = min(urgency, self._floor.get(key, urgency))
            for write in self._pending.get(key, ()):
                if urgency < write.urgency:
                    if write.rank == _DEPLOYMENT_RANK:
                        self._sending[write.urgency] -= 1
                        self._sending[urgency] += 1
                    write.urgency = urgency
                    self._put(write)

    def settle(self, key: Hashable) -> None:
        """`key`'s pass is over: its next one sends with its own urgency."""
        with self._lock:
            self._floor.pop(key, None)

    def _put(self, write: _Write) -> None:
        entry = (write.urgency, write.rank, next(self._order), write)
        heapq.heappush(self._queues[write.queue], entry)
        for name, crew in self._crews.items():
            if write.queue in crew.kinds:
                self._ready[name].notify()

    def _start(self) -> None:
        with self._lock:
            if self._started:
                return
            for name, crew in self._crews.items():
                for index in range(crew.threads):
                    threading.Thread(
                        target=self._serve, args=(name,), name=f"kvq-write-{name}_{index}",
                        daemon=True,
                    ).start()  # fmt: skip
            self._started = True

    def _take(self, crew: Crew) -> _Write | None:
        """The most urgent write of the crew's queues not yet taken, and not held (lock
        held)."""
        queues = [self._queues[kind] for kind in crew.kinds]
        for queue in queues:
            while queue and _taken(queue[0][3]):
                heapq.heappop(queue)  # taken already by its other entry
        heads = [q[0] for q in queues if q]
        if not heads:
            return None
        now = time.monotonic()
        first = min(heads)[3]
        if not self._held(first, now):
            return first
        # Held: the best write behind it that may go (a Deployment, or a write that waited
        # long enough); taken from inside its queue, its entry is skipped when it surfaces.
        free = [e for q in queues for e in q if not _taken(e[3]) and not self._held(e[3], now)]
        return min(free)[3] if free else None

    def _held(self, write: _Write, now: float) -> bool:
        """Held back for a Deployment of a pass as urgent or more: the API server shares
        its CPU among the requests it serves, so a burst's ConfigMaps, Services and status
        writes sent beside its Deployments slow each of them down. Never for longer than
        the hold's seconds, so status does not lag behind a long rollout."""
        if write.rank == _DEPLOYMENT_RANK or now - write.queued >= self._hold_seconds:
            return False
        return any(n > 0 for u, n in self._sending.items() if u <= write.urgency)

    def _next_release(self, crew: Crew) -> float | None:
        """Seconds until the first held write of the crew's queues goes anyway; None when
        none is held (lock held)."""
        now = time.monotonic()
        held = [
            e[3].queued
            for q in (self._queues[kind] for kind in crew.kinds)
            for e in q
            if not _taken(e[3]) and self._held(e[3], now)
        ]
        return max(min(held) + self._hold_seconds - now, 0.0) if held else None

    def _serve(self, name: str) -> None:
        crew, ready = self._crews[name], self._ready[name]
        while True:
            with self._lock:
                write = self._take(crew)
                while write is None:
                    ready.wait(self._next_release(crew))
                    write = self._take(crew)
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
            finally:
                if write.rank == _DEPLOYMENT_RANK:
                    self._sent(write)

    def _sent(self, write: _Write) -> None:
        with self._lock:
            self._sending[write.urgency] -= 1
            if self._sending[write.urgency] == 0:
                for ready in self._ready.values():
                    ready.notify_all()  # what it held may go


WRITES = Writers(
    {
        "shared": Crew(WRITERS, ("Deployment", ANY_KIND)),
        "deployments": Crew(DEPLOYMENT_WRITERS, ("Deployment",)),
        "services": Crew(SERVICE_WRITERS, ("Service",)),
    }
)


async def _each(
    work: Callable[[T], R],
    items: Iterable[T],
    kind: Callable[[T], str],
    urgency: int,
    key: Hashable | None,
) -> list[R]:
    """`work` on every item (a write of `kind(item)`), side by side in the writers' order;
    results in order, the first error raised."""
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
            lambda manifest: str(manifest["kind"]),
            urgency,
            key,
        )
        for result in results:
            (applied if result.written else unchanged).append(f"{result.kind}/{result.name}")
        gone = [(ref, by_name.get((ref.kind, ref.name))) for ref in plan.delete]
        removed = await _each(
            lambda pair: pair[1] is not None and delete_object(clients, pair[0], pair[1]),
            gone,
            lambda pair: pair[0].kind,
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
        WRITES.submit(urgency, "Event", partial(post_event, clients, isvc, event, now), key)
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
