"""Event-driven reconciling: one queue of services, a fixed pool of workers.

The standard controller loop (controller-runtime's): watch events only add a service's key
to the queue (kvq.handlers.workqueue: each key at most once, a crash before a change before
the rest); `workers` tasks take keys and run one pass each (observe on the event loop, read
and decide in a thread, then carry the plan out), so one service never has two passes at
once. Events come from the InferenceService itself, its pods and owned objects, and nodes
or GPU pods that change a pool the service runs on or waits for. A pass asks for its next
check (the Plan's `next_check`, or the resync, the safety net), a failed pass backs off
alone, so one broken service cannot starve the rest. A status-only change of an
InferenceService (kvq's own write) wakes nobody.

Each InferenceService has a kopf daemon: it registers the service (`serve`) while kopf
serves it, and ends when the object is deleted or when peering pauses this replica.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from kvq.api import keys
from kvq.handlers.indices import EngineKey
from kvq.handlers.workqueue import Priority, WorkQueue
from kvq.placement.discovery import GpuPod, gpu_pod, node_fingerprint

log = logging.getLogger("kvq.controller")

DEFAULT_RESYNC = timedelta(minutes=10)
# Passes at once. A pass mostly waits for its writes (kvq.k8s.writers sends WRITERS at a
# time), not on the CPU, so this is sized for a fleet's burst of new services: every one
# of them decided and its Deployment queued ahead of the rest. make bench, 1,000 services
# (README): 1,024 workers, the last of 900 new Deployments 16.1 s after the burst; 64,
# 115.7 s (each new service waited in the queue for a worker).
DEFAULT_WORKERS = 1024

# Threads that read and decide. Deciding is CPU work under one GIL, so more threads than
# the cores would only take the event loop's turns (kopf's watches, the writes' answers);
# a few more cover the reads a pass makes (discovery, Prometheus, a crashed engine's log).
DECIDING = 16

# A stale view (409) is redone soon: the watch has the newer object by then.
CONFLICT_RETRY_SECONDS = 0.5


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


@dataclass(eq=False)
class Service:
    """One served InferenceService: how its passes observe, decide and carry out."""

    uid: str
    observe: Callable[[], Any]
    """Runs on the event loop: copies what the watch caches hold for it."""
    decide: Callable[[Any], Any]
    """Runs on a worker thread with what `observe` returned."""
    carry_out: Callable[[Any, int], Awaitable[PassResult]]
    """Awaited with the decision and the pass's priority (its writes' urgency)."""
    ended: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class Controller:
    """The queue, the workers, and who wakes whom."""

    workers: int = DEFAULT_WORKERS
    resync: timedelta = DEFAULT_RESYNC
    pool_labels: tuple[str, ...] = ()
    queue: WorkQueue[EngineKey] = field(default_factory=WorkQueue)
    _services: dict[EngineKey, Service] = field(default_factory=dict)
    _pools: dict[EngineKey, str | None] = field(default_factory=dict)
    _watchers: set[EngineKey] = field(default_factory=set)
    _node_watchers: set[EngineKey] = field(default_factory=set)
    _nodes: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    _gpu_pods: dict[str, GpuPod | None] = field(default_factory=dict)
    _seen: dict[EngineKey, tuple[Any, ...]] = field(default_factory=dict)
    _gone: set[str] = field(default_factory=set)
    """uids deleted from the cluster while a pass of theirs runs."""
    on_gone: Callable[[EngineKey, str], None] | None = None
    """Called once a deleted service has no pass left (forget what was kept for it)."""
    promote_writes: Callable[[EngineKey, int], None] | None = None
    """Moves a service's writes already waiting for a writer up to an urgency."""
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None
    """The loop the workers run on (set with the first service served)."""
    _threads: ThreadPoolExecutor | None = None

    def start(self) -> None:
        """The threads that decide (the workers start with the first service served, on
        the event loop that serves it)."""
        threads = min(self.workers, DECIDING)
        self._threads = ThreadPoolExecutor(threads, thread_name_prefix="kvq-decide")

    def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)

    # --- what wakes whom -----------------------------------------------------------------

    def notify(self, key: EngineKey, priority: Priority = Priority.ROUTINE) -> None:
        """Something about `key` changed: reconcile it soon."""
        if key not in self._services:
            return  # no daemon (yet, or any more): its first pass reads everything anyway
        self.queue.add(key, priority)
        if priority < Priority.ROUTINE and self.promote_writes is not None:
            # A pass of it carrying a plan out now: its writes go first, then the next pass.
            self.promote_writes(key, int(priority))

    def write_settled(self, key: Hashable, failed: bool) -> None:
        """A write that went on after its pass ended (k8s.executor.Detached): failed, so
        the service is reconciled again after its back-off, or asked for again meanwhile,
        so at once. Called from a writer thread."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._after_settled, key, failed)

    def _after_settled(self, key: Hashable, failed: bool) -> None:
        if key not in self._services:
            return  # deleted meanwhile
        if failed:
            self.queue.add_rate_limited(key)
        else:
            self.notify(key)

    def notify_many(self, keys_: Iterable[EngineKey]) -> None:
        for key in keys_:
            self.notify(key)

    def deleted(self, key: EngineKey, uid: str) -> None:
        """The InferenceService is gone from the cluster: it is served no more, and a pass
        of it that runs now writes nothing (nothing holds the object back: kvq puts no
        finalizer on it)."""
        service = self._services.get(key)
        if service is None or service.uid != uid:
            return  # not served (or a newer incarnation already is)
        self._gone.add(uid)
        if not self.queue.processing(key):
            self._end(key, service)
        # else the worker ends it once its pass is over

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

    # --- serving ---------------------------------------------------------------------------

    async def serve(
        self,
        key: EngineKey,
        observe: Callable[[], Any],
        decide: Callable[[Any], Any],
        carry_out: Callable[[Any, int], Awaitable[PassResult]],
        uid: str = "",
    ) -> None:
        """Serve `key` (the object `uid`) until it is deleted, a pass finds it gone, or this
        is cancelled (kopf stops the daemon when peering pauses this replica)."""
        service = self.register(key, observe, decide, carry_out, uid)
        try:
            await service.ended.wait()
        finally:
            self._retire(key, service)

    def register(
        self,
        key: EngineKey,
        observe: Callable[[], Any],
        decide: Callable[[Any], Any],
        carry_out: Callable[[Any, int], Awaitable[PassResult]],
        uid: str = "",
    ) -> Service:
        """Serve `key` from now on, its first pass ahead of routine ones."""
        if not self._tasks:
            loop = self._loop = asyncio.get_running_loop()
            self._tasks = [loop.create_task(self._work()) for _ in range(self.workers)]
        older = self._services.get(key)
        if older is not None:
            if older.uid != uid:
                self.deleted(key, older.uid)  # deleted and created again under its name
            self._retire(key, older)
        service = self._services[key] = Service(uid, observe, decide, carry_out)
        self.queue.add(key, Priority.CHANGE)
        return service

    async def _work(self) -> None:
        while True:
            key, priority = await self.queue.get()
            try:
                await self._pass(key, priority)
            except Exception:  # never lose a worker
                log.exception("the pass of %s/%s ended unexpectedly", *key)
            finally:
                self.queue.done(key)

    async def _pass(self, key: EngineKey, priority: Priority) -> None:
        service = self._services.get(key)
        if service is None:
            return
        result = await self._run(key, service, priority)
        if service.uid in self._gone:
            self._end(key, service)
            return
        if self._services.get(key) is not service:
            return  # stopped (or replaced) while it ran
        if result is None:
            # The retry of a crash's or a change's pass keeps its place.
            self.queue.add_rate_limited(key, priority)
            return
        self.queue.forget(key)
        if result.gone:
            self._retire(key, service)
            return
        self._remember(key, result)
        resync = self.resync.total_seconds()
        if result.conflict:
            self.queue.add_after(key, CONFLICT_RETRY_SECONDS, priority)
        elif result.recheck_after is not None:
            self.queue.add_after(key, min(max(result.recheck_after.total_seconds(), 0.1), resync))
        else:
            self.queue.add_after(key, resync)

    async def _run(self, key: EngineKey, service: Service, priority: Priority) -> PassResult | None:
        try:
            observed = service.observe()  # at the pass's start: the freshest view
            loop = asyncio.get_running_loop()
            decided = await loop.run_in_executor(self._threads, service.decide, observed)
            if service.uid in self._gone:
                return PassResult(gone=True)  # deleted meanwhile: nothing to write for it
            return await service.carry_out(decided, int(priority))
        except Exception:
            log.exception("reconcile of %s/%s failed; retrying with a back-off", *key)
            return None

    def _end(self, key: EngineKey, service: Service) -> None:
        """A deleted service's last pass is over: forget what was kept for it."""
        self._gone.discard(service.uid)
        self._retire(key, service)
        if self.on_gone is not None:
            self.on_gone(key, service.uid)

    def _retire(self, key: EngineKey, service: Service) -> None:
        service.ended.set()
        if self._services.get(key) is service:
            del self._services[key]
            self.queue.remove(key)
            self._forget(key)

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
        self._pools.pop(key, None)
        self._watchers.discard(key)
        self._node_watchers.discard(key)
        self._seen.pop(key, None)


def owner_of(labels: Mapping[str, str], namespace: str | None) -> EngineKey | None:
    owner = labels.get(keys.LABEL_INFERENCESERVICE)
    return (namespace, owner) if owner and namespace else None
