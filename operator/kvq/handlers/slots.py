"""Admission to the reconcile workers: at most N at once, what a person is waiting for first.

A new InferenceService, or one whose spec just changed, waits behind no follow-up pass
(a Deployment's status moving, a pod becoming ready): during a fleet's rollout those are
most of the queue, and a person who applied something watches for its Deployment. Among
equals, arrival order.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class Slots:
    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"slots: size {size} < 1")
        self._free = size
        self._urgent: deque[asyncio.Future[None]] = deque()
        self._routine: deque[asyncio.Future[None]] = deque()

    @asynccontextmanager
    async def held(self, *, urgent: bool) -> AsyncIterator[None]:
        await self._acquire(urgent)
        try:
            yield
        finally:
            self._release()

    @property
    def waiting(self) -> int:
        return sum(not f.done() for f in (*self._urgent, *self._routine))

    async def _acquire(self, urgent: bool) -> None:
        if self._free > 0 and not self.waiting:
            self._free -= 1
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        (self._urgent if urgent else self._routine).append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self._release()  # handed a slot just as it was cancelled: pass it on
            raise

    def _release(self) -> None:
        for queue in (self._urgent, self._routine):
            while queue:
                turn = queue.popleft()
                if not turn.done():
                    turn.set_result(None)
                    return
        self._free += 1
