"""Reconcile admission: bounded, a crash then a person's change first, arrival order among
equals, and a cancelled waiter never loses a slot."""

from __future__ import annotations

import asyncio

import pytest

from kvq.handlers.slots import Priority, Slots


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
    await asyncio.sleep(0)  # the holder takes the only slot
    tasks = []
    for name, priority in arrivals:
        tasks.append(asyncio.create_task(waiter(name, priority)))
        await asyncio.sleep(0)  # queued in this order
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
        await asyncio.sleep(0)
        gone = asyncio.create_task(waiter("gone"))
        await asyncio.sleep(0)
        kept = asyncio.create_task(waiter("kept"))
        await asyncio.sleep(0)
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
                await asyncio.sleep(0)
                running -= 1

        await asyncio.gather(*(work() for _ in range(20)))
        return peak

    assert asyncio.run(scenario()) == 3
