"""The writers: the most urgent pass's writes first, then in order; a write moved up while
it waits runs once, at its new place; one rate limit (QPS and burst) for every write."""

from __future__ import annotations

import threading

import pytest

from kvq.k8s.writers import FIRST, LAST, SERIAL, RateLimit, Writers

DEADLINE_S = 10.0


def held(writers: Writers, urgency: int = 1, lane: int = 0) -> threading.Event:
    """A write being sent: it holds its writer until the returned gate opens."""
    gate, holding = threading.Event(), threading.Event()

    def hold() -> None:
        holding.set()
        gate.wait(DEADLINE_S)

    writers.submit(urgency, hold, lane=lane)
    assert holding.wait(DEADLINE_S)
    return gate


def test_urgent_writes_go_first_and_a_promoted_write_runs_once() -> None:
    writers = Writers(threads=1)
    order: list[str] = []
    gate = held(writers, urgency=2)  # on the only writer

    def write(name: str) -> str:
        order.append(name)
        return name

    routine = writers.submit(2, lambda: write("status of a routine pass"), key="a")
    queued = [
        writers.submit(2, lambda: write("routine Deployment")),
        writers.submit(1, lambda: write("Deployment of a new service")),
        writers.submit(1, lambda: write("status of a new service")),
        writers.submit(0, lambda: write("event of a crashed engine's fallback")),
    ]
    writers.promote("a", 0)  # its engine crashed while the write waited
    writers.promote("a", 2)  # never moved down
    gate.set()
    for future in [routine, *queued]:
        future.result(timeout=DEADLINE_S)

    assert order == [
        "event of a crashed engine's fallback",
        "status of a routine pass",  # urgency 0 now, after the crash's write queued before
        "Deployment of a new service",
        "status of a new service",
        "routine Deployment",
    ]


def test_within_a_priority_the_engine_workload_goes_first_and_events_last() -> None:
    writers = Writers(threads=1)
    order: list[str] = []
    gate = held(writers)
    writers.submit(1, lambda: order.append("event of a"), key="a", rank=LAST)
    writers.submit(1, lambda: order.append("ConfigMap of a"), key="a")
    writers.submit(1, lambda: order.append("status of b"), key="b")
    writers.submit(1, lambda: order.append("Deployment of a"), key="a", rank=FIRST)
    writers.submit(1, lambda: order.append("Deployment of b"), key="b", rank=FIRST)
    last = writers.submit(0, lambda: order.append("status of a crash"), key="c")
    gate.set()
    last.result(timeout=DEADLINE_S)
    writers.submit(2, lambda: None).result(timeout=DEADLINE_S)  # after all of the above
    assert order == [
        "status of a crash",  # a more urgent pass first, whatever its kind
        "Deployment of a",
        "Deployment of b",
        "ConfigMap of a",
        "status of b",
        "event of a",
    ]


def test_a_promoted_key_sends_its_later_writes_urgently_until_its_pass_settles() -> None:
    writers = Writers(threads=1)
    order: list[str] = []
    gate = held(writers)
    writers.promote("a", 0)
    writers.submit(1, lambda: order.append("other pass"))
    later = writers.submit(2, lambda: order.append("a's next write"), key="a")
    gate.set()
    later.result(timeout=DEADLINE_S)
    assert order[0] == "a's next write"
    writers.settle("a")
    gate = held(writers)
    writers.submit(1, lambda: order.append("another pass"))
    after = writers.submit(2, lambda: order.append("a's next pass"), key="a")
    gate.set()
    after.result(timeout=DEADLINE_S)
    assert order[-2:] == ["another pass", "a's next pass"]


def test_a_failed_write_raises_in_the_pass_that_waits_for_it() -> None:
    writers = Writers(threads=1)

    def refuse() -> None:
        raise RuntimeError("409")

    with pytest.raises(RuntimeError, match="409"):
        writers.submit(1, refuse).result(timeout=DEADLINE_S)
    assert writers.submit(1, lambda: "next").result(timeout=DEADLINE_S) == "next"


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_the_rate_limit_lets_a_burst_through_then_paces_to_qps() -> None:
    clock = FakeClock()
    limit = RateLimit(qps=10, burst=3, clock=clock, sleep=clock.sleep)
    waits = [limit.take() for _ in range(5)]
    assert waits[:3] == [0.0, 0.0, 0.0]  # the burst
    assert waits[3:] == pytest.approx([0.1, 0.1])  # then one every 1/qps
    clock.now += 10.0  # idle: the bucket fills up again, to the burst and no more
    assert [limit.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limit.take() == pytest.approx(0.1)


def test_every_write_takes_a_token_from_the_one_limit() -> None:
    clock = FakeClock()
    limit = RateLimit(qps=1, burst=2, clock=clock, sleep=clock.sleep)
    writers = Writers(threads=1, limit=limit)
    for future in [writers.submit(1, lambda: None) for _ in range(4)]:
        future.result(timeout=DEADLINE_S)
    assert sum(clock.slept) >= 2.0 - 1e-9  # two writes over the burst: a second each


def test_writers_are_sized_before_their_first_write_only() -> None:
    writers = Writers(threads=1)
    writers.configure(4, RateLimit(100, 10))
    writers.submit(1, lambda: None).result(timeout=DEADLINE_S)
    with pytest.raises(RuntimeError):
        writers.configure(8, RateLimit(100, 10))


def test_writes_the_server_serves_one_at_a_time_never_hold_the_shared_writers() -> None:
    """Service creates wait on the API server's ClusterIP lock: a burst of them must not
    keep a Deployment or a status write from being sent, nor the other way round."""
    writers = Writers(threads=1, serial_threads=1)
    service_gate = held(writers, lane=SERIAL)  # a Service create, waiting on the server
    status = writers.submit(1, lambda: "status")
    assert status.result(timeout=DEADLINE_S) == "status"
    shared_gate = held(writers)  # now the shared writer is busy, the Service still held
    service_gate.set()
    service = writers.submit(1, lambda: "next Service", lane=SERIAL)
    assert service.result(timeout=DEADLINE_S) == "next Service"
    shared_gate.set()
