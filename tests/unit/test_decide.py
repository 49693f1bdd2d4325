"""decide(): placement, static and runtime fallback, status and events, idempotence."""

from __future__ import annotations

import copy
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from e2e.devcluster.profiles import load_profile, node_manifests

from kvq.api.resource import InferenceService
from kvq.catalog.engines import load_engine_catalog
from kvq.catalog.gpus import load_gpu_catalog
from kvq.catalog.models import load_model_catalog
from kvq.decide import Catalogs, OperatorConfig, Plan, Snapshot, decide
from kvq.decide.engine_workload import live_engine
from kvq.decide.types import NextCheck
from kvq.fallback.ladder import LadderPolicy
from kvq.placement.claims import GpuClaim
from kvq.placement.discovery import GpuPod

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
    node_list: list[dict[str, Any]] | None = None,
    gpu_pods: list[GpuPod] | None = None,
    now: datetime = T0,
    policy: LadderPolicy | None = None,
) -> Snapshot:
    return Snapshot(
        isvc=InferenceService.model_validate(body),
        nodes=node_list if node_list is not None else nodes(profile),
        pods=pods or [],
        gpu_pods=gpu_pods or [],
        deployment=deployment,
        now=now,
        catalogs=CATALOGS,
        owned=owned or [],
        config=OperatorConfig(ladder=policy or LadderPolicy()),
        leader_worker_sets=True,
    )


def with_status(body: dict[str, Any], plan: Plan) -> dict[str, Any]:
    out = copy.deepcopy(body)
    out["status"] = plan.status
    return out


def deployment_of(plan: Plan) -> dict[str, Any]:
    return next(o for o in plan.apply if o["kind"] == "Deployment")


def crashing_pod(
    plan: Plan, message: str, *, name: str = "llama-abc", finished: str = "2026-11-30T12:00:50Z"
) -> dict[str, Any]:
    engines = [o for o in plan.apply if o["kind"] == "Deployment"]
    annotations = engines[0]["spec"]["template"]["metadata"]["annotations"] if engines else {}
    return {
        "metadata": {"name": name, "annotations": annotations},
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
                            "finishedAt": finished,
                        }
                    },
                }
            ],
        },
    }


def conditions(plan: Plan) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in plan.status["conditions"]}


def message(plan: Plan, type_: str) -> str:
    return str(next(c for c in plan.status["conditions"] if c["type"] == type_)["message"])


def rolled_out(plan: Plan, replicas: int = 1) -> dict[str, Any]:
    """The live Deployment once the plan's rendering runs everywhere."""
    live = copy.deepcopy(deployment_of(plan))
    live["metadata"]["generation"] = 1
    live["status"] = {
        "observedGeneration": 1,
        "replicas": replicas,
        "updatedReplicas": replicas,
        "readyReplicas": replicas,
        "availableReplicas": replicas,
    }
    return live


def attempts(plan: Plan) -> list[dict[str, Any]]:
    return list(plan.status["fallback"]["attempts"])


def pool_nodes(pool_label_value: str, profile: str = "hetero") -> list[dict[str, Any]]:
    return [n for n in nodes(profile) if pool_label_value in n["metadata"]["labels"].values()]


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
    assert [e.reason for e in plan.events] == ["Placed"]


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
    [attempt] = attempts(plan)
    assert (attempt["from"], attempt["to"], attempt["cause"]) == (
        "requested",
        "awq",
        "Incompatible",
    )
    assert "Turing" in attempt["reason"]
    assert plan.status["fallback"]["activeRung"] == "awq"
    assert plan.status["effective"]["modelUri"] == "hf://org/llama3-awq"
    assert plan.status["effective"]["quantization"] == "awq"
    assert conditions(plan)["FallbackActive"] == ("True", "IncompatibleFallback")
    assert "FallbackStatic" in [e.reason for e in plan.events]
    again = decide(snapshot(with_status(body, plan)))
    assert len(attempts(again)) == 1
    assert again.events == ()


def test_runtime_dtype_rejection_moves_to_auto_once_and_records_the_evidence() -> None:
    body = isvc()
    first = decide(snapshot(body))
    crash = crashing_pod(first, HEAD80_CRASH)
    second = decide(snapshot(with_status(body, first), pods=[crash]))
    [attempt] = attempts(second)
    assert (attempt["from"], attempt["to"], attempt["cause"]) == ("requested", "auto", "Refused")
    assert attempt["pool"] == first.status["placement"]["pool"]
    assert "head_size divisible by 32" in attempt["evidence"]
    assert second.status["effective"]["kvCacheDtype"] == "auto"
    assert deployment_of(second) != deployment_of(first)
    assert conditions(second)["FallbackActive"] == ("True", "RefusedFallback")
    assert "FallbackRuntime" in [e.reason for e in second.events]
    # The old pod keeps crashing while it is replaced: that is no new evidence.
    third = decide(snapshot(with_status(body, second), pods=[crash]))
    assert len(attempts(third)) == 1
    assert third.events == ()


def test_a_crash_under_auto_is_not_a_dtype_problem() -> None:
    body = isvc(kvCache={"dtype": "auto"})
    first = decide(snapshot(body))
    crash = crashing_pod(first, "engine exited with code 1\nRuntimeError: something else broke")
    second = decide(snapshot(with_status(body, first), pods=[crash]))
    assert attempts(second) == []
    assert conditions(second)["Degraded"] == ("True", "Unknown")
    assert conditions(second)["Stalled"] == ("True", "Unknown")


def test_oom_killed_is_degraded_without_fallback() -> None:
    body = isvc()
    first = decide(snapshot(body))
    pod = crashing_pod(first, "")
    pod["status"]["containerStatuses"][0]["lastState"]["terminated"]["reason"] = "OOMKilled"
    pod["status"]["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] = 137
    second = decide(snapshot(with_status(body, first), pods=[pod]))
    assert attempts(second) == []
    assert conditions(second)["Degraded"] == ("True", "OOMKilled")
    assert "memory limit" in message(second, "Degraded")
    assert second.apply == first.apply


@pytest.mark.parametrize(
    ("text", "family"),
    [
        ("huggingface_hub.errors.HfHubHTTPError: 503 Server Error: Service Unavailable for url: "
         "https://huggingface.co/api/models/meta-llama/Meta-Llama-3-8B/revision/main",
         "HubUnavailable"),
        ("OSError: [Errno 28] No space left on device", "DiskFull"),
        ("huggingface_hub.errors.RevisionNotFoundError: 404 Client Error. Invalid rev id: v9",
         "RevisionNotFound"),
        ("torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
         "ProcessGroupNCCL.cpp:1970, unhandled system error", "NcclError"),
        ("RuntimeError: CUDA error: uncorrectable ECC error encountered", "GpuHardware"),
        ("OSError: Can't load tokenizer for 'meta-llama/Meta-Llama-3-8B'.", "TokenizerError"),
    ],
)  # fmt: skip
def test_non_dtype_failures_under_fp8_never_fall_back(text: str, family: str) -> None:
    body = isvc()
    first = decide(snapshot(body))
    crash = crashing_pod(first, f"engine exited with code 1\nerror lines:\n{text}")
    second = decide(snapshot(with_status(body, first), pods=[crash]))
    assert attempts(second) == []
    assert second.status["effective"]["kvCacheDtype"] == "fp8"
    assert conditions(second)["Degraded"] == ("True", family)
    assert second.apply == first.apply


def test_a_transient_hub_failure_ends_on_the_requested_dtype() -> None:
    body = isvc()
    first = decide(snapshot(body))
    crash = crashing_pod(first, "huggingface_hub.errors.HfHubHTTPError: 503 Server Error")
    failing = decide(snapshot(with_status(body, first), pods=[crash]))
    assert conditions(failing)["Reconciling"] == ("True", "HubUnavailable")
    assert conditions(failing)["Stalled"][0] == "False"
    # The kubelet restarts it; this time the download works and the replica is ready.
    healthy = decide(snapshot(with_status(body, failing), deployment=rolled_out(failing)))
    assert conditions(healthy)["Ready"] == ("True", "Available")
    assert conditions(healthy)["Degraded"] == ("False", "Healthy")
    assert attempts(healthy) == []
    assert healthy.status["effective"]["kvCacheDtype"] == "fp8"


def test_an_unknown_crash_falls_back_only_once_it_repeats_then_is_retried() -> None:
    body = isvc()
    plan = decide(snapshot(body))
    unknown = "engine exited with code 1\ntorch._dynamo.exc.Unsupported: assertion failed"
    for restart in range(1, 3):
        pod = crashing_pod(plan, unknown, finished=f"2026-11-30T12:0{restart}:00Z")
        plan = decide(snapshot(with_status(body, plan), pods=[pod]))
        assert attempts(plan) == [], restart
        assert plan.status["fallback"]["tally"]["count"] == restart
        assert conditions(plan)["Degraded"] == ("True", "DtypeSuspect")
    # The same crash a third time: suspect fallback, to be retried after an hour.
    pod = crashing_pod(plan, unknown, finished="2026-11-30T12:03:00Z")
    suspect = decide(snapshot(with_status(body, plan), pods=[pod]))
    [move] = attempts(suspect)
    assert (move["cause"], move["to"], move["retryAfter"]) == (
        "Suspect",
        "auto",
        "2026-11-30T13:00:00Z",
    )
    assert suspect.next_check.after == timedelta(hours=1)
    assert suspect.status["effective"]["kvCacheDtype"] == "auto"
    # An hour later the requested dtype is tried again.
    later = decide(snapshot(with_status(body, suspect), now=T0 + timedelta(hours=1, minutes=1)))
    assert [a["cause"] for a in attempts(later)] == ["Suspect", "Retry"]
    assert later.status["effective"]["kvCacheDtype"] == "fp8"


def test_replicas_labels_and_annotations_neither_reset_the_ladder_nor_restart_pods() -> None:
    body = isvc()
    first = decide(snapshot(body))
    fallen = decide(snapshot(with_status(body, first), pods=[crashing_pod(first, HEAD80_CRASH)]))
    edited = with_status(body, fallen)
    edited["metadata"]["generation"] = 2
    edited["spec"]["replicas"] = 3
    edited["metadata"]["labels"] = {"team": "search"}
    edited["metadata"]["annotations"] = {"note": "scaled for the launch"}
    after = decide(snapshot(edited))
    assert after.status["effective"]["kvCacheDtype"] == "auto"
    assert len(attempts(after)) == 1
    template = deployment_of(after)["spec"]["template"]
    assert template == deployment_of(fallen)["spec"]["template"]
    assert deployment_of(after)["spec"]["replicas"] == 3


def test_a_change_of_what_decides_the_dtype_starts_the_ladder_afresh() -> None:
    body = isvc()
    first = decide(snapshot(body))
    second = decide(snapshot(with_status(body, first), pods=[crashing_pod(first, HEAD80_CRASH)]))
    changed = with_status(body, second)
    changed["metadata"]["generation"] = 2
    changed["spec"]["memory"]["maxModelLen"] = 4096
    third = decide(snapshot(changed))
    assert third.status["effective"]["kvCacheDtype"] == "fp8"
    assert conditions(third)["FallbackActive"] == ("False", "AsRequested")
    assert len(attempts(third)) == 1  # history kept, not in force


def test_a_retry_by_hand_tries_the_requested_dtype_again() -> None:
    body = isvc()
    first = decide(snapshot(body))
    fallen = decide(snapshot(with_status(body, first), pods=[crashing_pod(first, HEAD80_CRASH)]))
    asked = with_status(body, fallen)
    asked["metadata"]["annotations"] = {"kvq.dev/retry-requested": "2026-11-30"}
    retried = decide(snapshot(asked, now=T0 + timedelta(minutes=10)))
    assert retried.status["effective"]["kvCacheDtype"] == "fp8"
    assert attempts(retried)[-1]["cause"] == "Retry"
    assert retried.status["fallback"]["retryToken"] == "2026-11-30"
    # The same annotation later is not a new request.
    again = decide(snapshot(with_status(asked, retried), now=T0 + timedelta(minutes=20)))
    assert len(attempts(again)) == len(attempts(retried))


def test_fallback_disabled_reports_and_changes_nothing() -> None:
    body = isvc(fallback={"enabled": False})
    first = decide(snapshot(body))
    second = decide(snapshot(with_status(body, first), pods=[crashing_pod(first, HEAD80_CRASH)]))
    assert attempts(second) == []
    assert second.status["effective"]["kvCacheDtype"] == "fp8"
    assert conditions(second)["Degraded"] == ("True", "DtypeRejected")
    assert conditions(second)["Stalled"] == ("True", "DtypeRejected")
    assert "fallback is disabled" in message(second, "Degraded").lower()


def test_exhausted_ladder_is_degraded_stalled_and_keeps_what_runs() -> None:
    # fp8 holds ~110 sequences of 8k on one H100, auto ~55: for 100, auto is no rung.
    body = isvc(capacity={"minConcurrentSequences": 100}, placement={"pools": ["gpu-h100"]})
    first = decide(snapshot(body))
    assert conditions(first)["Placed"] == ("True", "PoolChosen")
    second = decide(snapshot(with_status(body, first), pods=[crashing_pod(first, HEAD80_CRASH)]))
    [attempt] = attempts(second)
    assert attempt["to"] == "none"
    assert conditions(second)["Degraded"] == ("True", "FallbackExhausted")
    assert conditions(second)["Stalled"] == ("True", "FallbackExhausted")
    assert second.apply == ()
    assert second.delete == ()
    assert [e.reason for e in second.events] == ["FallbackExhausted"]


def test_no_pool_names_what_is_missing() -> None:
    plan = decide(snapshot(isvc(), profile="legacy"))
    assert conditions(plan)["Placed"][0] == "False"
    assert "no pool fits" in message(plan, "Placed")


def test_ready_follows_the_live_deployment_and_settles_kstatus() -> None:
    body = isvc()
    plan = decide(snapshot(body))
    assert conditions(plan)["Reconciling"] == ("True", "Progressing")
    assert conditions(plan)["Stalled"] == ("False", "Progressing")
    ready = decide(snapshot(with_status(body, plan), deployment=rolled_out(plan)))
    assert conditions(ready)["Ready"] == ("True", "Available")
    assert conditions(ready)["Reconciling"] == ("False", "Settled")
    assert ready.status["readyReplicas"] == 1
    assert ready.status["selector"] == (
        "app.kubernetes.io/name=vllm,kvq.dev/inferenceservice=llama"
    )
    assert [e.reason for e in ready.events] == ["Ready"]


def test_unknown_engine_version_is_stalled_not_a_crash() -> None:
    plan = decide(snapshot(isvc(engine={"image": "vllm/vllm-openai:v0.4.0"})))
    assert conditions(plan)["Placed"] == ("False", "EngineUnsupported")
    assert conditions(plan)["Stalled"] == ("True", "EngineUnsupported")
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


def test_the_cpu_tier_is_planned_beside_the_gpu_tier_and_never_ignored() -> None:
    plan = decide(snapshot(isvc(memory={"maxModelLen": 8192, "swapSpaceGiB": 8})))
    assert plan.status["effective"].get("ignored", []) == []
    assert "SettingIgnored" not in [e.reason for e in plan.events]
    capacity = plan.status["capacity"]
    gpu_tier, cpu_tier = capacity["gpuTier"], capacity["cpuTier"]
    assert gpu_tier["tokens"] == capacity["kvTokens"]
    assert gpu_tier["dtype"] == cpu_tier["dtype"] == "fp8"
    # 8 GiB of fp8 Llama-3-8B (64 KiB per token): 131,072 tokens, in whole 16-token blocks.
    assert (cpu_tier["mode"], cpu_tier["backend"], cpu_tier["connector"]) == (
        "offload",
        "native",
        "OffloadingConnector",
    )
    assert (cpu_tier["bytes"], cpu_tier["tokens"]) == (8 * 2**30, 131_072)
    assert "CPU tier (offload native): 131,072 KV tokens in 8.0 GiB" in message(plan, "Placed")
    default = decide(snapshot(isvc()))
    assert "cpuTier" not in default.status["capacity"]


def test_a_cpu_tier_the_image_cannot_keep_stalls_with_the_reason() -> None:
    # The CRD refuses what the version alone decides; whether an image ships LMCache is
    # the operator's to judge (the stock image: no record that it does).
    body = isvc(
        memory={"swapSpaceGiB": 8, "offloadBackend": "lmcache"},
        engine={"image": "vllm/vllm-openai:v0.20.2"},
    )
    plan = decide(snapshot(body))
    assert conditions(plan)["Stalled"] == ("True", "CpuTierUnsupported")
    assert conditions(plan)["Placed"] == ("False", "CpuTierUnsupported")
    assert "kvq has no record that vllm/vllm-openai ships it" in message(plan, "Stalled")
    assert plan.apply == ()
    assert "CpuTierUnsupported" in [e.reason for e in plan.events]


# --- placement that holds still ---------------------------------------------------------


def _h100_only() -> dict[str, Any]:
    return isvc(placement={"pools": ["gpu-h100", "gpu-h200"]})


def _not_ready(node_list: list[dict[str, Any]], pool: str) -> list[dict[str, Any]]:
    out = copy.deepcopy(node_list)
    for node in out:
        if pool in node["metadata"]["labels"].values():
            node["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    return out


def test_a_pool_blip_neither_moves_nor_restarts_within_the_grace_period() -> None:
    body = _h100_only()
    placed = decide(snapshot(body))
    assert placed.status["placement"]["pool"] == "gpu-h100"
    running = with_status(body, placed)
    blip = _not_ready(nodes(), "gpu-h100")
    waiting = decide(snapshot(running, node_list=blip, deployment=rolled_out(placed)))
    assert conditions(waiting)["Placed"] == ("False", "WaitingForCapacity")
    assert waiting.status["placement"]["pool"] == "gpu-h100"
    assert deployment_of(waiting) == deployment_of(placed)
    assert attempts(waiting) == []
    assert waiting.next_check.after == timedelta(minutes=5)
    # The node comes back within the grace period: placed again, nothing changed.
    back = decide(
        snapshot(
            with_status(body, waiting), deployment=rolled_out(placed), now=T0 + timedelta(minutes=1)
        )
    )
    assert conditions(back)["Placed"] == ("True", "PoolChosen")
    assert deployment_of(back) == deployment_of(placed)


def test_a_pool_down_past_the_grace_period_is_left_for_another_that_can_run_it() -> None:
    body = _h100_only()
    placed = decide(snapshot(body))
    blip = _not_ready(nodes(), "gpu-h100")
    waiting = decide(snapshot(with_status(body, placed), node_list=blip))
    moved = decide(
        snapshot(with_status(body, waiting), node_list=blip, now=T0 + timedelta(minutes=6))
    )
    assert moved.status["placement"]["pool"] == "gpu-h200"
    assert moved.status["effective"]["kvCacheDtype"] == "fp8"
    assert attempts(moved) == []  # another pool, not another rung


def test_gpus_held_by_other_pods_make_a_pool_full() -> None:
    cheapest = decide(snapshot(isvc())).status["placement"]["pool"]
    taken = [
        GpuPod(node=n["metadata"]["name"], gpus=8, owner=None)
        for n in nodes()
        if cheapest in n["metadata"]["labels"].values()
    ]
    plan = decide(snapshot(isvc(), gpu_pods=taken))
    assert plan.status["placement"]["pool"] != cheapest
    assert conditions(plan)["Placed"] == ("True", "PoolChosen")


def test_the_plan_says_where_it_runs_what_it_claims_and_when_to_look_again() -> None:
    # What the operator's loop acts on, typed: never read back from status or manifests.
    plan = decide(snapshot(isvc()))
    pool = plan.status["placement"]["pool"]
    assert plan.pool == pool
    assert plan.claims == (GpuClaim(("team-a", "llama"), pool, replicas=1, gpus_per_replica=1),)
    assert plan.next_check == NextCheck()  # placed, as asked: only a change wakes it
    # No pool fits: it waits for GPUs to free up anywhere, and claims nothing.
    hopeless = decide(snapshot(isvc(placement={"pools": ["no-such-pool"]})))
    assert conditions(hopeless)["Placed"][0] == "False"
    assert hopeless.next_check.on_gpus and hopeless.claims is None


def test_gpus_promised_to_deployments_not_bound_yet_make_a_pool_full() -> None:
    # Services decided in the seconds before their pods are bound: the pool is promised
    # to the first ones, the next goes elsewhere rather than wait for a GPU that is taken.
    cheapest = decide(snapshot(isvc())).status["placement"]["pool"]
    gpus = sum(
        int(n["status"]["allocatable"]["nvidia.com/gpu"])
        for n in nodes()
        if cheapest in n["metadata"]["labels"].values()
    )
    promised = [GpuClaim(("team-b", "other"), cheapest, replicas=gpus, gpus_per_replica=1)]
    plan = decide(replace(snapshot(isvc()), claims=promised))
    assert plan.status["placement"]["pool"] != cheapest
    # Its own Deployment's promise is room for itself: it stays where it is.
    body = isvc()
    placed = decide(snapshot(body))
    own = [GpuClaim(("team-a", "llama"), cheapest, replicas=1, gpus_per_replica=1)]
    again = decide(replace(snapshot(with_status(body, placed)), claims=own))
    assert again.status["placement"]["pool"] == cheapest
    assert conditions(again)["Placed"] == ("True", "PoolChosen")


def test_gpus_the_service_holds_itself_are_room_for_it() -> None:
    body = isvc()
    placed = decide(snapshot(body))
    pool = placed.status["placement"]["pool"]
    mine = [
        GpuPod(node=n["metadata"]["name"], gpus=1, owner=("team-a", "llama"))
        for n in nodes()
        if pool in n["metadata"]["labels"].values()
    ][:1]
    again = decide(snapshot(with_status(body, placed), gpu_pods=mine))
    assert again.status["placement"]["pool"] == pool
    assert conditions(again)["Placed"] == ("True", "PoolChosen")


def test_a_transient_taint_does_not_change_the_pod_template() -> None:
    body = isvc()
    placed = decide(snapshot(body))
    tainted = copy.deepcopy(nodes())
    for node in tainted:
        node["spec"].setdefault("taints", []).append(
            {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}
        )
    after = decide(snapshot(with_status(body, placed), node_list=tainted))
    template = deployment_of(after)["spec"]["template"]
    assert template == deployment_of(placed)["spec"]["template"]
    assert template["spec"]["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]


def test_a_pool_mixing_gpu_products_is_two_pools_pinned_by_product() -> None:
    mixed = [n for n in nodes() if n["metadata"]["labels"].get("karpenter.sh/nodepool")]
    for node in mixed:
        node["metadata"]["labels"]["karpenter.sh/nodepool"] = "gpu-mixed"
    forward = decide(snapshot(isvc(), node_list=mixed))
    backward = decide(snapshot(isvc(), node_list=list(reversed(mixed))))
    assert forward.status["placement"] == backward.status["placement"]
    selector = deployment_of(forward)["spec"]["template"]["spec"]["nodeSelector"]
    assert selector["karpenter.sh/nodepool"] == "gpu-mixed"
    assert selector["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert forward.status["placement"]["pool"].startswith("gpu-mixed-")


def test_rollouts_surge_when_the_pool_has_a_free_gpu_and_can_be_set() -> None:
    body = _h100_only()
    plan = decide(snapshot(body))
    assert deployment_of(plan)["spec"]["strategy"]["rollingUpdate"] == {
        "maxSurge": 1,
        "maxUnavailable": 0,
    }
    pool_nodes_ = [n for n in nodes() if "gpu-h100" in n["metadata"]["labels"].values()]
    allocatable = sum(int(n["status"]["allocatable"]["nvidia.com/gpu"]) for n in pool_nodes_)
    others = [GpuPod(node=pool_nodes_[0]["metadata"]["name"], gpus=allocatable - 1, owner=None)]
    tight = decide(snapshot(body, gpu_pods=others))
    assert deployment_of(tight)["spec"]["strategy"]["rollingUpdate"] == {
        "maxSurge": 0,
        "maxUnavailable": 1,
    }
    asked = decide(snapshot(isvc(rollout={"maxSurge": 2, "maxUnavailable": 0})))
    assert deployment_of(asked)["spec"]["strategy"]["rollingUpdate"] == {
        "maxSurge": 2,
        "maxUnavailable": 0,
    }


def test_pods_that_serve_nothing_are_replaced_at_once_not_surged() -> None:
    # Two replicas crashing on fp8 hold their GPUs: a surge replica for the auto rollout
    # could wait for ever for a third while the deployment controller keeps the crashing
    # ones (maxUnavailable 0). Nothing serves, so all of them are replaced at once.
    pools = {"pools": ["gpu-h100", "gpu-h200"]}
    body = isvc(replicas=2, placement=pools)
    first = decide(snapshot(body))
    assert deployment_of(first)["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 1
    crashing = rolled_out(first, replicas=2)
    crashing["status"] = {**crashing["status"], "readyReplicas": 0, "availableReplicas": 0}
    crash = crashing_pod(first, HEAD80_CRASH)
    fallback = decide(snapshot(with_status(body, first), pods=[crash], deployment=crashing))
    assert fallback.status["effective"]["kvCacheDtype"] == "auto"
    assert deployment_of(fallback)["spec"]["strategy"]["rollingUpdate"] == {
        "maxSurge": 0,
        "maxUnavailable": 2,
    }
    # A rollout already stuck that way (the surge replica Pending, the crashing ones
    # kept) is freed without touching the pods.
    stuck = rolled_out(fallback, replicas=2)
    stuck["spec"]["strategy"]["rollingUpdate"] = {"maxSurge": 1, "maxUnavailable": 0}
    stuck["status"] = {"replicas": 3, "updatedReplicas": 1, "availableReplicas": 0}
    freed = decide(snapshot(with_status(body, fallback), deployment=stuck))
    assert deployment_of(freed)["spec"]["template"] == deployment_of(fallback)["spec"]["template"]
    assert deployment_of(freed)["spec"]["strategy"]["rollingUpdate"] == {
        "maxSurge": 0,
        "maxUnavailable": 2,
    }
    # A new Deployment whose pods are starting is left as it is.
    starting = rolled_out(first, replicas=2)
    starting["status"] = {"replicas": 2, "updatedReplicas": 2, "availableReplicas": 0}
    again = decide(snapshot(with_status(body, first), deployment=starting))
    assert deployment_of(again)["spec"]["strategy"] == starting["spec"]["strategy"]
    # Serving replicas keep serving through a change: the pool has room to surge.
    serving = rolled_out(first, replicas=2)
    edited = isvc(replicas=2, placement=pools, memory={"maxModelLen": 4096})
    changed = decide(snapshot(with_status(edited, first), deployment=serving))
    assert deployment_of(changed)["spec"]["strategy"]["rollingUpdate"] == {
        "maxSurge": 1,
        "maxUnavailable": 0,
    }


@pytest.mark.parametrize(
    ("asked", "rendered"),
    [
        ({"maxSurge": 0}, {"maxSurge": 0, "maxUnavailable": 1}),
        ({"maxUnavailable": 0}, {"maxSurge": 1, "maxUnavailable": 0}),
        ({"maxSurge": 3}, {"maxSurge": 3, "maxUnavailable": 0}),
        ({"maxUnavailable": 2}, {"maxSurge": 0, "maxUnavailable": 2}),
    ],
)
def test_a_lone_rollout_limit_never_renders_both_zero(
    asked: dict[str, int], rendered: dict[str, int]
) -> None:
    # Both 0 is a Deployment the API server refuses: the rollout could never progress.
    plan = decide(snapshot(isvc(rollout=asked)))
    assert deployment_of(plan)["spec"]["strategy"]["rollingUpdate"] == rendered


def test_credentials_never_reach_status_or_events() -> None:
    token = "hf_" + "A" * 30
    body = isvc()
    first = decide(snapshot(body))
    crash = crashing_pod(first, f"OSError: 401 Client Error: Invalid user token {token} for url x")
    second = decide(snapshot(with_status(body, first), pods=[crash]))
    text = repr(second.status) + repr(second.events)
    assert token not in text
    assert "<redacted>" in text


@pytest.mark.parametrize(
    ("message", "stalled"),
    [
        ("huggingface_hub.errors.RepositoryNotFoundError: 404 Client Error. Repository Not "
         "Found for url: https://huggingface.co/api/models/acme/nope/revision/main.", "True"),
        ("huggingface_hub.errors.HfHubHTTPError: 503 Server Error: Service Unavailable for "
         "url: https://huggingface.co/api/models/meta-llama/Meta-Llama-3-8B", "False"),
    ],
)  # fmt: skip
def test_a_failed_model_download_is_model_unavailable_never_a_dtype_fallback(
    message: str, stalled: str
) -> None:
    body = isvc()
    first = decide(snapshot(body))
    pod = crashing_pod(first, "")
    pod["status"]["containerStatuses"][0] = {
        "name": "vllm",
        "ready": False,
        "restartCount": 0,
        "state": {"waiting": {"reason": "PodInitializing"}},
    }
    pod["status"]["initContainerStatuses"] = [
        {
            "name": "kvq-fetch",
            "ready": False,
            "restartCount": 3,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "message": message}},
        }
    ]
    second = decide(snapshot(with_status(body, first), pods=[pod]))
    assert attempts(second) == []
    assert conditions(second)["Degraded"] == ("True", "ModelUnavailable")
    assert conditions(second)["Stalled"][0] == stalled
    assert second.status["effective"]["kvCacheDtype"] == "fp8"


def test_a_crash_that_repeats_under_auto_returns_to_the_requested_dtype_degraded() -> None:
    """The real old-wrapper text of a model vLLM cannot build (no frames, so DtypeSuspect
    under fp8): three crashes move to auto; the same crash under auto returns to fp8 with
    Degraded DtypeCleared and an Event; more crashes on fp8 never fall back again."""
    name = "cpu-v0.32.0-tiny-llama-gelu-fp8-config-error.old-wrapper.termination-message.txt"
    text = (Path(__file__).parents[1] / "fixtures" / "vllm" / name).read_text()
    body = isvc()
    plan = decide(snapshot(body))
    for restart in range(1, 4):
        pod = crashing_pod(plan, text, finished=f"2026-11-30T12:0{restart}:00Z")
        plan = decide(snapshot(with_status(body, plan), pods=[pod]))
    assert [a["cause"] for a in attempts(plan)] == ["Suspect"]
    assert plan.status["effective"]["kvCacheDtype"] == "auto"
    under_auto = crashing_pod(plan, text, finished="2026-11-30T12:05:00Z")
    cleared = decide(snapshot(with_status(body, plan), pods=[under_auto]))
    assert [(a["cause"], a["to"]) for a in attempts(cleared)] == [
        ("Suspect", "auto"),
        ("Cleared", "requested"),
    ]
    assert cleared.status["effective"]["kvCacheDtype"] == "fp8"
    assert cleared.status["fallback"]["activeRung"] == "requested"
    assert conditions(cleared)["Degraded"] == ("True", "DtypeCleared")
    assert conditions(cleared)["Stalled"] == ("True", "DtypeCleared")
    assert conditions(cleared)["FallbackActive"][0] == "False"
    assert ("Warning", "FallbackCleared") in [(e.type, e.reason) for e in cleared.events]
    # fp8 pods start (not ready yet): still Degraded with the cause, as the status says.
    starting = decide(snapshot(with_status(body, cleared)))
    assert conditions(starting)["Degraded"] == ("True", "DtypeCleared")
    # They crash the same way, again and again: no tally, no move, no retry loop.
    plan = starting
    for restart in range(6, 10):
        pod = crashing_pod(plan, text, finished=f"2026-11-30T12:{restart:02d}:00Z")
        plan = decide(snapshot(with_status(body, plan), pods=[pod]))
        assert len(attempts(plan)) == 2 and plan.status["fallback"].get("tally") is None
        assert conditions(plan)["Degraded"] == ("True", "DtypeCleared")
        assert plan.status["effective"]["kvCacheDtype"] == "fp8"
    assert "gelu" in message(plan, "Degraded")


def test_status_shows_the_replicas_layout() -> None:
    stages = isvc(
        model={"uri": "hf://meta-llama/Llama-3.1-70B-Instruct"},
        placement={"parallelism": {"tensor": 4, "pipeline": 2}, "pools": ["gpu-h100"]},
    )
    plan = decide(snapshot(stages))
    capacity = plan.status["capacity"]
    assert capacity["layout"] == {
        "tensor": 4,
        "pipeline": 2,
        "nodesPerReplica": 1,
        "layersPerStage": [40, 40],
        "boundingStage": 1,
    }
    [engine] = [o for o in plan.apply if o["kind"] == "Deployment"]
    command = engine["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--pipeline-parallel-size") + 1] == "2"
    one_gpu = decide(snapshot(isvc())).status["capacity"]["layout"]
    assert one_gpu == {"tensor": 1, "pipeline": 1, "nodesPerReplica": 1, "layersPerStage": [32]}


def h100_nodes(count: int) -> list[dict[str, Any]]:
    """`count` nodes of the 8-GPU H100 pool (gpu-h100)."""
    [base] = pool_nodes("gpu-h100")
    found = []
    for i in range(count):
        node = copy.deepcopy(base)
        node["metadata"]["name"] = f"aws-h100-{i}"
        node["metadata"]["labels"]["kubernetes.io/hostname"] = f"aws-h100-{i}"
        found.append(node)
    return found


def group_of(plan: Plan) -> dict[str, Any]:
    return next(o for o in plan.apply if o["kind"] == "LeaderWorkerSet")


TWO_NODES = {"parallelism": {"tensor": 8, "pipeline": 2}, "pools": ["gpu-h100"]}
LLAMA_405B = {"uri": "hf://meta-llama/Llama-3.1-405B-Instruct"}


def test_a_replica_over_two_nodes_is_a_leader_worker_set_ready_from_its_status() -> None:
    two_nodes = isvc(model=LLAMA_405B, placement=TWO_NODES)
    plan = decide(snapshot(two_nodes, node_list=h100_nodes(2)))
    assert conditions(plan)["Placed"][0] == "True"
    assert plan.status["capacity"]["layout"]["nodesPerReplica"] == 2
    assert sorted(o["kind"] for o in plan.apply) == ["ConfigMap", "LeaderWorkerSet", "Service"]
    group = group_of(plan)
    assert group["metadata"]["name"] == "llama-group"
    assert group["spec"]["leaderWorkerTemplate"]["size"] == 2
    leader = group["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
    assert leader["resources"]["limits"]["nvidia.com/gpu"] == "8"
    [service] = [o for o in plan.apply if o["kind"] == "Service"]
    assert service["spec"]["selector"]["leaderworkerset.sigs.k8s.io/worker-index"] == "0"
    # 16 GPUs of the pool claimed before any pod is bound.
    assert plan.claims is not None and [c.gpus for c in plan.claims] == [16]

    # Ready from the LeaderWorkerSet's own status: Progressing until Available.
    live = copy.deepcopy(group)
    live["metadata"]["generation"] = 1
    live["status"] = {
        "observedGeneration": 1,
        "replicas": 1,
        "updatedReplicas": 1,
        "readyReplicas": 0,
        "conditions": [{"type": "Progressing", "status": "True"}],
    }
    placed = with_status(two_nodes, plan)

    def seen(live: dict[str, Any]) -> Snapshot:
        # As the operator reads it (handlers.read_pass): the group as the live engine.
        engine = live_engine([live], "llama")
        return snapshot(placed, node_list=h100_nodes(2), owned=[live], deployment=engine)

    starting = decide(seen(live))
    assert conditions(starting)["Ready"] == ("False", "Progressing")
    assert message(starting, "Ready") == "0/1 replicas of the current spec ready."
    live["status"]["readyReplicas"] = 1
    live["status"]["conditions"] = [{"type": "Available", "status": "True"}]
    ready = decide(seen(live))
    assert conditions(ready)["Ready"] == ("True", "Available")
    assert message(ready, "Ready").startswith("1/1 replicas ready on pool gpu-h100")
    assert ready.delete == ()


def test_each_pod_of_a_group_asks_a_node_for_its_share_of_the_memory() -> None:
    one_pod = isvc(
        model={"uri": "hf://meta-llama/Llama-3.1-70B-Instruct"},
        placement={"gpusPerReplica": 8, "pools": ["gpu-h100"]},
    )
    stages = isvc(
        model={"uri": "hf://meta-llama/Llama-3.1-70B-Instruct"},
        placement={"parallelism": {"tensor": 8, "pipeline": 2}, "pools": ["gpu-h100"]},
    )

    def memory(plan: Plan) -> float:
        obj = next(o for o in plan.apply if o["kind"] in ("Deployment", "LeaderWorkerSet"))
        spec = obj["spec"]
        template = spec.get("template") or spec["leaderWorkerTemplate"]["workerTemplate"]
        text = template["spec"]["containers"][0]["resources"]["requests"]["memory"]
        return float(text.removesuffix("Gi"))

    whole = memory(decide(snapshot(one_pod, node_list=h100_nodes(2))))
    half = memory(decide(snapshot(stages, node_list=h100_nodes(2))))
    # 70B in bf16 is about 131 GiB of weights: each of the two pods loads its stage's half
    # (plus its own /dev/shm and overhead for 8 GPUs, as a single 8-GPU pod would).
    assert half < whole
    assert whole - half > 50


def test_a_group_waits_for_whole_free_nodes_and_switching_deletes_the_other_kind() -> None:
    two_nodes = isvc(model=LLAMA_405B, placement=TWO_NODES)
    waiting = decide(snapshot(two_nodes, node_list=h100_nodes(1)))
    assert conditions(waiting)["Placed"] == ("False", "WaitingForCapacity")
    assert "2 nodes of 8 per replica" in message(waiting, "Placed")
    # Nothing is applied until the whole group has room: a pod bound alone would hold a
    # node's GPUs doing nothing.
    assert waiting.apply == () and waiting.claims is None

    # The service ran on one node before: its Deployment goes once the group is rendered.
    one_node = decide(snapshot(isvc(), node_list=h100_nodes(2)))
    old = deployment_of(one_node)
    plan = decide(snapshot(two_nodes, node_list=h100_nodes(2), owned=[old]))
    assert [(r.kind, r.name) for r in plan.delete] == [("Deployment", "llama")]
    # And back: the group goes once a Deployment is rendered.
    group = group_of(plan)
    back = decide(snapshot(isvc(), node_list=h100_nodes(2), owned=[group]))
    assert [(r.kind, r.name) for r in back.delete] == [("LeaderWorkerSet", "llama-group")]


def group_pod(
    plan: Plan,
    message: str,
    *,
    worker: int,
    finished: str,
    deleting: bool = False,
) -> dict[str, Any]:
    """A pod of the plan's LeaderWorkerSet group 0 whose engine crashed with `message`, as
    LWS labels it (worker 0 is the leader)."""
    group = group_of(plan)["spec"]["leaderWorkerTemplate"]
    template = group["leaderTemplate" if worker == 0 else "workerTemplate"]
    name = "llama-group-0" if worker == 0 else f"llama-group-0-{worker}"
    pod = crashing_pod(plan, message, name=name, finished=finished)
    pod["metadata"]["annotations"] = template["metadata"]["annotations"]
    pod["metadata"]["labels"] = {
        "leaderworkerset.sigs.k8s.io/name": "llama-group",
        "leaderworkerset.sigs.k8s.io/group-index": "0",
        "leaderworkerset.sigs.k8s.io/worker-index": str(worker),
    }
    if deleting:
        # LWS deletes the group once a container restarted: the engine runs again, and
        # the deletion stops it.
        pod["metadata"]["deletionTimestamp"] = finished
        engine = pod["status"]["containerStatuses"][0]
        engine["state"] = {
            "terminated": {"exitCode": 143, "reason": "Error", "finishedAt": finished}
        }
    return pod


def test_a_groups_ranks_fail_once_and_the_refusal_of_any_rank_moves_the_ladder() -> None:
    body = isvc(model=LLAMA_405B, placement=TWO_NODES)
    plan = decide(snapshot(body, node_list=h100_nodes(2)))
    placed = with_status(body, plan)
    nccl = (
        "engine exited with code 1\nerror lines:\ntorch.distributed.DistBackendError: NCCL "
        "error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, remote process "
        "exited or there was a network error"
    )
    # The worker refused the FP8 cache; the leader lost its peer: the refusal decides.
    pods = [
        group_pod(plan, HEAD80_CRASH, worker=1, finished="2026-11-30T12:01:00Z"),
        group_pod(plan, nccl, worker=0, finished="2026-11-30T12:01:02Z", deleting=True),
    ]
    fallen = decide(snapshot(placed, node_list=h100_nodes(2), pods=pods))
    [move] = attempts(fallen)
    assert (move["cause"], move["to"]) == ("Refused", "auto")
    assert fallen.status["effective"]["kvCacheDtype"] == "auto"

    # An unknown crash on both ranks of the group counts once, not once per pod.
    unknown = "engine exited with code 1\ntorch._dynamo.exc.Unsupported: assertion failed"
    both = [
        group_pod(plan, unknown, worker=0, finished="2026-11-30T12:01:02Z"),
        group_pod(plan, unknown, worker=1, finished="2026-11-30T12:01:00Z", deleting=True),
    ]
    once = decide(snapshot(placed, node_list=h100_nodes(2), pods=both))
    assert attempts(once) == []
    tally = once.status["fallback"]["tally"]
    assert tally["count"] == 1
    assert tally["seen"] == ["llama-group/0@2026-11-30T12:01:00+00:00"]
    # A pod being deleted without an earlier crashed run (a scale-down) is no evidence.
    stopped = group_pod(plan, unknown, worker=1, finished="2026-11-30T12:01:00Z", deleting=True)
    del stopped["status"]["containerStatuses"][0]["lastState"]
    quiet = decide(snapshot(placed, node_list=h100_nodes(2), pods=[stopped]))
    assert conditions(quiet)["Degraded"] == ("False", "Healthy")


NCCL_LOST = (
    "engine exited with code 1\nerror lines:\ntorch.distributed.DistBackendError: NCCL "
    "error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, remote process "
    "exited or there was a network error"
)


@pytest.mark.parametrize(
    ("leader", "worker", "source"),
    [
        # The worker refused fp8; the leader lost its peer: the worker's evidence moved it.
        (NCCL_LOST, HEAD80_CRASH, "worker 1 (pod llama-group-0-1)"),
        # The leader refused; the worker lost its peer.
        (HEAD80_CRASH, NCCL_LOST, "leader (pod llama-group-0)"),
        # Both refused: the leader (first by name) speaks for the group.
        (HEAD80_CRASH, HEAD80_CRASH, "leader (pod llama-group-0)"),
    ],
)
def test_a_groups_fallback_names_the_rank_and_pod_whose_evidence_moved_it(
    leader: str, worker: str, source: str
) -> None:
    body = isvc(model=LLAMA_405B, placement=TWO_NODES)
    plan = decide(snapshot(body, node_list=h100_nodes(2)))
    pods = [
        group_pod(plan, leader, worker=0, finished="2026-11-30T12:01:02Z"),
        group_pod(plan, worker, worker=1, finished="2026-11-30T12:01:00Z"),
    ]
    fallen = decide(snapshot(with_status(body, plan), node_list=h100_nodes(2), pods=pods))
    [move] = attempts(fallen)
    assert (move["cause"], move["evidenceFrom"]) == ("Refused", source)
    assert "head_size divisible by 32" in move["evidence"]
    said = f", seen on {source}; falling back to the auto KV cache."
    assert move["reason"].endswith(said)
    assert said in message(fallen, "FallbackActive")
    [event] = [e for e in fallen.events if e.reason == "FallbackRuntime"]
    assert said in event.message


def test_a_single_pods_fallback_names_no_rank() -> None:
    body = isvc()
    first = decide(snapshot(body))
    second = decide(snapshot(with_status(body, first), pods=[crashing_pod(first, HEAD80_CRASH)]))
    [move] = attempts(second)
    assert "evidenceFrom" not in move
    assert "seen on" not in move["reason"]


def test_a_groups_repeated_crash_names_the_rank_of_the_last() -> None:
    body = isvc(model=LLAMA_405B, placement=TWO_NODES)
    plan = decide(snapshot(body, node_list=h100_nodes(2)))
    unknown = "engine exited with code 1\ntorch._dynamo.exc.Unsupported: assertion failed"
    for restart in range(1, 4):
        finished = f"2026-11-30T12:0{restart}:00Z"
        pods = [
            group_pod(plan, NCCL_LOST, worker=0, finished=finished),
            group_pod(plan, unknown, worker=1, finished=finished),
        ]
        plan = decide(snapshot(with_status(body, plan), node_list=h100_nodes(2), pods=pods))
    [move] = attempts(plan)
    assert (move["cause"], move["evidenceFrom"]) == ("Suspect", "worker 1 (pod llama-group-0-1)")
    assert (
        "(the same crash 3 times), the last on worker 1 (pod llama-group-0-1)." in (move["reason"])
    )


def test_without_leader_worker_set_a_multi_node_service_says_what_to_install() -> None:
    two_nodes = isvc(model=LLAMA_405B, placement=TWO_NODES)
    snap = replace(snapshot(two_nodes, node_list=h100_nodes(2)), leader_worker_sets=False)
    plan = decide(snap)
    assert plan.apply == ()
    assert conditions(plan)["Stalled"] == ("True", "LeaderWorkerSetUnavailable")
    assert message(plan, "Stalled") == (
        "a replica spans 2 nodes of pool gpu-h100 and runs as a LeaderWorkerSet, but "
        "leaderworkerset.x-k8s.io/v1 is not served: install LeaderWorkerSet (its controller "
        "and CRD) in the cluster"
    )
