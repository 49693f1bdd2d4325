"""Tiers: each decided on its own (placement, ladder, capacity), one route to all of them."""

from __future__ import annotations

from typing import Any

from kvq.decide import decide
from kvq.decide.types import Plan
from tests.unit.test_decide import (
    HEAD80_CRASH,
    conditions,
    crashing_pod,
    rolled_out,
    snapshot,
    with_status,
)
from tests.unit.test_decide import (
    isvc as isvc_body,
)


def two_tiers(**extra: Any) -> dict[str, Any]:
    """fp8 by default, an uncompressed `critical` tier for the requests that say so."""
    return isvc_body(tiers=[{"name": "critical", "kvCache": {"dtype": "auto"}}], **extra)


def objects(plan: Plan, kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in plan.apply if o["kind"] == kind}


def with_routing(snap: Any, **flags: bool) -> Any:
    return type(snap)(**{**snap.__dict__, "gateway_api": True, **flags})


def with_keda(snap: Any) -> Any:
    return type(snap)(**{**snap.__dict__, "keda": True})


def test_each_tier_gets_its_own_engine_objects_and_status() -> None:
    plan = decide(snapshot(two_tiers()))
    deployments = objects(plan, "Deployment")
    assert set(deployments) == {"llama", "llama-critical"}
    assert set(objects(plan, "Service")) == {"llama", "llama-critical"}
    default_args = deployments["llama"]["spec"]["template"]["spec"]["containers"][0]["command"]
    critical_args = deployments["llama-critical"]["spec"]["template"]["spec"]["containers"][0][
        "command"
    ]
    assert default_args[default_args.index("--kv-cache-dtype") + 1] == "fp8"
    assert critical_args[critical_args.index("--kv-cache-dtype") + 1] == "auto"
    # The default tier's selector (immutable) must not take the critical tier's pods.
    default_selector = deployments["llama"]["spec"]["selector"]["matchLabels"]
    critical_labels = deployments["llama-critical"]["spec"]["template"]["metadata"]["labels"]
    assert not all(critical_labels.get(k) == v for k, v in default_selector.items())
    [tier] = plan.status["tiers"]
    assert tier["name"] == "critical"
    assert tier["effective"]["kvCacheDtype"] == "auto"
    assert tier["capacity"]["ratioVsAuto"] == 1.0
    assert plan.status["effective"]["kvCacheDtype"] == "fp8"
    assert plan.status["tiersReady"] == "0/2"


def test_the_service_is_ready_only_when_every_tier_is() -> None:
    body = two_tiers()
    first = decide(snapshot(body))
    deployments = objects(first, "Deployment")
    # Only the default tier rolled out: the service is not Ready, and says which tier waits.
    default_live = rolled_out(first)
    half = decide(snapshot(with_status(body, first), deployment=default_live))
    assert conditions(half)["Ready"] == ("False", "TierNotReady")
    assert half.status["tiersReady"] == "1/2"
    critical = rolled_out(first)
    critical["metadata"] = deployments["llama-critical"]["metadata"]
    critical["spec"] = deployments["llama-critical"]["spec"]
    full = decide(
        snapshot(with_status(body, half), deployment=default_live, owned=[default_live, critical])
    )
    assert conditions(full)["Ready"] == ("True", "Available")
    assert full.status["tiersReady"] == "2/2"


def test_a_tier_has_its_own_ladder() -> None:
    body = isvc_body(tiers=[{"name": "bulk", "kvCache": {"dtype": "fp8_e4m3"}}])
    first = decide(snapshot(body))
    bulk_pod = crashing_pod(first, HEAD80_CRASH, name="llama-bulk-abc")
    template = objects(first, "Deployment")["llama-bulk"]["spec"]["template"]
    bulk_pod["metadata"]["annotations"] = template["metadata"]["annotations"]
    bulk_pod["metadata"]["labels"] = template["metadata"]["labels"]
    second = decide(snapshot(with_status(body, first), pods=[bulk_pod]))
    [tier] = second.status["tiers"]
    assert [a["cause"] for a in tier["fallback"]["attempts"]] == ["Refused"]
    assert tier["effective"]["kvCacheDtype"] == "auto"
    # The default tier is untouched.
    assert second.status["fallback"]["attempts"] == []
    assert second.status["effective"]["kvCacheDtype"] == "fp8"
    assert any(e.message.startswith("Tier bulk:") for e in second.events)


def test_an_autoscaled_tier_wants_the_replicas_keda_set() -> None:
    # KEDA scaled the tier's Deployment to 3 (its HPA writes the scale subresource): the
    # tier is Ready with 3 of 3, not Progressing toward spec's 1, and kvq applies no replicas.
    auto = {"minReplicas": 1, "maxReplicas": 4, "targets": {"runningFraction": 0.8}}
    body = isvc_body(
        tiers=[{"name": "critical", "kvCache": {"dtype": "auto"}, "autoscaling": auto}]
    )
    first = decide(with_keda(snapshot(body)))
    tier = objects(first, "Deployment")["llama-critical"]
    assert "replicas" not in tier["spec"]
    live = rolled_out(first, replicas=3)
    live["metadata"] = tier["metadata"]
    live["spec"] = {**tier["spec"], "replicas": 3}
    default_live = rolled_out(first)
    second = decide(
        with_keda(
            snapshot(with_status(body, first), deployment=default_live, owned=[default_live, live])
        )
    )
    [status] = second.status["tiers"]
    ready = {c["type"]: c for c in status["conditions"]}["Ready"]
    assert (ready["status"], ready["reason"]) == ("True", "Available")
    assert ready["message"].startswith("3/3 replicas ready")
    assert status["autoscaling"]["desiredReplicas"] == 3
    assert "replicas" not in objects(second, "Deployment")["llama-critical"]["spec"]


def test_the_route_sends_each_match_to_its_tier_and_the_rest_to_the_default() -> None:
    body = two_tiers(routing={"parentRefs": [{"name": "inference-gateway"}]})
    plan = decide(with_routing(snapshot(body)))
    (route,) = objects(plan, "HTTPRoute").values()
    assert route["metadata"]["ownerReferences"][0]["kind"] == "InferenceService"
    first, last = route["spec"]["rules"]
    assert first["matches"] == [
        {"headers": [{"type": "Exact", "name": "x-kvq-tier", "value": "critical"}]}
    ]
    assert first["backendRefs"] == [{"kind": "Service", "name": "llama-critical", "port": 8000}]
    assert last["backendRefs"] == [{"kind": "Service", "name": "llama", "port": 8000}]
    assert conditions(plan)["Routing"] == ("Unknown", "Pending")
    assert plan.status["routing"]["backends"] == [
        "x-kvq-tier: critical -> Service llama-critical",
        "everything else -> Service llama",
    ]


def test_inference_pools_when_the_gateway_implements_them() -> None:
    body = two_tiers(routing={"parentRefs": [{"name": "gw"}], "inferencePool": True})
    plan = decide(with_routing(snapshot(body), inference_pools=True))
    pools = objects(plan, "InferencePool")
    assert set(pools) == {"llama", "llama-critical"}
    assert pools["llama-critical"]["spec"]["targetPorts"] == [{"number": 8000}]
    (route,) = objects(plan, "HTTPRoute").values()
    assert route["spec"]["rules"][0]["backendRefs"][0] == {
        "group": "inference.networking.k8s.io",
        "kind": "InferencePool",
        "name": "llama-critical",
    }


def test_without_the_gateway_api_routing_is_unavailable_and_services_serve() -> None:
    body = two_tiers(routing={"parentRefs": [{"name": "gw"}]})
    plan = decide(snapshot(body))
    assert conditions(plan)["Routing"] == ("False", "RoutingUnavailable")
    assert not objects(plan, "HTTPRoute")
    assert set(objects(plan, "Service")) == {"llama", "llama-critical"}


def test_a_model_alias_is_served_and_matched() -> None:
    body = isvc_body(
        tiers=[{"name": "critical", "kvCache": {"dtype": "auto"}, "match": {"model": "llama-hq"}}],
        routing={"parentRefs": [{"name": "gw"}]},
    )
    plan = decide(with_routing(snapshot(body)))
    command = objects(plan, "Deployment")["llama-critical"]["spec"]["template"]["spec"][
        "containers"
    ][0]["command"]
    at = command.index("--served-model-name")
    assert command[at + 1 : at + 3] == ["llama", "llama-hq"]
    (route,) = objects(plan, "HTTPRoute").values()
    assert {
        "headers": [{"type": "Exact", "name": "x-gateway-model-name", "value": "llama-hq"}]
    } in (route["spec"]["rules"][0]["matches"])


def test_deleting_a_tier_removes_its_objects_and_its_route_rule() -> None:
    body = two_tiers(routing={"parentRefs": [{"name": "gw"}]})
    first = decide(with_routing(snapshot(body)))
    live = [dict(o) for o in first.apply]
    without = dict(body, spec={**body["spec"], "tiers": []})
    after = decide(with_routing(snapshot(with_status(without, first), owned=live)))
    deleted = {(r.kind, r.name) for r in after.delete}
    assert {
        ("Deployment", "llama-critical"),
        ("Service", "llama-critical"),
        ("ConfigMap", "llama-critical-kvq-evidence"),
    } <= deleted
    (route,) = objects(after, "HTTPRoute").values()
    assert len(route["spec"]["rules"]) == 1
    assert "tiers" not in after.status or after.status["tiers"] == []
