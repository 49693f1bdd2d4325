"""Autoscaling: the ScaledObject kvq renders, and what decide() does with and without KEDA."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kvq.catalog.engines import load_engine_catalog
from kvq.decide import decide
from kvq.decide.types import OperatorConfig
from kvq.render.autoscaling import (
    PrometheusAccess,
    render_scaled_object,
    replicas_with_auto_cache,
)
from tests.unit.render_cases import isvc
from tests.unit.test_decide import (
    LLAMA_405B,
    TWO_NODES,
    conditions,
    deployment_of,
    h100_nodes,
    message,
    rolled_out,
    snapshot,
    with_status,
)
from tests.unit.test_decide import (
    isvc as isvc_body,
)

PROMETHEUS = PrometheusAccess("http://prometheus.monitoring:9090")
ENGINES = load_engine_catalog()


def scaled(**autoscaling: Any) -> dict[str, Any]:
    service = isvc(autoscaling={"maxReplicas": 4, **autoscaling})
    metrics = ENGINES.capability("0.26.0").metrics
    return render_scaled_object(
        service, metrics=metrics, prometheus=PROMETHEUS, concurrency=110.8, max_replicas=4
    )


def test_the_scaled_object_scales_the_inference_service_on_its_own_series() -> None:
    obj = scaled(targets={"kvCacheUsage": 0.7, "requestsWaiting": 3, "runningFraction": 0.5})
    spec = obj["spec"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": "kvq.dev/v1alpha1",
        "kind": "InferenceService",
        "name": "llama",
    }
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (1, 4)
    by_name = {t["name"]: t for t in spec["triggers"]}
    usage = by_name["kv-cache-usage"]["metadata"]
    assert usage["query"] == 'sum(vllm:kv_cache_usage_perc{namespace="team-a",service="llama"})'
    assert usage["threshold"] == "0.7"
    assert by_name["requests-waiting"]["metadata"]["threshold"] == "3"
    # Running requests per replica: half of the 110.8 sequences the plan holds.
    assert by_name["requests-running"]["metadata"]["threshold"] == "55.4"
    assert all(t["metricType"] == "AverageValue" for t in spec["triggers"])
    assert all(
        t["metadata"]["serverAddress"] == PROMETHEUS.server_address for t in spec["triggers"]
    )
    assert "idleReplicaCount" not in spec
    assert spec["fallback"] == {"failureThreshold": 3, "replicas": 4}
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 300


def test_older_engines_are_read_by_their_own_metric_name() -> None:
    service = isvc(autoscaling={"maxReplicas": 2}, engine={"image": "vllm/vllm-openai:v0.8.5"})
    obj = render_scaled_object(
        service,
        metrics=ENGINES.capability("0.8.5").metrics,
        prometheus=PROMETHEUS,
        concurrency=None,
        max_replicas=2,
    )
    queries = [t["metadata"]["query"] for t in obj["spec"]["triggers"]]
    assert any("vllm:gpu_cache_usage_perc" in q for q in queries)


def test_scale_to_zero_waits_for_an_idle_window_and_never_counts_it_as_load() -> None:
    obj = scaled(minReplicas=0, idleSeconds=600)
    spec = obj["spec"]
    assert spec["idleReplicaCount"] == 0
    assert spec["minReplicaCount"] == 1
    (activity,) = [t for t in spec["triggers"] if t["name"] == "activity"]
    assert "[600s]" in activity["metadata"]["query"]
    assert activity["metadata"]["activationThreshold"] == "0"
    assert float(activity["metadata"]["threshold"]) >= 1e6


def test_the_uncompressed_cache_would_need_the_ratio_more_replicas() -> None:
    assert replicas_with_auto_cache(3, 2.0) == 6
    assert replicas_with_auto_cache(3, 1.94) == 6
    assert replicas_with_auto_cache(0, 2.0) is None


def autoscaled_body(**autoscaling: Any) -> dict[str, Any]:
    return isvc_body(autoscaling={"minReplicas": 2, "maxReplicas": 4, **autoscaling})


def test_without_keda_autoscaling_is_unavailable_and_the_minimum_runs() -> None:
    plan = decide(snapshot(autoscaled_body()))
    assert conditions(plan)["Autoscaling"] == ("False", "AutoscalingUnavailable")
    assert "install KEDA" in message(plan, "Autoscaling")
    assert not [o for o in plan.apply if o["kind"] == "ScaledObject"]
    assert deployment_of(plan)["spec"]["replicas"] == 2  # spec.replicas 1, lifted to min 2


def test_with_keda_and_prometheus_kvq_owns_a_scaled_object() -> None:
    config = OperatorConfig(autoscaling_prometheus=PROMETHEUS)
    snap = snapshot(autoscaled_body())
    snap = type(snap)(**{**snap.__dict__, "config": config, "keda": True})
    plan = decide(snap)
    (obj,) = [o for o in plan.apply if o["kind"] == "ScaledObject"]
    assert obj["metadata"]["ownerReferences"][0]["kind"] == "InferenceService"
    assert conditions(plan)["Autoscaling"] == ("Unknown", "Pending")
    status = plan.status["autoscaling"]
    assert status["desiredReplicas"] == 2
    assert status["replicasWithAutoCache"] == 4  # an fp8 cache holds twice the tokens
    assert status["scaledObject"] == "llama"


@pytest.mark.parametrize(
    ("targets", "triggers", "running"),
    [
        # The defaults (kvCacheUsage 0.8, requestsWaiting 2): the gauge goes, the running
        # requests against 0.8 of the planned concurrency come in its place.
        ({}, ["requests-waiting", "requests-running"], 0.8),
        ({"kvCacheUsage": 0.6, "runningFraction": 0.5}, ["requests-running"], 0.5),
        ({"kvCacheUsage": 0.6}, ["requests-running"], 0.8),
    ],
)
def test_with_kv_offloading_the_kv_usage_gauge_is_no_scaling_signal(
    targets: dict[str, float], triggers: list[str], running: float
) -> None:
    service = isvc(
        autoscaling={"maxReplicas": 4, "targets": targets} if targets else {"maxReplicas": 4},
        memory={"swapSpaceGiB": 16},
    )
    obj = render_scaled_object(
        service,
        metrics=ENGINES.capability("0.26.0").metrics,
        prometheus=PROMETHEUS,
        concurrency=110.8,
        max_replicas=4,
        offloading=True,
    )
    by_name = {t["name"]: t["metadata"] for t in obj["spec"]["triggers"]}
    assert list(by_name) == triggers
    assert not any("kv_cache_usage" in t["query"] for t in by_name.values())
    assert by_name["requests-running"]["threshold"] == f"{running * 110.8:g}"


def test_offloading_drops_the_gauge_in_status_and_says_why() -> None:
    config = OperatorConfig(autoscaling_prometheus=PROMETHEUS)
    body = autoscaled_body()
    body["spec"]["memory"] = {"maxModelLen": 8192, "swapSpaceGiB": 16}
    snap = snapshot(body)
    snap = type(snap)(**{**snap.__dict__, "config": config, "keda": True})
    plan = decide(snap)
    (obj,) = [o for o in plan.apply if o["kind"] == "ScaledObject"]
    assert [t["name"] for t in obj["spec"]["triggers"]] == ["requests-waiting", "requests-running"]
    assert plan.status["autoscaling"]["signalsUsed"] == ["requestsWaiting", "runningFraction"]
    [ignored] = plan.status["effective"]["ignored"]
    assert ignored["field"] == "spec.autoscaling.targets.kvCacheUsage"
    assert "the GPU KV cache is meant to run full" in ignored["reason"]
    assert "SettingIgnored" in [e.reason for e in plan.events]
    # V0 swap (vLLM 0.10) is no offloading: the gauge stays.
    body["spec"]["engine"] = {"image": "vllm/vllm-openai:v0.10.2"}
    body["spec"]["kvCache"] = {"dtype": "auto"}
    swap = decide(type(snap)(**{**snap.__dict__, "isvc": type(snap.isvc).model_validate(body)}))
    assert swap.status["autoscaling"]["signalsUsed"] == ["kvCacheUsage", "requestsWaiting"]
    assert swap.status["effective"].get("ignored", []) == []


def test_without_prometheus_autoscaling_says_so() -> None:
    snap = snapshot(autoscaled_body())
    snap = type(snap)(**{**snap.__dict__, "keda": True})
    plan = decide(snap)
    assert conditions(plan)["Autoscaling"] == ("False", "PrometheusUnavailable")


def test_removing_autoscaling_prunes_the_scaled_object() -> None:
    body = isvc_body()
    leftover = {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": "llama", "namespace": "team-a"},
    }
    plan = decide(snapshot(body, owned=[leftover]))
    assert [(r.kind, r.name) for r in plan.delete] == [("ScaledObject", "llama")]


def test_the_pool_not_the_load_is_named_as_the_limit() -> None:
    config = OperatorConfig(autoscaling_prometheus=PROMETHEUS)
    body = autoscaled_body(minReplicas=1, maxReplicas=50)
    body["spec"]["replicas"] = 40
    body["spec"]["placement"] = {"pools": ["gpu-h100"]}  # one node, eight GPUs
    snap = snapshot(body)
    snap = type(snap)(**{**snap.__dict__, "config": config, "keda": True})
    plan = decide(snap)
    status = plan.status["autoscaling"]
    assert status["poolMaxReplicas"] == 8
    assert status["limitedBy"] == "pool"


def test_the_autoscaler_keeps_a_rolled_out_service_ready() -> None:
    body = autoscaled_body()
    first = decide(snapshot(body))
    ready = decide(snapshot(with_status(body, first), deployment=rolled_out(first, replicas=2)))
    assert conditions(ready)["Ready"] == ("True", "Available")


@pytest.mark.parametrize(
    ("autoscaling", "replicas", "message_part"),
    [
        ({"minReplicas": 5, "maxReplicas": 2}, None, "minReplicas must not be above maxReplicas"),
        ({"minReplicas": 0, "maxReplicas": 2}, None, "needs idleSeconds"),
        ({"maxReplicas": 2}, 3, "above autoscaling.maxReplicas"),
        ({"maxReplicas": 2, "targets": {}}, None, "give at least one target"),
    ],
)
def test_contradictions_are_refused(
    autoscaling: dict[str, Any], replicas: int | None, message_part: str
) -> None:
    from kvq.api.validation import find_violations

    body = copy.deepcopy(isvc_body(autoscaling=autoscaling))
    if replicas is not None:
        body["spec"]["replicas"] = replicas
    violations = find_violations(body)
    assert any(message_part in v.message for v in violations), violations


def test_a_multi_node_tier_is_scaled_through_its_leader_worker_set() -> None:
    config = OperatorConfig(autoscaling_prometheus=PROMETHEUS)
    tier = {"name": "bulk", "kvCache": {"dtype": "auto"}, "autoscaling": {"maxReplicas": 2}}
    body = isvc_body(model=LLAMA_405B, placement=TWO_NODES, tiers=[tier])
    snap = snapshot(body, node_list=h100_nodes(4))
    snap = type(snap)(**{**snap.__dict__, "config": config, "keda": True})
    plan = decide(snap)
    [scaled_object] = [o for o in plan.apply if o["kind"] == "ScaledObject"]
    # KEDA's HPA writes LWS's scale subresource: a group of two pods per replica.
    assert scaled_object["spec"]["scaleTargetRef"] == {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "name": "llama-bulk-group",
    }
    groups = {o["metadata"]["name"]: o for o in plan.apply if o["kind"] == "LeaderWorkerSet"}
    assert set(groups) == {"llama-group", "llama-bulk-group"}
    assert "replicas" not in groups["llama-bulk-group"]["spec"]  # KEDA's to set


DERIVED = {"parallelism": {"tensor": 8}, "pools": ["gpu-h100"]}
MINE = ("team-a", "llama")


@pytest.mark.parametrize(
    ("placement", "taken", "pool_max", "limited_by"),
    [
        # Five free 8-GPU nodes: two groups of two nodes, declared or derived (fp8: PP 2).
        (TWO_NODES, [], 2, "load"),
        (DERIVED, [], 2, "load"),
        # One GPU taken on two nodes: 38 GPUs are free, but a group takes every GPU of each
        # of its nodes, and three whole nodes hold one group.
        (DERIVED, [(0, 1, None), (1, 1, None)], 1, "pool"),
        # The service's own group is room for it.
        (DERIVED, [(0, 8, MINE), (1, 8, MINE)], 2, "load"),
    ],
)
def test_the_pool_cap_counts_whole_nodes_per_group(
    placement: dict[str, Any], taken: list[tuple[int, int, Any]], pool_max: int, limited_by: str
) -> None:
    from kvq.placement.discovery import GpuPod

    config = OperatorConfig(autoscaling_prometheus=PROMETHEUS)
    body = isvc_body(
        model=LLAMA_405B,
        placement=placement,
        memory={"maxModelLen": 131072},
        autoscaling={"maxReplicas": 8},
    )
    nodes = h100_nodes(5)
    pods = [GpuPod(node=nodes[i]["metadata"]["name"], gpus=g, owner=o) for i, g, o in taken]
    snap = snapshot(body, node_list=nodes, gpu_pods=pods)
    plan = decide(type(snap)(**{**snap.__dict__, "config": config, "keda": True}))
    assert plan.status["capacity"]["layout"]["nodesPerReplica"] == 2
    status = plan.status["autoscaling"]
    assert (status["poolMaxReplicas"], status["limitedBy"]) == (pool_max, limited_by)


def test_a_tier_whose_derived_layout_spans_nodes_is_scaled_through_its_leader_worker_set() -> None:
    config = OperatorConfig(autoscaling_prometheus=PROMETHEUS)
    tier = {"name": "bulk", "kvCache": {"dtype": "auto"}, "autoscaling": {"maxReplicas": 2}}
    body = isvc_body(model=LLAMA_405B, placement=DERIVED, tiers=[tier])
    snap = snapshot(body, node_list=h100_nodes(4))
    plan = decide(type(snap)(**{**snap.__dict__, "config": config, "keda": True}))
    targets = [o["spec"]["scaleTargetRef"] for o in plan.apply if o["kind"] == "ScaledObject"]
    groups = {o["metadata"]["name"] for o in plan.apply if o["kind"] == "LeaderWorkerSet"}
    # KEDA scales the group kvq renders, not a Deployment that does not exist.
    assert {"kind": "LeaderWorkerSet", "name": "llama-bulk-group"} in [
        {k: t[k] for k in ("kind", "name")} for t in targets
    ]
    assert "llama-bulk-group" in groups
