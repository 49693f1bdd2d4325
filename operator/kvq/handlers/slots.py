"""Admission to the reconcile workers: at most N at once, by priority, then arrival order.

During a fleet's rollout most of the queue is follow-up passes (a Deployment's status
moving, a pod becoming ready). A crashed engine serves nobody and its pass may move the
fallback ladder, so it goes first; then a new InferenceService or a spec change, which a
person who applied it watches; then the rest.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager
from enum import IntEnum


class Priority(IntEnum):
    FAILURE = 0
    """An engine crashed."""
    CHANGE = 1
    """A new InferenceService, or its spec changed."""
    ROUTINE = 2
    """Everything else: owned objects, pods, nodes, timers."""


class Slots:
    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"slots: size {size} < 1")
        self._free = size
        self._queues: tuple[deque[asyncio.Future[None]], ...] = tuple(deque() for _ in Priority)
        self._queued: dict[Hashable, tuple[Priority, asyncio.Future[None]]] = {}

    @asynccontextmanager
    async def held(
        self, priority: Priority = Priority.ROUTINE, key: Hashable | None = None
    ) -> AsyncIterator[None]:
        """A slot, once the more urgent and earlier waiters have had theirs. A waiter with a
        `key` can be moved up while it waits (`promote`)."""
        await self._acquire(priority, key)
        try:
            yield
        finally:
            self._release()

    def queued(self, key: Hashable) -> Priority | None:
        """The priority `key` waits with; None when it does not wait."""
        found = self._queued.get(key)
        return found[0] if found is not None and not found[1].done() else None

    def promote(self, key: Hashable, priority: Priority) -> bool:
        """Move `key`'s waiting turn to a more urgent queue (its place among equals: last).
        A pass queued as routine when its engine crashes would otherwise wait behind every
        other routine pass. True when `key` waits (with `priority` now, or better)."""
        found = self._queued.get(key)
        if found is None or found[1].done():
            return False
        current, turn = found
        if priority < current:
            self._queues[current].remove(turn)
            self._queues[priority].append(turn)
            self._queued[key] = (priority, turn)
        return True

    @property
    def free(self) -> int:
        return self._free

    @property
    def waiting(self) -> int:
        return sum(not turn.done() for queue in self._queues for turn in queue)

    async def _acquire(self, priority: Priority, key: Hashable | None) -> None:
        if self._free > 0 and not self.waiting:
            self._free -= 1
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queues[priority].append(turn)
        if key is not None:
            self._queued[key] = (priority, turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self._release()  # handed a slot just as it was cancelled: pass it on
            raise
        finally:
            if key is not None and self._queued.get(key, (None, None))[1] is turn:
                del self._queued[key]

    def _release(self) -> None:
        for queue in self._queues:
            while queue:
                turn = queue.popleft()
                if not turn.done():
                    turn.set_result(None)
                    return
        self._free += 1
