"""The one reconcile: read (watch caches, discovery, Prometheus) -> decide (pure) -> execute
(k8s). Same every time.

A worker (handlers.controller) runs a pass in two stages: `decide_pass` in a thread
(`read_pass` on what was copied out of kopf's indices on the event loop before it started,
`Observed`, so nothing changes under it; then the decision) and `carry_out` (the plan's
writes, on the writers: kvq.k8s.writers).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kvq.api.validation import InvalidInferenceServiceError
from kvq.decide import decide
from kvq.decide.invalid import REASON as INVALID_REASON
from kvq.decide.invalid import invalid_status
from kvq.decide.types import Catalogs, EventSpec, OperatorConfig, Plan, Snapshot
from kvq.handlers.controller import PassResult
from kvq.handlers.read_pass import Observed, Read, read_pass, with_log_tails
from kvq.handlers.serial_decisions import SerialDecisions
from kvq.k8s.clients import Clients
from kvq.k8s.events import post_event
from kvq.k8s.executor import ExecutionResult, Memory, execute
from kvq.k8s.status_writer import ObjectGoneError, StatusConflictError, write_status
from kvq.k8s.writers import WRITES
from kvq.metrics import DECISION_SECONDS, RECONCILE_ERRORS, RECONCILES
from kvq.observe.prometheus import PrometheusReader
from kvq.placement.fleet import Fleet

OPTIONAL_API_RECHECK_S = 300.0


@dataclass
class Runtime:
    """What every reconcile needs, built once at start-up and kept in kopf's memo."""

    catalogs: Catalogs
    config: OperatorConfig
    clients: Clients
    metrics_reader: PrometheusReader | None = None
    """Engine metrics for status.metrics; None when the operator has no Prometheus."""
    memory: Memory = field(default_factory=Memory)
    fleet: Fleet = field(init=False)
    """The cluster's GPU pools, fed by the watches (the operator's handlers)."""
    decisions: SerialDecisions = field(init=False)
    _served: dict[tuple[str, str], tuple[float, bool]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.fleet = Fleet(self.catalogs.gpus, tuple(self.config.pool_labels))
        self.decisions = SerialDecisions(self.fleet)

    def forget(self, key: tuple[str, str], uid: str) -> None:
        """What was kept for a deleted InferenceService: its claimed GPUs, what the server
        holds of its objects and status."""
        self.decisions.forget(key)
        self.memory.same.forget(*key)
        self.memory.forms.forget(uid)

    def serves(self, api_version: str, kind: str) -> bool:
        """Is an optional API served (KEDA, the Gateway API)? A "no" is asked again after a
        while (it may be installed after kvq), a "yes" is kept."""
        now = time.monotonic()
        known = self._served.get((api_version, kind))
        if known is not None and (known[1] or now - known[0] < OPTIONAL_API_RECHECK_S):
            return known[1]
        served = self.clients.serves(api_version, kind)
        self._served[(api_version, kind)] = (now, served)
        return served


@dataclass(frozen=True)
class Outcome:
    """A reconcile's result for tests and logs: the plan and what was carried out."""

    plan: Plan | None
    result: ExecutionResult | None
    passed: PassResult


@dataclass(frozen=True)
class Decided:
    """A pass between its two stages: what to carry out, decided from one view."""

    raw: dict[str, Any]
    """The InferenceService the decision read."""
    now: datetime
    plan: Plan | None = None
    owned: Sequence[Mapping[str, Any]] = ()
    invalid: InvalidInferenceServiceError | None = None
    """The spec is invalid: its status says so, nothing else is done."""
    done: Outcome | None = None
    """Nothing to carry out (the service is being deleted)."""


def reconcile(runtime: Runtime, observed: Observed, now: datetime | None = None) -> Outcome:
    """Converge one InferenceService once: decide, then carry the plan out (outside an
    event loop: the operator runs the two stages itself)."""
    outcome = asyncio.run(carry_out(runtime, decide_pass(runtime, observed, now)))
    for posted in outcome.result.events if outcome.result else ():
        posted.result()  # the caller sees the Events it caused
    for applying in outcome.result.detached if outcome.result else ():
        applying.result()  # and the applies that went on after the pass
    return outcome


def decide_pass(runtime: Runtime, observed: Observed, now: datetime | None = None) -> Decided:
    """The first stage of a pass: read (discovery, Prometheus), then decide; no write."""
    now = now or datetime.now(UTC)
    raw = dict(runtime.memory.forms.newest(observed.body))
    if raw["metadata"].get("deletionTimestamp"):
        runtime.decisions.forget((raw["metadata"].get("namespace", ""), raw["metadata"]["name"]))
        RECONCILES.labels(result="deleting").inc()
        return Decided(raw, now, done=Outcome(None, None, PassResult(gone=True)))
    try:
        read = read_pass(runtime, raw, observed, now)
        plan = _decide(runtime, read)
    except InvalidInferenceServiceError as invalid:
        return Decided(raw, now, invalid=invalid)
    except Exception:
        _count_error()
        raise
    return Decided(raw, now, plan=plan, owned=read.snapshot.owned)


def _decide(runtime: Runtime, read: Read) -> Plan:
    plan = runtime.decisions.decide(read.owner, read.snapshot, _timed_decide)
    if plan.fetch_log_tails:
        # A crash whose termination message says too little: its log, then decide again.
        read = with_log_tails(runtime, read, plan.fetch_log_tails)
        plan = runtime.decisions.decide(read.owner, read.snapshot, _timed_decide)
    return plan


async def carry_out(runtime: Runtime, decided: Decided, urgency: int = 0) -> Outcome:
    """The second stage: the plan's writes, on the executor's writers (`urgency` orders
    them among other passes' writes: lower first)."""
    if decided.done is not None:
        return decided.done
    raw, now = decided.raw, decided.now
    key = (raw["metadata"].get("namespace", ""), raw["metadata"]["name"])
    try:
        if decided.invalid is not None:
            await asyncio.to_thread(_report_invalid, runtime, raw, decided.invalid, now)
            RECONCILES.labels(result="invalid").inc()
            return Outcome(None, None, PassResult())
        assert decided.plan is not None
        try:
            result = await execute(
                runtime.clients, decided.plan, raw, decided.owned, runtime.memory, now, urgency, key
            )
        finally:
            WRITES.settle(key)
    except ObjectGoneError:
        RECONCILES.labels(result="deleting").inc()
        return Outcome(None, None, PassResult(gone=True))
    except StatusConflictError:
        RECONCILES.labels(result="conflict").inc()
        return Outcome(None, None, PassResult(conflict=True))
    except Exception:
        _count_error()
        raise
    RECONCILES.labels(result="ok").inc()
    return Outcome(decided.plan, result, _pass_result(runtime, decided.plan))


def _count_error() -> None:
    RECONCILES.labels(result="error").inc()
    RECONCILE_ERRORS.inc()


def _pass_result(runtime: Runtime, plan: Plan) -> PassResult:
    recheck = plan.next_check.after
    if runtime.metrics_reader is not None and plan.apply:
        due = runtime.config.metrics_min_interval
        recheck = due if recheck is None else min(recheck, due)
    return PassResult(
        recheck_after=recheck,
        pool=plan.pool,
        watches_capacity=plan.next_check.on_gpus,
        watches_nodes=plan.next_check.on_nodes,
    )


def _timed_decide(snapshot: Snapshot) -> Plan:
    began = time.perf_counter()
    try:
        return decide(snapshot)
    finally:
        DECISION_SECONDS.observe(time.perf_counter() - began)


def _report_invalid(
    runtime: Runtime, raw: dict[str, Any], invalid: InvalidInferenceServiceError, now: datetime
) -> None:
    status = invalid_status(raw, invalid.violations, now)
    # The Event goes with the status change only, not with every pass.
    if write_status(runtime.clients, raw, status, runtime.memory.forms):
        message = "; ".join(str(v) for v in invalid.violations)
        post_event(runtime.clients, raw, EventSpec("Warning", INVALID_REASON, message), now)


__all__ = ["Decided", "Observed", "Outcome", "Runtime", "carry_out", "decide_pass", "reconcile"]
