"""The executor's writers: the most urgent write first, then by rank (a Deployment, other
objects and status, an Event), then in order; a write moved up while it waits runs once,
at its new place; other writes held while Deployments are sent; crews that take some
kinds only."""

from __future__ import annotations

import threading

import pytest

from kvq.k8s.executor import ANY_KIND, Crew, Writers

DEADLINE_S = 10.0
STATUS = "InferenceService"  # a status write's kind


def one_writer() -> Writers:
    return Writers({"shared": Crew(1, ("Deployment", ANY_KIND))})


def held(writers: Writers, kind: str, urgency: int = 1) -> threading.Event:
    """A write of `kind`, being sent: it holds its writer until the returned gate opens."""
    gate, holding = threading.Event(), threading.Event()

    def hold() -> None:
        holding.set()
        gate.wait(DEADLINE_S)

    writers.submit(urgency, kind, hold)
    assert holding.wait(DEADLINE_S)
    return gate


def test_urgent_writes_go_first_and_a_promoted_write_runs_once() -> None:
    writers = one_writer()
    order: list[str] = []
    gate = held(writers, "Deployment", urgency=2)  # on the only writer

    def write(name: str) -> str:
        order.append(name)
        return name

    routine = writers.submit(2, STATUS, lambda: write("status of a routine pass"), key="a")
    queued = [
        writers.submit(2, "Deployment", lambda: write("routine Deployment")),
        writers.submit(1, STATUS, lambda: write("status of a new service")),
        writers.submit(1, "Deployment", lambda: write("Deployment of a new service")),
        writers.submit(0, "Event", lambda: write("event of a crashed engine's fallback")),
    ]
    writers.promote("a", 0)  # its engine crashed while the write waited
    writers.promote("a", 2)  # never moved down
    gate.set()
    for future in [routine, *queued]:
        future.result(timeout=DEADLINE_S)

    assert order == [
        "status of a routine pass",  # urgency 0 now, and of a lower rank than the event
        "event of a crashed engine's fallback",
        "Deployment of a new service",
        "status of a new service",
        "routine Deployment",
    ]
    assert routine.result() == "status of a routine pass"


def test_an_error_reaches_the_waiting_pass() -> None:
    writers = one_writer()

    def refused() -> None:
        raise RuntimeError("409 Conflict")

    future = writers.submit(1, "Deployment", refused)
    error = future.exception(timeout=DEADLINE_S)
    assert isinstance(error, RuntimeError) and "409" in str(error)


def test_a_promoted_pass_sends_its_later_writes_urgently_until_it_settles() -> None:
    writers = one_writer()
    order: list[str] = []
    gate = held(writers, "Deployment", urgency=2)
    writers.promote("a", 0)  # crashed while its pass ran: its next writes are urgent too
    later = writers.submit(2, STATUS, lambda: order.append("a's status"), key="a")
    other = writers.submit(1, "Deployment", lambda: order.append("a new service's Deployment"))
    writers.settle("a")
    after = writers.submit(2, STATUS, lambda: order.append("a's next routine pass"), key="a")
    gate.set()
    for future in (later, other, after):
        future.result(timeout=DEADLINE_S)
    assert order == ["a's status", "a new service's Deployment", "a's next routine pass"]


def test_a_deployment_goes_out_on_its_own_crew_while_the_shared_writers_are_busy() -> None:
    writers = Writers(
        {
            "shared": Crew(1, ("Deployment", ANY_KIND)),
            "deployments": Crew(1, ("Deployment",)),
        }
    )
    order: list[str] = []
    gate = held(writers, "ConfigMap")  # the only shared writer
    status = writers.submit(0, STATUS, lambda: order.append("an urgent status write"))
    deployment = writers.submit(1, "Deployment", lambda: order.append("a new Deployment"))
    deployment.result(timeout=DEADLINE_S)  # while the shared writer is still held
    gate.set()
    status.result(timeout=DEADLINE_S)
    # The Deployments' writer never took the (more urgent) status write.
    assert order == ["a new Deployment", "an urgent status write"]


def test_services_wait_for_their_own_crew_and_never_hold_a_shared_writer() -> None:
    writers = Writers(
        {
            "shared": Crew(1, ("Deployment", ANY_KIND)),
            "services": Crew(1, ("Service",)),
        }
    )
    order: list[str] = []
    gate = held(writers, "Service")  # the only Service writer
    service = writers.submit(1, "Service", lambda: order.append("the next Service"))
    config_map = writers.submit(2, "ConfigMap", lambda: order.append("a routine ConfigMap"))
    config_map.result(timeout=DEADLINE_S)  # the shared writer is free for the rest
    assert order == ["a routine ConfigMap"]  # the Service waits for its own crew
    gate.set()
    service.result(timeout=DEADLINE_S)
    assert order == ["a routine ConfigMap", "the next Service"]


def two_writers(hold_seconds: float) -> Writers:
    return Writers({"shared": Crew(2, ("Deployment", ANY_KIND))}, hold_seconds=hold_seconds)


def test_other_writes_wait_while_a_deployment_of_a_pass_as_urgent_is_sent() -> None:
    writers = two_writers(hold_seconds=DEADLINE_S)
    order: list[str] = []
    gate = held(writers, "Deployment")  # a new service's (urgency 1), on one writer
    config_map = writers.submit(1, "ConfigMap", lambda: order.append("its ConfigMap"))
    status = writers.submit(2, STATUS, lambda: order.append("a routine status write"))
    crashed = writers.submit(0, STATUS, lambda: order.append("a crashed engine's status"))
    crashed.result(timeout=DEADLINE_S)  # the free writer: a more urgent pass is not held
    assert order == ["a crashed engine's status"]
    assert not (config_map.running() or config_map.done() or status.running() or status.done())
    gate.set()
    config_map.result(timeout=DEADLINE_S)
    status.result(timeout=DEADLINE_S)
    assert order == ["a crashed engine's status", "its ConfigMap", "a routine status write"]


def test_a_held_write_goes_after_the_hold_even_while_deployments_are_sent() -> None:
    writers = two_writers(hold_seconds=0.2)
    gate = held(writers, "Deployment")  # sent for as long as the test runs
    status = writers.submit(1, STATUS, lambda: "written")
    assert status.result(timeout=DEADLINE_S) == "written"
    gate.set()


def test_a_kind_no_crew_takes_is_refused_at_once() -> None:
    writers = Writers({"services": Crew(1, ("Service",))})
    with pytest.raises(ValueError, match="no writer takes ConfigMap writes"):
        writers.submit(1, "ConfigMap", lambda: None)
