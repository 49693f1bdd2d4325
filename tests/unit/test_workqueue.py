"""The reconcile queue (client-go's workqueue): a key queued at most once, queued again
when added during its pass, a crash before a change before the rest, per-key back-off,
and a pass's next check."""

from __future__ import annotations

import asyncio

from kvq.handlers.workqueue import Priority, WorkQueue
from tests.unit.waiting import until


def _drain(queue: WorkQueue[str]) -> list[tuple[str, Priority]]:
    async def scenario() -> list[tuple[str, Priority]]:
        taken = []
        while queue.depth:
            key, priority = await queue.get()
            queue.done(key)
            taken.append((key, priority))
        return taken

    return asyncio.run(scenario())


def test_a_burst_of_events_for_one_service_is_one_pass() -> None:
    queue: WorkQueue[str] = WorkQueue()
    for _ in range(5):
        queue.add("a")
    queue.add("b")
    assert _drain(queue) == [("a", Priority.ROUTINE), ("b", Priority.ROUTINE)]


def test_a_crash_then_a_change_then_the_rest_in_arrival_order() -> None:
    queue: WorkQueue[str] = WorkQueue()
    queue.add("pod-a")
    queue.add("new-b", Priority.CHANGE)
    queue.add("crash-c")
    queue.add("pod-d")
    queue.add("crash-c", Priority.FAILURE)  # its engine crashed while it waited: moved up
    queue.add("new-b")  # never moved down
    assert _drain(queue) == [
        ("crash-c", Priority.FAILURE),
        ("new-b", Priority.CHANGE),
        ("pod-a", Priority.ROUTINE),
        ("pod-d", Priority.ROUTINE),
    ]


def test_a_key_added_during_its_pass_runs_again_after_it_never_beside_it() -> None:
    async def scenario() -> list[str]:
        queue: WorkQueue[str] = WorkQueue()
        passes: list[str] = []
        release = asyncio.Event()

        async def worker(name: str) -> None:
            while True:
                key, priority = await queue.get()
                passes.append(f"{name}:{key}:{priority.name}")
                await release.wait()
                queue.done(key)

        workers = [asyncio.create_task(worker(n)) for n in ("w1", "w2")]
        queue.add("a")
        await until(lambda: len(passes) == 1 and queue.idle_workers == 1, "a's pass")
        queue.add("a")  # events during the pass: one more pass, after it
        queue.add("a", Priority.FAILURE)
        assert queue.depth == 0 and queue.queued("a") == Priority.FAILURE
        release.set()
        await until(lambda: len(passes) == 2 and queue.idle_workers == 2, "a's second pass")
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        return [p.split(":", 1)[1] for p in passes]

    assert asyncio.run(scenario()) == ["a:ROUTINE", "a:FAILURE"]


def test_failures_back_off_per_key_and_a_success_resets_it() -> None:
    async def scenario() -> list[float]:
        queue: WorkQueue[str] = WorkQueue(backoff_start=1.0, backoff_max=5.0)
        delays = [queue.add_rate_limited("a") for _ in range(5)]
        assert queue.has_timer("a") and queue.depth == 0  # waits for its back-off
        assert queue.add_rate_limited("b") == 1.0  # another key backs off on its own
        queue.forget("a")
        delays.append(queue.add_rate_limited("a"))
        queue.remove("a")
        queue.remove("b")
        assert not queue.has_timer("a") and not queue.has_timer("b")
        return delays

    assert asyncio.run(scenario()) == [1.0, 2.0, 4.0, 5.0, 5.0, 1.0]


def test_a_next_check_queues_the_key_then_and_the_newest_one_counts() -> None:
    async def scenario() -> tuple[str, Priority]:
        queue: WorkQueue[str] = WorkQueue()
        queue.add_after("a", 3600.0)  # an earlier pass's next check
        queue.add_after("a", 0.0, Priority.CHANGE)  # the newest pass's: now
        key, priority = await asyncio.wait_for(queue.get(), timeout=5)
        queue.done(key)
        assert not queue.has_timer("a")  # the hour's timer was replaced, not kept
        return key, priority

    assert asyncio.run(scenario()) == ("a", Priority.CHANGE)


def test_a_removed_key_is_not_taken_and_a_cancelled_worker_loses_no_key() -> None:
    async def scenario() -> list[str]:
        queue: WorkQueue[str] = WorkQueue()
        waiting = asyncio.create_task(queue.get())
        await until(lambda: queue.idle_workers == 1, "the worker to wait")
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
        queue.add("gone")
        queue.add("kept")
        queue.remove("gone")
        key, _ = await asyncio.wait_for(queue.get(), timeout=5)
        queue.done(key)
        return [key, str(queue.depth)]

    assert asyncio.run(scenario()) == ["kept", "0"]
