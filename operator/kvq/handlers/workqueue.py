"""The reconcile queue: client-go's workqueue (what controller-runtime reconciles from) on
asyncio.

A key (one InferenceService) is queued at most once: the events that arrive while it waits
fold into that one pass, and a key added while its pass runs is queued again when the pass
is done, so a rollout's burst of events costs at most two passes and no timer. Keys are
taken most urgent first (a crashed engine, then a person's change, then everything else),
in arrival order among equals. A failed pass is retried after a back-off of its own (1 s,
2 s, 4 s, ... 5 min; reset by a pass that succeeds), and a pass may ask to run again after
a while (`add_after`: the Plan's next check).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass
from enum import IntEnum
from typing import Generic, TypeVar

from kvq.metrics import QUEUE_DEPTH, QUEUE_WAIT_SECONDS, WORK_SECONDS

K = TypeVar("K", bound=Hashable)

BACKOFF_START = 1.0
BACKOFF_MAX = 300.0


class Priority(IntEnum):
    """Why a key is queued; the lowest value is taken first."""

    FAILURE = 0
    """An engine crashed: nobody is served, and its pass may move the fallback ladder."""
    CHANGE = 1
    """A new InferenceService, or its spec changed: a person who applied it watches."""
    ROUTINE = 2
    """Everything else: owned objects, pods, nodes, timers."""


@dataclass(frozen=True)
class _Waiting:
    priority: Priority
    order: int
    since: float


class WorkQueue(Generic[K]):
    """Keys waiting for a worker, each at most once (see the module's docstring).

    A worker takes a key with `get`, reconciles it, and calls `done`; no two workers hold
    one key at once."""

    def __init__(self, backoff_start: float = BACKOFF_START, backoff_max: float = BACKOFF_MAX):
        self._backoff = (backoff_start, backoff_max)
        self._heap: list[tuple[int, int, K]] = []
        self._waiting: dict[K, _Waiting] = {}
        self._processing: dict[K, float] = {}
        self._dirty: dict[K, Priority] = {}
        """Keys added while their pass ran: queued again when it is done."""
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._failures: dict[K, int] = {}
        self._getters: deque[asyncio.Future[None]] = deque()
        self._order = itertools.count()

    # --- adding ------------------------------------------------------------------------

    def add(self, key: K, priority: Priority = Priority.ROUTINE) -> None:
        """Reconcile `key` soon. Already queued: it keeps its one place, moved up if
        `priority` is more urgent (last among its new equals)."""
        if key in self._processing:
            self._dirty[key] = min(priority, self._dirty.get(key, priority))
            return
        waiting = self._waiting.get(key)
        if waiting is not None and waiting.priority <= priority:
            return
        since = waiting.since if waiting is not None else time.monotonic()
        entry = _Waiting(priority, next(self._order), since)
        self._waiting[key] = entry  # an earlier heap entry of the key is skipped when popped
        heapq.heappush(self._heap, (entry.priority, entry.order, key))
        QUEUE_DEPTH.set(len(self._waiting))
        self._wake_one()

    def add_after(self, key: K, delay: float, priority: Priority = Priority.ROUTINE) -> None:
        """`add(key, priority)` in `delay` seconds. A key has one timer: a later call
        replaces it (the newest pass's next check is the one that counts)."""
        self._cancel_timer(key)
        loop = asyncio.get_running_loop()
        self._timers[key] = loop.call_later(max(delay, 0.0), self._fire, key, priority)

    def add_rate_limited(self, key: K, priority: Priority = Priority.ROUTINE) -> float:
        """`key`'s pass failed: add it again after its back-off (doubled each failure until
        `forget`). Returns the back-off."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        start, most = self._backoff
        delay = min(start * 2.0**failures, most)
        self.add_after(key, delay, priority)
        return delay

    def forget(self, key: K) -> None:
        """`key`'s pass succeeded: its next failure backs off from the start again."""
        self._failures.pop(key, None)

    def remove(self, key: K) -> None:
        """Nothing more for `key` (its service is gone): unqueued, no timer, no retry. A
        pass of it that runs now still ends with `done`."""
        self._cancel_timer(key)
        self._failures.pop(key, None)
        self._dirty.pop(key, None)
        if self._waiting.pop(key, None) is not None:
            QUEUE_DEPTH.set(len(self._waiting))

    # --- taking ------------------------------------------------------------------------

    async def get(self) -> tuple[K, Priority]:
        """The most urgent waiting key (waits for one), now held by the caller."""
        while not self._waiting:
            waiter = asyncio.get_running_loop().create_future()
            self._getters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter in self._getters:
                    self._getters.remove(waiter)
                elif self._waiting:
                    self._wake_one()  # woken just as it was cancelled: wake another
                raise
        while True:
            _, order, key = heapq.heappop(self._heap)
            waiting = self._waiting.get(key)
            if waiting is not None and waiting.order == order:
                break  # else a stale entry: the key was moved up, or removed
        del self._waiting[key]
        now = time.monotonic()
        self._processing[key] = now
        QUEUE_DEPTH.set(len(self._waiting))
        QUEUE_WAIT_SECONDS.observe(now - waiting.since)
        return key, waiting.priority

    def done(self, key: K) -> None:
        """The caller's pass of `key` is over: added during it, it is queued again."""
        began = self._processing.pop(key, None)
        if began is not None:
            WORK_SECONDS.observe(time.monotonic() - began)
        dirty = self._dirty.pop(key, None)
        if dirty is not None:
            self.add(key, dirty)

    # --- what tests and logs read ------------------------------------------------------

    def queued(self, key: K) -> Priority | None:
        """The priority `key` waits with (or will be queued with once its pass is done)."""
        waiting = self._waiting.get(key)
        return waiting.priority if waiting is not None else self._dirty.get(key)

    def processing(self, key: K) -> bool:
        return key in self._processing

    @property
    def depth(self) -> int:
        return len(self._waiting)

    @property
    def idle_workers(self) -> int:
        """Callers waiting in `get` for a key."""
        return sum(not waiter.done() for waiter in self._getters)

    def has_timer(self, key: K) -> bool:
        return key in self._timers

    # --- inside ------------------------------------------------------------------------

    def _fire(self, key: K, priority: Priority) -> None:
        self._timers.pop(key, None)
        self.add(key, priority)

    def _cancel_timer(self, key: K) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    def _wake_one(self) -> None:
        while self._getters:
            waiter = self._getters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
