"""The route of an InferenceService through a Gateway: its objects, condition and status.

Without the Gateway API in the cluster the tiers still serve through their Services; the
`Routing` condition says so (RoutingUnavailable), and nothing loops or crashes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvq.api.status import RoutingStatus
from kvq.api.tiers import TierSpec
from kvq.decide.conditions import ConditionUpdate
from kvq.decide.types import Manifest, Snapshot
from kvq.render.manifests import workload_name
from kvq.render.routing import describe_backends, render_routing

ROUTE_KINDS = frozenset({"HTTPRoute", "InferencePool"})


@dataclass(frozen=True)
class Routed:
    manifests: tuple[Manifest, ...]
    condition: ConditionUpdate | None
    status: RoutingStatus | None


def route(snap: Snapshot, tiers: Sequence[TierSpec]) -> Routed:
    isvc = snap.isvc
    routing = isvc.spec.routing
    if routing is None:
        return Routed((), None, None)
    pools = routing.inference_pool and snap.inference_pools
    backends = describe_backends(isvc, tiers, inference_pools=pools)
    if not snap.gateway_api:
        services = ", ".join(workload_name(isvc, t) for t in [None, *tiers])
        return Routed(
            (),
            ConditionUpdate(
                "Routing",
                "False",
                "RoutingUnavailable",
                "The Gateway API (gateway.networking.k8s.io/v1 HTTPRoute) is not served in "
                f"this cluster: the tiers serve through their Services ({services}).",
            ),
            RoutingStatus(backends=[b.replace("InferencePool", "Service") for b in backends]),
        )
    manifests = tuple(render_routing(isvc, tiers, inference_pools=pools))
    status = RoutingStatus(route=isvc.metadata.name, backends=backends)
    note = ""
    if routing.inference_pool and not snap.inference_pools:
        note = (
            " The InferencePool API (inference.networking.k8s.io/v1) is not served: the "
            "route points at the tiers' Services."
        )
    return Routed(manifests, _condition(_live_route(snap.owned), note), status)


def _condition(live: Mapping[str, Any] | None, note: str) -> ConditionUpdate:
    parents = ((live or {}).get("status") or {}).get("parents") or []
    if not parents:
        return ConditionUpdate(
            "Routing", "Unknown", "Pending", f"Waiting for the Gateway to take the route.{note}"
        )
    for parent in parents:
        found = {c.get("type"): c for c in parent.get("conditions") or []}
        for kind in ("Accepted", "ResolvedRefs"):
            condition = found.get(kind)
            if condition is not None and condition.get("status") != "True":
                gateway = (parent.get("parentRef") or {}).get("name", "?")
                return ConditionUpdate(
                    "Routing",
                    "False",
                    str(condition.get("reason") or f"Not{kind}"),
                    f"Gateway {gateway}: {condition.get('message', '')}{note}".strip(),
                )
    names = ", ".join(str((p.get("parentRef") or {}).get("name", "?")) for p in parents)
    return ConditionUpdate("Routing", "True", "Accepted", f"Accepted by {names}.{note}")


def _live_route(owned: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    return next((o for o in owned if o.get("kind") == "HTTPRoute"), None)
