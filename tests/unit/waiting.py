"""Waiting in asyncio tests: on a condition, with a deadline, never for a fixed time."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

DEADLINE_S = 5.0


async def until(condition: Callable[[], bool], what: str) -> None:
    """Let the other tasks run until `condition` holds, failing after DEADLINE_S."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {DEADLINE_S} s waiting for {what}")
        await next_turn()


async def next_turn() -> None:
    """Let every other ready task run once."""
    turn = asyncio.get_running_loop().create_future()
    turn.get_loop().call_soon(turn.set_result, None)
    await turn
