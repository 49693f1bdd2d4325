"""Writes that go on after their pass (Service applies, which the API server serves one at
a time): one per object in flight, and the service is reconciled again when one fails or
was asked for again while it was sent."""

from __future__ import annotations

from concurrent.futures import Future

from kvq.k8s.apply import ApplyResult
from kvq.k8s.executor import Detached

IDENT = ("Service", "team", "chat")
KEY = ("team", "chat")


def _detached() -> tuple[Detached, list[tuple[object, bool]]]:
    settled: list[tuple[object, bool]] = []
    detached = Detached(settled=lambda key, failed: settled.append((key, failed)))
    return detached, settled


def test_one_write_per_object_in_flight_and_a_second_ask_brings_a_pass_after_it() -> None:
    detached, settled = _detached()
    first: Future[ApplyResult] = Future()
    assert detached.start(IDENT, "v1", lambda: first) is first
    assert detached.start(IDENT, "v1", Future) is None  # a later pass, the same Service
    first_only = list(settled)
    assert detached.start(IDENT, "v2", Future) is None  # a later pass, another Service
    first.set_result(ApplyResult("Service", "chat", written=True))
    detached.end(IDENT, KEY, "team/chat", first)
    assert first_only == []
    assert settled == [(KEY, False)]  # reconciled again: the later pass's Service is sent
    again: Future[ApplyResult] = Future()
    assert detached.start(IDENT, "v2", lambda: again) is again  # nothing in flight any more


def test_a_write_asked_for_again_with_the_same_content_ends_quietly() -> None:
    detached, settled = _detached()
    only: Future[ApplyResult] = Future()
    detached.start(IDENT, "v1", lambda: only)
    assert detached.start(IDENT, "v1", Future) is None  # asked for the same again
    only.set_result(ApplyResult("Service", "chat", written=True))
    detached.end(IDENT, KEY, "team/chat", only)
    assert settled == []


def test_a_failed_write_reconciles_its_service_again_with_a_back_off() -> None:
    detached, settled = _detached()
    refused: Future[ApplyResult] = Future()
    detached.start(IDENT, "v1", lambda: refused)
    refused.set_exception(RuntimeError("422 Unprocessable Entity"))
    detached.end(IDENT, KEY, "team/chat", refused)
    assert settled == [(KEY, True)]
