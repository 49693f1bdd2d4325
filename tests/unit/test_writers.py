"""The executor's writers: the most urgent write first, then by kind, then in order; a
write moved up while it waits runs once, at its new place."""

from __future__ import annotations

import threading

from kvq.k8s.executor import Writers

DEADLINE_S = 10.0


def test_urgent_writes_go_first_and_a_promoted_write_runs_once() -> None:
    writers = Writers(1)
    order: list[str] = []
    gate = threading.Event()
    busy = writers.submit(2, 0, lambda: gate.wait(DEADLINE_S))  # holds the only writer

    def write(name: str) -> str:
        order.append(name)
        return name

    routine = writers.submit(2, 2, lambda: write("status of a routine pass"), key="a")
    queued = [
        writers.submit(2, 0, lambda: write("routine Deployment")),
        writers.submit(1, 2, lambda: write("status of a new service")),
        writers.submit(1, 0, lambda: write("Deployment of a new service")),
        writers.submit(0, 3, lambda: write("event of a crashed engine's fallback")),
    ]
    writers.promote("a", 0)  # its engine crashed while the write waited
    writers.promote("a", 2)  # never moved down
    gate.set()
    for future in [busy, routine, *queued]:
        future.result(timeout=DEADLINE_S)

    assert order == [
        "status of a routine pass",  # urgency 0 now, and of a lower kind than the event
        "event of a crashed engine's fallback",
        "Deployment of a new service",
        "status of a new service",
        "routine Deployment",
    ]
    assert routine.result() == "status of a routine pass"


def test_an_error_reaches_the_waiting_pass() -> None:
    writers = Writers(2)

    def refused() -> None:
        raise RuntimeError("409 Conflict")

    future = writers.submit(1, 0, refused)
    error = future.exception(timeout=DEADLINE_S)
    assert isinstance(error, RuntimeError) and "409" in str(error)


def test_a_promoted_pass_sends_its_later_writes_urgently_until_it_settles() -> None:
    writers = Writers(1)
    order: list[str] = []
    gate = threading.Event()
    busy = writers.submit(2, 0, lambda: gate.wait(DEADLINE_S))
    writers.promote("a", 0)  # crashed while its pass ran: its next writes are urgent too
    later = writers.submit(2, 1, lambda: order.append("a's status"), key="a")
    other = writers.submit(1, 0, lambda: order.append("a new service's Deployment"))
    writers.settle("a")
    after = writers.submit(2, 1, lambda: order.append("a's next routine pass"), key="a")
    gate.set()
    for future in (busy, later, other, after):
        future.result(timeout=DEADLINE_S)
    assert order == ["a's status", "a new service's Deployment", "a's next routine pass"]


def test_a_deployment_goes_out_on_a_reserved_writer_while_the_shared_ones_are_busy() -> None:
    writers = Writers(1, reserved=1)
    order: list[str] = []
    gate, held = threading.Event(), threading.Event()

    def hold() -> None:
        held.set()
        gate.wait(DEADLINE_S)

    busy = writers.submit(1, 1, hold)
    assert held.wait(DEADLINE_S)  # the only shared writer is busy
    status = writers.submit(0, 1, lambda: order.append("an urgent status write"))
    deployment = writers.submit(1, 0, lambda: order.append("a new service's Deployment"))
    deployment.result(timeout=DEADLINE_S)  # while the shared writer is still held
    gate.set()
    for future in (busy, status):
        future.result(timeout=DEADLINE_S)
    # The reserved writer never took the (more urgent) status write: it is the shared one's.
    assert order == ["a new service's Deployment", "an urgent status write"]
