"""Engine metrics in status: rate-limited, no churn, and the capacity check against the plan."""

from __future__ import annotations

import copy
from dataclasses import replace
from datetime import timedelta
from typing import Any

from kvq.decide import decide
from kvq.decide.metrics import EngineReading
from tests.unit.test_decide import (
    T0,
    conditions,
    deployment_of,
    isvc,
    snapshot,
    with_status,
)


def reading(at_seconds: float, **values: Any) -> EngineReading:
    defaults: dict[str, Any] = {
        "kv_cache_usage": 0.25,
        "requests_running": 3.0,
        "requests_waiting": 0.0,
        "cache_dtype": "fp8",
        "kv_tokens": None,
    }
    defaults.update(values)
    return EngineReading(observed_at=T0 + timedelta(seconds=at_seconds), **defaults)


LIVE: dict[str, Any] = {}


def placed() -> tuple[dict[str, Any], int]:
    body = isvc()
    first = decide(snapshot(body))
    LIVE.clear()
    LIVE.update(rolled_out(deployment_of(first)))
    return with_status(body, first), first.status["capacity"]["kvTokens"]


def rolled_out(deployment: dict[str, Any], ready: int = 1) -> dict[str, Any]:
    live = copy.deepcopy(deployment)
    live["metadata"]["generation"] = 1
    live["status"] = {
        "observedGeneration": 1,
        "replicas": 1,
        "updatedReplicas": ready,
        "readyReplicas": ready,
        "availableReplicas": ready,
    }
    return live


def decide_with(
    body: dict[str, Any], metrics: EngineReading, seconds: float, *, ready: int = 1
) -> Any:
    live = copy.deepcopy(LIVE)
    live["status"]["updatedReplicas"] = live["status"]["readyReplicas"] = ready
    live["status"]["availableReplicas"] = ready
    snap = snapshot(body, now=T0 + timedelta(seconds=seconds), deployment=live)
    return decide(replace(snap, engine_metrics=metrics))


def test_first_reading_is_written_with_its_time() -> None:
    body, planned = placed()
    plan = decide_with(body, reading(0, kv_tokens=planned), 0)
    metrics = plan.status["metrics"]
    assert metrics["kvCacheUsage"] == 0.25
    assert metrics["engineKvCacheDtype"] == "fp8"
    assert metrics["observedAt"] == "2026-11-30T12:00:00Z"
    assert conditions(plan)["CapacityMismatch"] == ("False", "AsPlanned")


def test_a_new_reading_within_a_minute_does_not_rewrite_status() -> None:
    body, planned = placed()
    first = decide_with(body, reading(0, kv_tokens=planned), 0)
    stored = copy.deepcopy(body)
    stored["status"] = first.status
    soon = decide_with(stored, reading(20, kv_tokens=planned, kv_cache_usage=0.9), 20)
    assert soon.status == first.status


def test_an_unchanged_reading_later_does_not_rewrite_status() -> None:
    body, planned = placed()
    first = decide_with(body, reading(0, kv_tokens=planned), 0)
    stored = copy.deepcopy(body)
    stored["status"] = first.status
    later = decide_with(stored, reading(600, kv_tokens=planned, kv_cache_usage=0.254), 600)
    assert later.status == first.status
    assert later.events == ()


def test_a_changed_reading_after_a_minute_is_written() -> None:
    body, planned = placed()
    first = decide_with(body, reading(0, kv_tokens=planned), 0)
    stored = copy.deepcopy(body)
    stored["status"] = first.status
    later = decide_with(stored, reading(90, kv_tokens=planned, requests_waiting=12.0), 90)
    assert later.status["metrics"]["requestsWaiting"] == 12.0
    assert later.status["metrics"]["observedAt"] == "2026-11-30T12:01:30Z"


def test_engine_capacity_off_by_more_than_five_percent_is_a_condition_and_an_event() -> None:
    body, planned = placed()
    plan = decide_with(body, reading(0, kv_tokens=int(planned * 0.90)), 0)
    status, reason = conditions(plan)["CapacityMismatch"]
    assert (status, reason) == ("True", "EngineDisagrees")
    message = next(c for c in plan.status["conditions"] if c["type"] == "CapacityMismatch")
    assert "(10% off)" in message["message"]
    assert "CapacityMismatch" in [e.reason for e in plan.events]


def test_no_capacity_verdict_while_a_rollout_is_under_way() -> None:
    body, planned = placed()
    plan = decide_with(body, reading(0, kv_tokens=planned // 2), 0, ready=0)
    assert "CapacityMismatch" not in conditions(plan)


def test_engine_running_another_dtype_is_reported() -> None:
    body, planned = placed()
    plan = decide_with(body, reading(0, kv_tokens=planned, cache_dtype="auto"), 0)
    message = next(c for c in plan.status["conditions"] if c["type"] == "CapacityMismatch")
    assert "runs a auto KV cache, kvq rendered fp8" in message["message"]


def test_no_prometheus_means_no_metrics_and_no_capacity_condition() -> None:
    body, _ = placed()
    plan = decide(snapshot(body))
    assert "metrics" not in plan.status
    assert "CapacityMismatch" not in conditions(plan)
