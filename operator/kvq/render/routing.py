"""The Gateway API route of an InferenceService: each tier's match to that tier, the rest to
the default tier; optionally through Gateway API Inference Extension InferencePools.

Rules with header matches win over the catch-all rule (the Gateway API's precedence: more
header matches first), so a request carrying `x-kvq-tier: critical` reaches the critical
tier and every other request the default tier.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvq.api.resource import InferenceService
from kvq.api.tiers import MODEL_HEADER, TierSpec
from kvq.render.args import ENGINE_PORT
from kvq.render.manifests import labels_for, selector_for, workload_name

HTTP_ROUTE_API = "gateway.networking.k8s.io/v1"
INFERENCE_POOL_API = "inference.networking.k8s.io/v1"
INFERENCE_POOL_GROUP = "inference.networking.k8s.io"


def render_routing(
    isvc: InferenceService, tiers: Sequence[TierSpec], *, inference_pools: bool
) -> list[dict[str, Any]]:
    """The HTTPRoute (and an InferencePool per tier when `inference_pools`)."""
    routing = isvc.spec.routing
    assert routing is not None, "render_routing needs spec.routing"
    rules: list[dict[str, Any]] = []
    for tier in tiers:
        matches = [_header_match(*tier.header())]
        alias = tier.model_alias()
        if alias is not None:
            matches.append(_header_match(MODEL_HEADER, alias))
        rules.append({"matches": matches, "backendRefs": [_backend(isvc, tier, inference_pools)]})
    rules.append(
        {
            "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
            "backendRefs": [_backend(isvc, None, inference_pools)],
        }
    )
    route: dict[str, Any] = {
        "apiVersion": HTTP_ROUTE_API,
        "kind": "HTTPRoute",
        "metadata": _metadata(isvc, isvc.metadata.name, None),
        "spec": {
            "parentRefs": [
                {
                    k: v
                    for k, v in {
                        "group": "gateway.networking.k8s.io",
                        "kind": "Gateway",
                        "name": ref.name,
                        "namespace": ref.namespace,
                        "sectionName": ref.section_name,
                    }.items()
                    if v is not None
                }
                for ref in routing.parent_refs
            ],
            "rules": rules,
        },
    }
    if routing.hostnames:
        route["spec"]["hostnames"] = list(routing.hostnames)
    objects = [route]
    if inference_pools:
        objects += [_inference_pool(isvc, tier) for tier in [None, *tiers]]
    return objects


def describe_backends(
    isvc: InferenceService, tiers: Sequence[TierSpec], *, inference_pools: bool
) -> list[str]:
    """Where each match goes, for status (`x-kvq-tier: critical -> Service llama-critical`)."""
    kind = "InferencePool" if inference_pools else "Service"
    lines = []
    for tier in tiers:
        name, value = tier.header()
        alias = f" or model {tier.model_alias()}" if tier.model_alias() else ""
        lines.append(f"{name}: {value}{alias} -> {kind} {workload_name(isvc, tier)}")
    lines.append(f"everything else -> {kind} {workload_name(isvc)}")
    return lines


def _header_match(name: str, value: str) -> dict[str, Any]:
    return {"headers": [{"type": "Exact", "name": name, "value": value}]}


def _backend(
    isvc: InferenceService, tier: TierSpec | None, inference_pools: bool
) -> dict[str, Any]:
    name = workload_name(isvc, tier)
    if inference_pools:
        return {"group": INFERENCE_POOL_GROUP, "kind": "InferencePool", "name": name}
    return {"kind": "Service", "name": name, "port": ENGINE_PORT}


def _inference_pool(isvc: InferenceService, tier: TierSpec | None) -> dict[str, Any]:
    return {
        "apiVersion": INFERENCE_POOL_API,
        "kind": "InferencePool",
        "metadata": _metadata(isvc, workload_name(isvc, tier), tier),
        "spec": {
            "selector": {"matchLabels": selector_for(isvc, tier)},
            "targetPorts": [{"number": ENGINE_PORT}],
        },
    }


def _metadata(isvc: InferenceService, name: str, tier: TierSpec | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": labels_for(isvc, tier)}
    if isvc.metadata.namespace:
        meta["namespace"] = isvc.metadata.namespace
    return meta
