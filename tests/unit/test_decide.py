"""decide(): placement, static and runtime fallback, status and events, idempotence."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kvq.api.models import InferenceService
from kvq.catalog.engines import load_engine_catalog
from kvq.catalog.gpus import load_gpu_catalog
from kvq.catalog.models import load_model_catalog
from kvq.decide import Catalogs, Plan, Snapshot, decide
from kvq.devcluster.profiles import load_profile, node_manifests

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests/fixtures/vllm"
CATALOGS = Catalogs(load_gpu_catalog(), load_engine_catalog(), load_model_catalog())
T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
HEAD80_CRASH = (
    "engine exited with code 1\nerror lines, most specific first:\n"
    "ValueError: FP8 KV cache requires head_size divisible by 32 on CPU."
)


def nodes(profile: str = "hetero") -> list[dict[str, Any]]:
    result = node_manifests(load_profile(profile))
    for node in result:
        node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    return result


def isvc(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "kvq.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "llama", "namespace": "team-a", "uid": "uid-1", "generation": 1},
        "spec": {
            "model": {"uri": "hf://meta-llama/Meta-Llama-3-8B"},
            "kvCache": {"dtype": "fp8"},
            "memory": {"maxModelLen": 8192},
        },
    }
    body["spec"].update(spec)
    return body


def snapshot(
    body: dict[str, Any],
    *,
    pods: list[dict[str, Any]] | None = None,
    deployment: dict[str, Any] | None = None,
    owned: list[dict[str, Any]] | None = None,
    profile: str = "hetero",
    now: datetime = T0,
) -> Snapshot:
    return Snapshot(
        isvc=InferenceService.model_validate(body),
        nodes=nodes(profile),
        pods=pods or [],
        deployment=deployment,
        now=now,
        catalogs=CATALOGS,
        owned=owned or [],
    )


def with_status(body: dict[str, Any], plan: Plan) -> dict[str, Any]:
    out = copy.deepcopy(body)
    out["status"] = plan.status
    return out


def deployment_of(plan: Plan) -> dict[str, Any]:
    return next(o for o in plan.apply if o["kind"] == "Deployment")


def crashing_pod(plan: Plan, message: str, *, name: str = "llama-abc") -> dict[str, Any]:
    template = deployment_of(plan)["spec"]["template"]
    return {
        "metadata": {"name": name, "annotations": template["metadata"]["annotations"]},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "vllm",
                    "ready": False,
                    "restartCount": 2,
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {
                        "terminated": {
                            "exitCode": 1,
                            "reason": "Error",
                            "message": message,
                            "startedAt": "2026-11-30T12:00:05Z",
                            "finishedAt": "2026-11-30T12:00:50Z",
                        }
                    },
                }
            ],
        },
    }


def conditions(plan: Plan) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in plan.status["conditions"]}


def test_fp8_lands_on_the_cheapest_fp8_pool_that_holds_the_capacity() -> None:
    plan = decide(snapshot(isvc(capacity={"minConcurrentSequences": 64})))
    status = plan.status
    assert status["placement"]["computeCapability"] in ("8.9", "9.0", "10.0")
    assert status["effective"]["kvCacheDtype"] == "fp8"
    assert status["capacity"]["maxConcurrentSequences"] >= 64
    assert status["capacity"]["ratioVsAuto"] == pytest.approx(2.0, abs=0.01)
    assert conditions(plan)["Placed"] == ("True", "PoolChosen")
    assert conditions(plan)["FallbackActive"] == ("False", "AsRequested")
    assert [o["kind"] for o in plan.apply] == ["ConfigMap", "Deployment", "Service"]
    for obj in plan.apply:
        assert obj["metadata"]["namespace"] == "team-a"
        [owner] = obj["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"], owner["controller"]) == (
            "InferenceService",
            "uid-1",
            True,
        )
    # Engines from vLLM 0.18 have no swap space: the default 4 GiB is reported, not rendered.
    assert [e.reason for e in plan.events] == ["Placed", "SettingIgnored"]


def test_without_a_capacity_need_the_cheapest_fp8_pool_wins() -> None:
    plan = decide(snapshot(isvc()))
    assert plan.status["placement"]["gpuProduct"].startswith("L4")


def test_headroom_preference_picks_the_biggest_kv_cache() -> None:
    plan = decide(snapshot(isvc(placement={"prefer": "headroom"})))
    assert plan.status["placement"]["gpuProduct"].startswith("B200")


def test_a_second_decision_on_the_written_status_changes_nothing() -> None:
    body = isvc()
    first = decide(snapshot(body))
    second = decide(snapshot(with_status(body, first), now=T0 + timedelta(minutes=5)))
    assert second.status == first.status
    assert second.events == ()
    assert second.apply == first.apply


def test_fp8_allowed_only_on_t4_falls_back_statically_to_awq() -> None:
    body = isvc(
        model={"uri": "hf://meta-llama/Meta-Llama-3-8B", "awq": {"uri": "hf://org/llama3-awq"}},
        placement={"pools": ["t4-pool"]},
        fallback={"rungs": ["auto", "awq"]},
    )
    plan = decide(snapshot(body))
    [attempt] = plan.status["fallback"]["attempts"]
    assert (attempt["from"], attempt["to"], attempt["static"]) == ("requested", "awq", True)
    assert "Turing" in attempt["reason"]
    assert plan.status["fallback"]["activeRung"] == "awq"
    assert plan.status["effective"]["modelUri"] == "hf://org/llama3-awq"
    assert plan.status["effective"]["quantization"] == "awq"
    assert conditions(plan)["FallbackActive"] == ("True", "StaticFallback")
    assert "FallbackStatic" in [e.reason for e in plan.events]
    again = decide(snapshot(with_status(body, plan)))
    assert len(again.status["fallback"]["attempts"]) == 1
    assert again.events == ()


def test_runtime_dtype_rejection_moves_to_auto_once_and_records_the_evidence() -> None:
    body = isvc()
    first = decide(snapshot(body))
    crash = crashing_pod(first, HEAD80_CRASH)
    second = decide(snapshot(with_status(body, first), pods=[crash]))
    [attempt] = second.status["fallback"]["attempts"]
    assert (attempt["from"], attempt["to"], attempt["static"]) == ("requested", "auto", False)
    assert "head_size divisible by 32" in attempt["evidence"]
    assert second.status["effective"]["kvCacheDtype"] == "auto"
    assert deployment_of(second) != deployment_of(first)
    assert conditions(second)["FallbackActive"] == ("True", "RuntimeFallback")
    assert "FallbackRuntime" in [e.reason for e in second.events]
    # The old pod keeps crashing while it is replaced: that is no new evidence.
    third = decide(snapshot(with_status(body, second), pods=[crash]))
    assert len(third.status["fallback"]["attempts"]) == 1
    assert third.events == ()


def test_a_crash_under_auto_is_not_a_dtype_problem() -> None:
    body = isvc(kvCache={"dtype": "auto"})
    first = decide(snapshot(body))
    crash = crashing_pod(first, "engine exited with code 1\nRuntimeError: something else broke")
    second = decide(snapshot(with_status(body, first), pods=[crash]))
    assert second.status["fallback"]["attempts"] == []
    assert conditions(second)["Degraded"][0] == "True"


def test_oom_killed_is_degraded_without_fallback() -> None:
    body = isvc()
    first = decide(snapshot(body))
    pod = crashing_pod(first, "")
    pod["status"]["containerStatuses"][0]["lastState"]["terminated"]["reason"] = "OOMKilled"
    pod["status"]["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] = 137
    second = decide(snapshot(with_status(body, first), pods=[pod]))
    assert second.status["fallback"]["attempts"] == []
    assert conditions(second)["Degraded"] == ("True", "OOMKilled")
    assert second.apply == first.apply


def test_fallback_disabled_reports_and_changes_nothing() -> None:
    body = isvc(fallback={"enabled": False})
    first = decide(snapshot(body))
    second = decide(snapshot(with_status(body, first), pods=[crashing_pod(first, HEAD80_CRASH)]))
    assert second.status["fallback"]["attempts"] == []
    assert second.status["effective"]["kvCacheDtype"] == "fp8"
    status, reason = conditions(second)["Degraded"]
    assert (status, reason) == ("True", "DtypeRejected")
    degraded = next(c for c in second.status["conditions"] if c["type"] == "Degraded")
    assert "fallback is disabled" in degraded["message"].lower()


def test_exhausted_ladder_is_degraded_and_keeps_what_runs() -> None:
    # fp8 holds ~110 sequences of 8k on one H100, auto ~55: for 100, auto is no rung.
    body = isvc(capacity={"minConcurrentSequences": 100}, placement={"pools": ["gpu-h100"]})
    first = decide(snapshot(body))
    assert conditions(first)["Placed"] == ("True", "PoolChosen")
    second = decide(snapshot(with_status(body, first), pods=[crashing_pod(first, HEAD80_CRASH)]))
    [attempt] = second.status["fallback"]["attempts"]
    assert attempt["to"] == "none"
    assert conditions(second)["Degraded"] == ("True", "FallbackExhausted")
    assert second.apply == ()
    assert second.delete == ()
    assert [e.reason for e in second.events] == ["FallbackExhausted"]


def test_no_pool_names_what_is_missing() -> None:
    plan = decide(snapshot(isvc(), profile="legacy"))
    assert conditions(plan)["Placed"][0] == "False"
    placed = next(c for c in plan.status["conditions"] if c["type"] == "Placed")
    assert "fallback" in placed["message"].lower() or "no pool fits" in placed["message"]
    assert plan.apply == ()


def test_a_spec_change_starts_the_ladder_afresh() -> None:
    body = isvc()
    first = decide(snapshot(body))
    second = decide(snapshot(with_status(body, first), pods=[crashing_pod(first, HEAD80_CRASH)]))
    changed = with_status(body, second)
    changed["metadata"]["generation"] = 2
    changed["spec"]["memory"]["maxModelLen"] = 4096
    third = decide(snapshot(changed))
    assert third.status["effective"]["kvCacheDtype"] == "fp8"
    assert conditions(third)["FallbackActive"] == ("False", "AsRequested")
    assert len(third.status["fallback"]["attempts"]) == 1  # history kept, not in force


def test_ready_follows_the_live_deployment_of_the_current_spec() -> None:
    body = isvc()
    plan = decide(snapshot(body))
    live = copy.deepcopy(deployment_of(plan))
    live["metadata"]["generation"] = 1
    live["status"] = {
        "observedGeneration": 1,
        "replicas": 1,
        "updatedReplicas": 1,
        "readyReplicas": 1,
        "availableReplicas": 1,
    }
    ready = decide(snapshot(with_status(body, plan), deployment=live))
    assert conditions(ready)["Ready"] == ("True", "Available")
    assert ready.status["readyReplicas"] == 1
    assert [e.reason for e in ready.events] == ["Ready"]


def test_unknown_engine_version_is_a_condition_not_a_crash() -> None:
    plan = decide(snapshot(isvc(engine={"image": "vllm/vllm-openai:v0.4.0"})))
    assert conditions(plan)["Placed"] == ("False", "EngineUnsupported")
    assert plan.apply == ()


def test_objects_kvq_no_longer_renders_are_pruned() -> None:
    body = isvc()
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "llama", "namespace": "team-a"},
    }
    plan = decide(snapshot(body, owned=[pdb]))
    assert [(r.kind, r.name) for r in plan.delete] == [("PodDisruptionBudget", "llama")]


def test_swap_space_on_an_engine_without_it_is_reported_as_ignored() -> None:
    plan = decide(snapshot(isvc(memory={"maxModelLen": 8192, "swapSpaceGiB": 8})))
    [ignored] = plan.status["effective"]["ignored"]
    assert ignored["field"] == "spec.memory.swapSpaceGiB"
    assert "SettingIgnored" in [e.reason for e in plan.events]
