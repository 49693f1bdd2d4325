"""Reconcile admission: bounded, a crash then a person's change first, arrival order among
equals, and a cancelled waiter never loses a slot."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial

import pytest

from kvq.handlers.slots import Priority, Slots

DEADLINE_S = 5.0


async def until(condition: Callable[[], bool], what: str) -> None:
    """Let the other tasks run until `condition` holds, failing after DEADLINE_S."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {DEADLINE_S} s waiting for {what}")
        await _next_turn()


def _queued(slots: Slots, count: int) -> bool:
    return slots.waiting == count


async def _next_turn() -> None:
    """Let every other ready task run once."""
    turn = asyncio.get_running_loop().create_future()
    turn.get_loop().call_soon(turn.set_result, None)
    await turn


async def _order_of_admission(slots: Slots, arrivals: list[tuple[str, Priority]]) -> list[str]:
    admitted: list[str] = []
    gate = asyncio.Event()

    async def holder() -> None:
        async with slots.held():
            await gate.wait()

    async def waiter(name: str, priority: Priority) -> None:
        async with slots.held(priority):
            admitted.append(name)

    first = asyncio.create_task(holder())
    await until(lambda: slots.free == 0, "the holder to take the only slot")
    tasks = []
    for queued, (name, priority) in enumerate(arrivals, start=1):
        tasks.append(asyncio.create_task(waiter(name, priority)))
        await until(partial(_queued, slots, queued), f"{name} queued")  # in this order
    assert admitted == []  # nobody passes while the slot is held
    gate.set()
    await asyncio.gather(first, *tasks)
    return admitted


def test_a_crash_then_a_change_a_person_waits_for_go_first_then_arrival_order() -> None:
    routine, change, failure = Priority.ROUTINE, Priority.CHANGE, Priority.FAILURE
    arrivals = [
        ("pod-a", routine),
        ("new-b", change),
        ("pod-c", routine),
        ("crash-e", failure),
        ("spec-d", change),
    ]
    admitted = asyncio.run(_order_of_admission(Slots(1), arrivals))
    assert admitted == ["crash-e", "new-b", "spec-d", "pod-a", "pod-c"]


def test_a_cancelled_waiter_hands_its_turn_on() -> None:
    async def scenario() -> list[str]:
        slots = Slots(1)
        admitted: list[str] = []
        gate = asyncio.Event()

        async def holder() -> None:
            async with slots.held():
                await gate.wait()

        async def waiter(name: str) -> None:
            async with slots.held():
                admitted.append(name)

        first = asyncio.create_task(holder())
        await until(lambda: slots.free == 0, "the holder to take the only slot")
        gone = asyncio.create_task(waiter("gone"))
        await until(lambda: slots.waiting == 1, "gone queued")
        kept = asyncio.create_task(waiter("kept"))
        await until(lambda: slots.waiting == 2, "kept queued")
        gone.cancel()
        gate.set()
        await first
        await asyncio.wait_for(kept, timeout=5)
        with pytest.raises(asyncio.CancelledError):
            await gone
        return admitted

    assert asyncio.run(scenario()) == ["kept"]


def test_no_more_than_its_size_at_once() -> None:
    async def scenario() -> int:
        slots = Slots(3)
        running = peak = 0

        async def work() -> None:
            nonlocal running, peak
            async with slots.held():
                running += 1
                peak = max(peak, running)
                await _next_turn()  # the others try to enter meanwhile
                running -= 1

        await asyncio.gather(*(work() for _ in range(20)))
        return peak

    assert asyncio.run(scenario()) == 3


def test_a_waiter_moved_up_goes_ahead_of_those_it_now_outranks() -> None:
    async def scenario() -> tuple[list[str], Priority | None]:
        slots = Slots(1)
        admitted: list[str] = []
        gate = asyncio.Event()

        async def holder() -> None:
            async with slots.held():
                await gate.wait()

        async def waiter(name: str, priority: Priority) -> None:
            async with slots.held(priority, key=name):
                admitted.append(name)

        first = asyncio.create_task(holder())
        await until(lambda: slots.free == 0, "the holder to take the only slot")
        tasks = []
        arrivals = [
            ("pod-a", Priority.ROUTINE),
            ("new-b", Priority.CHANGE),
            ("crash-c", Priority.ROUTINE),
        ]
        for queued, (name, priority) in enumerate(arrivals, start=1):
            tasks.append(asyncio.create_task(waiter(name, priority)))
            await until(partial(_queued, slots, queued), f"{name} queued")
        assert slots.promote("crash-c", Priority.FAILURE)  # its engine crashed meanwhile
        assert slots.promote("new-b", Priority.ROUTINE)  # waits; never moved down
        assert slots.queued("new-b") == Priority.CHANGE
        moved = slots.queued("crash-c")
        gate.set()
        await asyncio.gather(first, *tasks)
        assert slots.queued("crash-c") is None and not slots.promote("crash-c", Priority.FAILURE)
        return admitted, moved

    admitted, moved = asyncio.run(scenario())
    assert moved == Priority.FAILURE
    assert admitted == ["crash-c", "new-b", "pod-a"]
