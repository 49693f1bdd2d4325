"""decide(): one InferenceService's snapshot in, the plan to carry out.

The default tier (the spec itself) and every extra tier (spec.tiers) are decided on their
own, each with its placement, ladder and status (decide.workload); the route through a
Gateway joins them (decide.routing). The service's own conditions speak for all tiers:
Ready only when every tier is, Stalled when any tier needs a person.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

from kvq.api import keys
from kvq.api.resource import InferenceService
from kvq.api.status import Condition, InferenceServiceStatus, TierStatus
from kvq.api.tiers import TierSpec
from kvq.decide.conditions import ConditionUpdate, condition, merge_conditions
from kvq.decide.engine_workload import live_engine
from kvq.decide.manifests import owned_by
from kvq.decide.routing import ROUTE_KINDS, route
from kvq.decide.types import EventSpec, ObjectRef, Plan, Snapshot
from kvq.decide.workload import decide_workload
from kvq.fallback.ladder import rfc3339
from kvq.placement.claims import GpuClaim
from kvq.render.manifests import workload_name

# Conditions kvq writes only while the spec asks for what they describe.
_OPTIONAL = {"Autoscaling": "autoscaling", "Routing": "routing", "QualityVerified": "quality"}


def decide(snap: Snapshot) -> Plan:
    isvc = snap.isvc
    spec = isvc.spec
    previous = isvc.status or InferenceServiceStatus()
    default = decide_workload(_view(snap, None, previous))
    tiered = [
        (tier, decide_workload(_view(snap, tier, _stored_tier(previous, tier.name)), tier))
        for tier in spec.tiers
    ]
    routed = route(snap, spec.tiers)
    if not tiered and routed.condition is None and not previous.tiers and not _leftovers(snap):
        return _without_stale(snap, previous, default)
    return _join(snap, previous, default, tiered, routed)


def _view(snap: Snapshot, tier: TierSpec | None, stored: InferenceServiceStatus) -> Snapshot:
    """The snapshot one workload sees: its spec, its stored status, its pods and objects."""
    isvc = snap.isvc
    name = workload_name(isvc, tier)
    mine = tier.name if tier else None
    owned = [o for o in snap.owned if _tier_of(o) == mine and o.get("kind") not in ROUTE_KINDS]
    view = replace(snap, pods=[p for p in snap.pods if _tier_of(p) == mine], owned=owned)
    if tier is None:
        return view  # the reconcile found the default tier's Deployment already
    deployment = live_engine(owned, name)
    replicas = tier.replicas
    if tier.autoscaling is not None and snap.keda and deployment is not None:
        # KEDA scales an autoscaled tier's Deployment or LeaderWorkerSet itself (kvq applies
        # no replicas): the tier wants what KEDA set (spec.replicas is the default tier's).
        replicas = int((deployment.get("spec") or {}).get("replicas", tier.replicas))
    spec = isvc.spec.model_copy(
        update={
            "kv_cache": tier.kv_cache,
            "replicas": replicas,
            "autoscaling": tier.autoscaling,
            "tiers": [],
            "routing": None,
        }
    )
    derived = isvc.model_copy(update={"spec": spec, "status": stored})
    # Engine metrics are read per service; an extra tier's are not in status.metrics.
    return replace(view, isvc=derived, deployment=deployment, engine_metrics=None)


def _stored_tier(previous: InferenceServiceStatus, name: str) -> InferenceServiceStatus:
    found = next((t for t in previous.tiers if t.name == name), None)
    if found is None:
        return InferenceServiceStatus()
    return InferenceServiceStatus(
        conditions=found.conditions,
        effective=found.effective,
        placement=found.placement,
        capacity=found.capacity,
        fallback=found.fallback,
        autoscaling=found.autoscaling,
    )


def _join(
    snap: Snapshot,
    previous: InferenceServiceStatus,
    default: Plan,
    tiered: Sequence[tuple[TierSpec, Plan]],
    routed: Any,
) -> Plan:
    isvc = snap.isvc
    status = default.service_status
    tiers = [_tier_status(tier, plan) for tier, plan in tiered]
    ready = [_is_ready(status.conditions)] + [_is_ready(t.conditions) for t in tiers]
    updates = _overall(status.conditions, tiers)
    if routed.condition is not None:
        updates.append(routed.condition)
    conditions = _merged(previous.conditions, status.conditions, updates, snap)
    status = status.model_copy(
        update={
            "conditions": _applicable(conditions, isvc),
            "tiers": tiers,
            "tiers_ready": f"{sum(ready)}/{len(ready)}" if tiers else None,
            "routing": routed.status,
        }
    )
    events = list(default.events)
    for tier, plan in tiered:
        events += [replace(e, message=f"Tier {tier.name}: {e.message}") for e in plan.events]
    events += _routing_events(previous, status)
    routing = tuple(owned_by(isvc, m) for m in routed.manifests)
    tiers_plans = [plan for _, plan in tiered]
    apply = (*default.apply, *(m for _, plan in tiered for m in plan.apply), *routing)
    return Plan(
        apply=apply,
        delete=(
            *default.delete,
            *(ref for _, plan in tiered for ref in plan.delete),
            *_leftovers(snap, wanted=routing),
        ),
        service_status=status,
        events=tuple(events),
        fetch_log_tails=tuple(
            dict.fromkeys(
                [*default.fetch_log_tails, *(p for _, plan in tiered for p in plan.fetch_log_tails)]
            )
        ),
        # The service's status speaks for the default tier's placement and fallback.
        next_check=replace(
            default.next_check,
            after=_soonest([plan.next_check.after for plan in (default, *tiers_plans)]),
        ),
        status_first=default.status_first or any(plan.status_first for _, plan in tiered),
        pool=default.pool,
        claims=_claims([default, *tiers_plans]),
    )


def _tier_status(tier: TierSpec, plan: Plan) -> TierStatus:
    found = plan.service_status
    return TierStatus(
        name=tier.name,
        conditions=found.conditions,
        effective=found.effective,
        placement=found.placement,
        capacity=found.capacity,
        fallback=found.fallback,
        autoscaling=found.autoscaling,
        replicas=found.replicas,
        ready_replicas=found.ready_replicas,
    )


def _overall(own: Sequence[Condition], tiers: Sequence[TierStatus]) -> list[ConditionUpdate]:
    """The service's Ready, Reconciling and Stalled when extra tiers have their say."""
    updates: list[ConditionUpdate] = []
    stalled_tier = next(
        (
            (t, c)
            for t in tiers
            if (c := condition(t.conditions, "Stalled")) is not None and c.status == "True"
        ),
        None,
    )
    unready = [t for t in tiers if not _is_ready(t.conditions)]
    own_stalled = condition(own, "Stalled")
    stalled = stalled_tier is not None or (own_stalled is not None and own_stalled.status == "True")
    if stalled_tier is not None and not (own_stalled and own_stalled.status == "True"):
        tier, found = stalled_tier
        updates.append(
            ConditionUpdate("Stalled", "True", found.reason, f"Tier {tier.name}: {found.message}")
        )
    if unready and _is_ready(own):
        first = unready[0]
        ready = condition(first.conditions, "Ready")
        why = ready.message if ready else "not decided yet"
        updates.append(
            ConditionUpdate("Ready", "False", "TierNotReady", f"Tier {first.name}: {why}")
        )
        if not stalled:
            updates.append(
                ConditionUpdate(
                    "Reconciling", "True", "TierReconciling", f"Tier {first.name}: {why}"
                )
            )
    if stalled:
        updates.append(ConditionUpdate("Reconciling", "False", "Stalled", "A person is needed."))
    return updates


def _merged(
    stored: Sequence[Condition],
    computed: Sequence[Condition],
    updates: Sequence[ConditionUpdate],
    snap: Snapshot,
) -> list[Condition]:
    """`computed`, with `updates` on top; an update keeps the stored transition time when
    the stored condition already had its status."""
    generation = snap.isvc.metadata.generation or 1
    final = {c.type: c for c in computed}
    for update in updates:
        (merged,) = [
            c
            for c in merge_conditions(
                stored, [update], generation=generation, now=rfc3339(snap.now)
            )
            if c.type == update.type
        ]
        final[update.type] = merged
    return merge_conditions(list(final.values()), [], generation=generation, now=rfc3339(snap.now))


def _applicable(conditions: Sequence[Condition], isvc: InferenceService) -> list[Condition]:
    """Without spec.autoscaling or spec.routing, their conditions go."""
    return [
        c
        for c in conditions
        if c.type not in _OPTIONAL or getattr(isvc.spec, _OPTIONAL[c.type]) is not None
    ]


def _without_stale(snap: Snapshot, previous: InferenceServiceStatus, plan: Plan) -> Plan:
    status = plan.service_status
    kept = _applicable(status.conditions, snap.isvc)
    if len(kept) == len(status.conditions):
        return plan
    return replace(plan, service_status=status.model_copy(update={"conditions": kept}))


def _leftovers(snap: Snapshot, wanted: Sequence[Mapping[str, Any]] = ()) -> list[ObjectRef]:
    """Objects of tiers no longer in the spec, and route objects no longer rendered."""
    tiers = {t.name for t in snap.isvc.spec.tiers}
    keep = {(o["kind"], o["metadata"]["name"]) for o in wanted}
    refs = []
    for obj in snap.owned:
        tier = _tier_of(obj)
        gone_tier = tier is not None and tier not in tiers
        stale_route = (
            obj.get("kind") in ROUTE_KINDS and (obj["kind"], obj["metadata"]["name"]) not in keep
        )
        if gone_tier or stale_route:
            meta = obj["metadata"]
            refs.append(ObjectRef(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"]))
    return refs


def _routing_events(
    previous: InferenceServiceStatus, status: InferenceServiceStatus
) -> list[EventSpec]:
    before = condition(previous.conditions, "Routing")
    now = condition(status.conditions, "Routing")
    if now is None or (
        before is not None and (before.status, before.reason) == (now.status, now.reason)
    ):
        return []
    if now.status == "True":
        return [EventSpec("Normal", "RouteAccepted", now.message)]
    if now.status == "False":
        return [EventSpec("Warning", now.reason, now.message)]
    return []


def _is_ready(conditions: Sequence[Condition]) -> bool:
    found = condition(conditions, "Ready")
    return found is not None and found.status == "True"


def _tier_of(obj: Mapping[str, Any]) -> str | None:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    value = labels.get(keys.LABEL_TIER)
    return str(value) if value else None


def _claims(workloads: Sequence[Plan]) -> tuple[GpuClaim, ...] | None:
    """What the service's engines claim: known only when every engine applied has its
    claims known (an autoscaler's replicas are the watch's to tell)."""
    applied = [plan.claims for plan in workloads if plan.apply]
    if not applied or any(claims is None for claims in applied):
        return None
    return tuple(claim for claims in applied if claims is not None for claim in claims)


def _soonest(values: Sequence[timedelta | None]) -> timedelta | None:
    found = [v for v in values if v is not None]
    return min(found) if found else None


__all__ = ["decide"]
