"""The quality gate: a probe Job after a quantized rollout, its verdict in status, and a
fallback on a failure only when the spec asks, never on `auto`, never on an unanswered probe."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from kvq.decide import decide
from kvq.decide.types import Plan
from tests.unit.test_decide import T0, conditions, rolled_out, snapshot, with_status
from tests.unit.test_decide import isvc as isvc_body


def gated(on_failure: str = "fallback", **spec: Any) -> dict[str, Any]:
    return isvc_body(
        quality={
            "onFailure": on_failure,
            "require": ["needle.accuracy>=0.9"],
            "tolerations": [{"operator": "Exists"}],
        },
        **spec,
    )


def jobs(plan: Plan) -> list[dict[str, Any]]:
    return [o for o in plan.apply if o["kind"] == "Job"]


def summary(verdict: str, accuracy: float) -> str:
    return json.dumps(
        {
            "apiVersion": "kvq.dev/v1alpha1",
            "kind": "ProbeReport",
            "schemaVersion": 1,
            "verdict": verdict,
            "reason": f"needle.accuracy is {accuracy}",
            "engine": {"url": "http://llama:8000", "cacheConfig": {"cacheDtype": "fp8"}},
            "scores": {"needle.accuracy": accuracy, "json.validRate": 1.0},
            "checks": [
                {
                    "requirement": "needle.accuracy>=0.9",
                    "score": "needle.accuracy",
                    "passed": verdict == "Pass",
                    "value": accuracy,
                    "threshold": 0.9,
                }
            ],
        }
    )


def probe_pod(job: dict[str, Any], message: str) -> dict[str, Any]:
    labels = dict(job["spec"]["template"]["metadata"]["labels"])
    labels["job-name"] = job["metadata"]["name"]
    return {
        "metadata": {"name": f"{job['metadata']['name']}-x", "labels": labels},
        "status": {
            "phase": "Succeeded",
            "containerStatuses": [
                {
                    "name": "probe",
                    "state": {"terminated": {"exitCode": 0, "message": message}},
                }
            ],
        },
    }


def rolled(body: dict[str, Any]) -> tuple[Plan, dict[str, Any]]:
    first = decide(snapshot(body))
    assert jobs(first) == []  # nothing to probe before the rollout is ready
    ready = decide(snapshot(with_status(body, first), deployment=rolled_out(first)))
    return ready, rolled_out(first)


def test_a_ready_quantized_rollout_gets_one_probe_job() -> None:
    body = gated()
    ready, _ = rolled(body)
    (job,) = jobs(ready)
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[:2] == ["kvq", "probe"]
    assert "--url=http://llama.team-a.svc:8000" in command
    assert "--require=needle.accuracy>=0.9" in command
    assert job["spec"]["backoffLimit"] == 0
    assert job["metadata"]["ownerReferences"][0]["kind"] == "InferenceService"
    assert conditions(ready)["QualityVerified"] == ("Unknown", "Pending")


@pytest.mark.parametrize(
    ("verdict", "on_failure", "dtype_after", "condition", "moves"),
    [
        ("Pass", "fallback", "fp8", ("True", "Passed"), []),
        ("Fail", "fallback", "auto", ("False", "QualityRegression"), ["QualityRegression"]),
        ("Fail", "report", "fp8", ("False", "QualityRegression"), []),
        ("Unknown", "fallback", "fp8", ("Unknown", "ProbeUnknown"), []),
    ],
)
def test_the_verdict_is_recorded_and_acted_on_as_the_spec_says(
    verdict: str, on_failure: str, dtype_after: str, condition: tuple[str, str], moves: list[str]
) -> None:
    body = gated(on_failure)
    ready, live = rolled(body)
    (job,) = jobs(ready)
    pod = probe_pod(job, summary(verdict, 0.95 if verdict == "Pass" else 0.4))
    after = decide(
        snapshot(with_status(body, ready), deployment=live, pods=[pod], owned=[live, job])
    )
    assert conditions(after)["QualityVerified"] == condition
    quality = after.status["quality"]
    assert quality["verdict"] == verdict
    assert quality["scores"]["needle.accuracy"] in (0.95, 0.4)
    assert after.status_first  # on record before its Job is pruned
    assert [a["cause"] for a in after.status["fallback"]["attempts"]] == moves
    assert after.status["effective"]["kvCacheDtype"] == dtype_after
    assert not jobs(after)  # this rendering has its verdict: no new Job
    assert ("Job", job["metadata"]["name"]) in {(r.kind, r.name) for r in after.delete}


def test_a_failure_on_auto_never_falls_back() -> None:
    body = gated(kvCache={"dtype": "auto"})
    ready, _ = rolled(body)
    assert jobs(ready) == []  # nothing to blame on the cache: nothing is probed
    assert conditions(ready)["QualityVerified"] == ("True", "NotQuantized")


def test_after_a_quality_fallback_the_condition_keeps_saying_why() -> None:
    body = gated()
    ready, live = rolled(body)
    (job,) = jobs(ready)
    pod = probe_pod(job, summary("Fail", 0.4))
    failed = decide(
        snapshot(with_status(body, ready), deployment=live, pods=[pod], owned=[live, job])
    )
    assert failed.status["effective"]["kvCacheDtype"] == "auto"
    on_auto = decide(snapshot(with_status(body, failed), deployment=rolled_out(failed)))
    assert conditions(on_auto)["QualityVerified"] == ("False", "QualityRegression")
    assert jobs(on_auto) == []  # auto is never probed


def test_the_probe_pod_is_never_taken_by_the_engines_selectors() -> None:
    body = gated()
    ready, live = rolled(body)
    (job,) = jobs(ready)
    labels = job["spec"]["template"]["metadata"]["labels"]
    for selector in (
        live["spec"]["selector"]["matchLabels"],
        next(o for o in ready.apply if o["kind"] == "Service")["spec"]["selector"],
    ):
        assert not all(labels.get(k) == v for k, v in selector.items())


def test_a_probe_without_a_summary_is_unknown_not_a_failure() -> None:
    body = gated()
    ready, live = rolled(body)
    (job,) = jobs(ready)
    pod = probe_pod(job, "")
    after = decide(snapshot(with_status(body, ready), deployment=live, pods=[pod]))
    assert conditions(after)["QualityVerified"] == ("Unknown", "ProbeUnknown")
    assert after.status["fallback"]["attempts"] == []


def test_a_periodic_gate_runs_again_once_the_period_is_over() -> None:
    body = gated(on_failure="report")
    body["spec"]["quality"]["periodHours"] = 24
    ready, live = rolled(body)
    (job,) = jobs(ready)
    after = decide(
        snapshot(
            with_status(body, ready), deployment=live, pods=[probe_pod(job, summary("Pass", 1))]
        )
    )
    later = decide(
        snapshot(with_status(body, after), deployment=live, now=T0 + timedelta(hours=25))
    )
    (again,) = jobs(later)
    assert again["metadata"]["name"] != job["metadata"]["name"]


def test_only_the_default_tier_is_probed() -> None:
    # A quantized extra tier beside the default: the gate judges the default tier's answers
    # (it reads verdicts only there), so a Job for the tier would never be answered.
    body = gated(tiers=[{"name": "bulk", "kvCache": {"dtype": "fp8_e4m3"}}])
    first = decide(snapshot(body))
    default_live = rolled_out(first)
    bulk = rolled_out(first)
    rendered = next(
        o
        for o in first.apply
        if o["kind"] == "Deployment" and o["metadata"]["name"] == "llama-bulk"
    )
    bulk["metadata"], bulk["spec"] = rendered["metadata"], rendered["spec"]
    ready = decide(
        snapshot(with_status(body, first), deployment=default_live, owned=[default_live, bulk])
    )
    assert ready.status["tiersReady"] == "2/2"
    (job,) = jobs(ready)
    assert (
        "--url=http://llama.team-a.svc:8000"
        in job["spec"]["template"]["spec"]["containers"][0]["command"]
    )
