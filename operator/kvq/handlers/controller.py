"""Event-driven reconciling: one loop per InferenceService, woken by what changed.

Each InferenceService has a kopf daemon (kopf starts it when the object appears, stops it
when the object goes or when peering pauses this replica). The daemon waits for its
signal, then runs one reconcile in a worker thread. Signals come from watch events: the
InferenceService itself, its pods and owned objects, and nodes or GPU pods that change a
pool the service runs on or waits for. A slow resync (minutes) is the safety net; a
decision that depends on time (a grace period, a back-off, metrics) asks for its own next
pass. A routine wake-up waits COALESCE_SECONDS for more events (a rollout's pod and
Deployment events become one pass); a crash, a spec change or a deletion cuts the wait
short. A pass decides, then carries its plan out: at most `workers` decide and CARRYING
carry out at once, each stage admitting by priority (a crashed engine first, then a new
service or a spec change, then in arrival order: kvq.handlers.slots), and the plans'
writes are sent by the executor's writers in the same order of urgency, so new decisions
never wait for other passes' writes. A failing service backs off alone, so one broken service cannot
starve the rest. A status-only change of an InferenceService (kvq's own write) wakes
nobody.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar

from kvq.api import keys
from kvq.handlers.indices import EngineKey
from kvq.handlers.slots import Priority, Slots
from kvq.metrics import ADMISSION_WAIT_SECONDS, CARRY_OUT_SECONDS, QUEUE_WAIT_SECONDS
from kvq.placement.discovery import GpuPod, gpu_pod, node_fingerprint

log = logging.getLogger("kvq.controller")
T = TypeVar("T")
D = TypeVar("D")

DEFAULT_RESYNC = timedelta(minutes=10)
DEFAULT_WORKERS = 16
# Plans carried out at once (their writes queued by urgency at the executor's writers).
# More than a fleet's burst of new services, so all their Deployments are queued ahead of
# the rest (at 128, 900 new services waited for Deployments p50 46 s, at 1024 3.8 s: make
# bench); bounded so that a rollout does not hold a plan (about 50 KB) for every service.
CARRYING = 1024

# A routine wake-up (an owned object's or a pod's status moving) waits this long for more
# before its pass: a rollout's burst of pod and Deployment events becomes one pass and one
# status write, not one per event. A crash, a spec change or a deletion never waits.
COALESCE_SECONDS = 2.0
# A stale view (409) is redone soon: the watch has the newer object by then.
CONFLICT_RETRY_SECONDS = 0.5
# Unexpected errors back off per service: 1 s, 2 s, 4 s, ... at most 5 min.
ERROR_BACKOFF_START = 1.0
ERROR_BACKOFF_MAX = 300.0


@dataclass(frozen=True)
class PassResult:
    """What the controller needs to know after one reconcile of a service."""

    recheck_after: timedelta | None = None
    """Run again after this long even if nothing changes."""
    pool: str | None = None
    """The pool the service runs on (node changes there wake it)."""
    watches_capacity: bool = False
    """The service waits for GPUs (not placed yet, a fallback for lack of room, or the pool
    caps its autoscaling): GPUs taken or freed on any pool wake it."""
    watches_nodes: bool = False
    """The service runs a fallback that new or changed nodes may end (a pool that can run
    the requested dtype): any GPU node's change wakes it."""
    conflict: bool = False
    """The view was stale: run again shortly."""
    gone: bool = False


@dataclass
class Controller:
    """Signals, fan-out and the worker pool, shared by every service's daemon."""

    workers: int = DEFAULT_WORKERS
    resync: timedelta = DEFAULT_RESYNC
    pool_labels: tuple[str, ...] = ()
    _signals: dict[EngineKey, asyncio.Event] = field(default_factory=dict)
    _changed_at: dict[EngineKey, float] = field(default_factory=dict)
    _pools: dict[EngineKey, str | None] = field(default_factory=dict)
    _watchers: set[EngineKey] = field(default_factory=set)
    _node_watchers: set[EngineKey] = field(default_factory=set)
    _nodes: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    _gpu_pods: dict[str, GpuPod | None] = field(default_factory=dict)
    _priority: dict[EngineKey, Priority] = field(default_factory=dict)
    """The most urgent reason each waiting service has for its next pass."""
    _urgent: dict[EngineKey, asyncio.Event] = field(default_factory=dict)
    """Set when a service's pass should not wait any longer for more events."""
    coalesce: float = COALESCE_SECONDS
    settling: set[EngineKey] = field(default_factory=set)
    """Services whose loop waits for more routine events before its pass."""
    _seen: dict[EngineKey, tuple[Any, ...]] = field(default_factory=dict)
    _incarnations: dict[EngineKey, str] = field(default_factory=dict)
    """The uid each key's loop serves: a service deleted and created again under its name
    is another object, and its old loop must not act for it."""
    _gone: set[str] = field(default_factory=set)
    """uids deleted from the cluster while their loop runs."""
    on_gone: Callable[[EngineKey, str], None] | None = None
    """Called once a deleted service's loop has ended (forget what was kept for it)."""
    _slots: Slots | None = None
    """Admission to deciding: at most `workers` at once."""
    _carrying: Slots | None = None
    """Admission to carrying a plan out: at most CARRYING at once."""
    _threads: ThreadPoolExecutor | None = None
    promote_writes: Callable[[EngineKey, int], None] | None = None
    """Moves a service's writes already waiting for a writer up to an urgency."""

    def start(self) -> None:
        """Create the loop-bound parts (call from the operator's event loop)."""
        self._slots = Slots(self.workers)
        self._carrying = Slots(CARRYING)
        self._threads = ThreadPoolExecutor(self.workers, thread_name_prefix="kvq-reconcile")

    def stop(self) -> None:
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)

    # --- signals -------------------------------------------------------------------------

    def notify(self, key: EngineKey, priority: Priority = Priority.ROUTINE) -> None:
        """Something about `key` changed: reconcile it soon."""
        signal = self._signals.get(key)
        if signal is None:
            return  # no daemon (yet, or any more): its first pass reads everything anyway
        self._changed_at.setdefault(key, time.monotonic())
        if self._slots is not None and self._slots.promote(key, priority):
            # Its pass waits for a worker and reads the caches once admitted: it sees this
            # change too, now with the more urgent of the two priorities.
            return
        # A plan decided before this change: carried out first, then the next pass.
        if self._carrying is not None:
            self._carrying.promote(key, priority)
        if self.promote_writes is not None:
            self.promote_writes(key, int(priority))
        self._priority[key] = min(priority, self._priority.get(key, Priority.ROUTINE))
        signal.set()
        if priority < Priority.ROUTINE:
            self._hurry(key)

    def _hurry(self, key: EngineKey) -> None:
        urgent = self._urgent.get(key)
        if urgent is not None:
            urgent.set()

    def notify_many(self, keys_: Iterable[EngineKey]) -> None:
        for key in keys_:
            self.notify(key)

    def deleted(self, key: EngineKey, uid: str) -> None:
        """The InferenceService is gone from the cluster: its loop ends without acting
        again (nothing holds the object back: kvq puts no finalizer on it)."""
        if self._incarnations.get(key) != uid:
            return  # no loop serves it (or a newer incarnation already does)
        self._gone.add(uid)
        signal = self._signals.get(key)
        if signal is not None:
            signal.set()
            self._hurry(key)

    def isvc_changed(self, key: EngineKey, body: Mapping[str, Any]) -> None:
        """An InferenceService event: its spec, metadata or deletion, not its status (what
        kvq itself writes: reading its own write back would only cost a pass)."""
        meta = body.get("metadata") or {}
        seen = (
            meta.get("generation"),
            meta.get("deletionTimestamp"),
            tuple(sorted((meta.get("labels") or {}).items())),
            tuple(sorted((meta.get("annotations") or {}).items())),
        )
        before = self._seen.get(key)
        self._seen[key] = seen
        if before == seen:
            return
        new_spec = before is None or before[0] != seen[0]
        self.notify(key, Priority.CHANGE if new_spec else Priority.ROUTINE)

    def node_changed(self, name: str, body: Mapping[str, Any] | None) -> None:
        """A node event: wake the services its pool matters to, if placement would notice."""
        before = self._nodes.get(name)
        after = node_fingerprint(body, self.pool_labels) if body is not None else None
        if after is None:
            self._nodes.pop(name, None)
        else:
            self._nodes[name] = after
        if before == after:
            return  # a heartbeat, an image list: nothing placement reads
        pools = {f[0] for f in (before, after) if f is not None}
        self.notify_many(self._placed_on(pools) | self._watchers | self._node_watchers)

    def pod_changed(self, uid: str, body: Mapping[str, Any] | None) -> None:
        """A pod event: GPUs taken or freed change what fits where."""
        before = self._gpu_pods.get(uid)
        after = gpu_pod(body) if body is not None else None
        if after is None:
            self._gpu_pods.pop(uid, None)
        else:
            self._gpu_pods[uid] = after
        if before == after:
            return
        # Only the services waiting for GPUs: a placed service stays on its pool (its own
        # pods' events wake it), so waking every service of the pool on every pod would
        # make a fleet's rollout quadratic.
        nodes = {p.node for p in (before, after) if p is not None}
        if any(n in self._nodes for n in nodes):
            self.notify_many(self._watchers)

    def _placed_on(self, pools: set[str]) -> set[EngineKey]:
        return {
            key
            for key, pool in self._pools.items()
            if pool is not None and any(pool == p or pool.startswith(f"{p}-") for p in pools)
        }

    # --- the per-service loop ------------------------------------------------------------

    async def serve(
        self,
        key: EngineKey,
        observe: Callable[[], T],
        decide: Callable[[T], D],
        carry_out: Callable[[D, int], Awaitable[PassResult]],
        uid: str = "",
    ) -> None:
        """Reconcile `key` (the object `uid`) whenever it is signalled, until it is deleted
        or the loop is cancelled (kopf stops the daemon when peering pauses this replica).

        `observe` runs on the event loop (it copies the watch caches); `decide` runs on a
        worker thread with what `observe` returned, then `carry_out` is awaited with the
        decision and the pass's priority (its writes' urgency: the writers take the most
        urgent first). A pass of one service ends before its next begins.
        """
        older = self._incarnations.get(key)
        if older is not None and older != uid:
            self.deleted(key, older)  # its loop ends; this one takes the key over
        self._incarnations[key] = uid
        signal = self._signals[key] = asyncio.Event()
        urgent = self._urgent[key] = asyncio.Event()
        signal.set()  # the first pass at once, ahead of routine passes
        self._priority[key] = Priority.CHANGE
        self._changed_at.setdefault(key, time.monotonic())
        wait: float | None = None
        backoff = ERROR_BACKOFF_START
        try:
            while True:
                timeout = min(wait, self.resync.total_seconds()) if wait else None
                timeout = timeout if timeout is not None else self.resync.total_seconds()
                signalled = False
                with contextlib.suppress(TimeoutError):
                    signalled = await asyncio.wait_for(signal.wait(), timeout=timeout)
                if signalled:
                    await self._coalesce(key, urgent)
                urgent.clear()
                if uid in self._gone:
                    return
                signal.clear()
                priority = self._priority.pop(key, Priority.ROUTINE)
                result = await self._run(key, uid, priority, observe, decide, carry_out)
                if result is None or result.conflict:
                    # The retry of a crash's or a change's pass keeps its place.
                    self._priority[key] = min(priority, self._priority.get(key, priority))
                if result is None:
                    wait, backoff = backoff, min(backoff * 2, ERROR_BACKOFF_MAX)
                    continue
                backoff = ERROR_BACKOFF_START
                if result.gone:
                    return
                self._remember(key, result)
                if result.conflict:
                    wait = CONFLICT_RETRY_SECONDS
                elif result.recheck_after is not None:
                    wait = max(result.recheck_after.total_seconds(), 0.1)
                else:
                    wait = None
        finally:
            if uid in self._gone:
                self._gone.discard(uid)
                if self.on_gone is not None:
                    self.on_gone(key, uid)
            if self._incarnations.get(key) == uid:
                self._forget(key)

    async def _coalesce(self, key: EngineKey, urgent: asyncio.Event) -> None:
        """Woken by routine events only: wait a little for more (a timer's pass is due now,
        and a crash, a spec change or a deletion sets `urgent`)."""
        if self.coalesce <= 0 or self._priority.get(key, Priority.ROUTINE) is not Priority.ROUTINE:
            return
        self.settling.add(key)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(urgent.wait(), timeout=self.coalesce)
        self.settling.discard(key)

    async def _run(
        self,
        key: EngineKey,
        uid: str,
        priority: Priority,
        observe: Callable[[], T],
        decide: Callable[[T], D],
        carry_out: Callable[[D, int], Awaitable[PassResult]],
    ) -> PassResult | None:
        assert self._slots is not None and self._carrying is not None, "start() not called"
        loop = asyncio.get_running_loop()
        try:
            asked = time.monotonic()
            async with self._slots.held(priority, key):
                admitted = time.monotonic()
                ADMISSION_WAIT_SECONDS.observe(admitted - asked)
                changed = self._changed_at.pop(key, None)
                if changed is not None:
                    QUEUE_WAIT_SECONDS.observe(admitted - changed)
                observed = observe()  # after admission: the freshest view
                decided = await loop.run_in_executor(self._threads, decide, observed)
            if uid in self._gone:
                return PassResult(gone=True)  # deleted meanwhile: nothing to write for it
            async with self._carrying.held(priority, key):
                began = time.monotonic()
                try:
                    return await carry_out(decided, int(priority))
                finally:
                    CARRY_OUT_SECONDS.observe(time.monotonic() - began)
        except Exception:
            log.exception("reconcile of %s/%s failed; retrying with a back-off", *key)
            return None

    def _remember(self, key: EngineKey, result: PassResult) -> None:
        self._pools[key] = result.pool
        for watching, watchers in (
            (result.watches_capacity, self._watchers),
            (result.watches_nodes, self._node_watchers),
        ):
            if watching:
                watchers.add(key)
            else:
                watchers.discard(key)

    def _forget(self, key: EngineKey) -> None:
        self._incarnations.pop(key, None)
        self._signals.pop(key, None)
        self._urgent.pop(key, None)
        self.settling.discard(key)
        self._changed_at.pop(key, None)
        self._pools.pop(key, None)
        self._watchers.discard(key)
        self._node_watchers.discard(key)
        self._priority.pop(key, None)
        self._seen.pop(key, None)


def owner_of(labels: Mapping[str, str], namespace: str | None) -> EngineKey | None:
    owner = labels.get(keys.LABEL_INFERENCESERVICE)
    return (namespace, owner) if owner and namespace else None
