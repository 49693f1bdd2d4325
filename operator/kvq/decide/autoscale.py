"""Autoscaling of one InferenceService: its ScaledObject, its condition and its status.

Nothing here crashes or loops when something is missing: no KEDA in the cluster, no
Prometheus for the operator, no series yet for a new service, a ScaledObject KEDA cannot
serve; each is a reason on the `Autoscaling` condition, and the service runs spec.replicas
within the bounds meanwhile.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvq.api.autoscaling import AutoscalingTargets
from kvq.api.resource import InferenceService
from kvq.api.status import (
    AutoscalingSignals,
    AutoscalingStatus,
    IgnoredSetting,
    MetricsStatus,
)
from kvq.api.tiers import TierSpec
from kvq.decide.conditions import ConditionUpdate
from kvq.decide.types import Manifest, Snapshot
from kvq.placement.choice import PoolVerdict
from kvq.render.autoscaling import (
    SCALED_OBJECT_KIND,
    render_scaled_object,
    replicas_with_auto_cache,
    scaling_targets,
)
from kvq.render.manifests import replica_nodes
from kvq.render.settings import engine_image_and_version, host_tier_of


@dataclass(frozen=True)
class Autoscaled:
    manifest: Manifest | None
    """The ScaledObject to apply (None: nothing to scale with)."""
    condition: ConditionUpdate
    status: AutoscalingStatus
    ignored: tuple[IgnoredSetting, ...] = ()
    """Targets the ScaledObject does not scale on, and why (status.effective.ignored)."""


KV_USAGE_TARGET = "spec.autoscaling.targets.kvCacheUsage"
OFFLOADING_NOTE = (
    "with the CPU tier (memory.swapSpaceGiB: KV offloading) the GPU KV cache is meant to run "
    "full, its usage gauge says nothing about load: kvq scales on requests waiting and on "
    "requests running against the sequences one replica holds"
)


def autoscale(
    snap: Snapshot,
    verdict: PoolVerdict,
    tier: TierSpec | None = None,
    planned: InferenceService | None = None,
) -> Autoscaled | None:
    """The autoscaling outcome, or None when the spec asks for none. An extra tier's
    ScaledObject scales the tier's Deployment, or its LeaderWorkerSet when a replica spans
    nodes (the InferenceService's scale subresource is the default tier's).

    `planned`: the service with the layout kvq derived on the verdict's pool (what is
    rendered); its nodes per replica say which workload KEDA scales. The pool's cap
    (status.autoscaling.poolMaxReplicas) is the verdict's room, counted per replica in
    whole nodes of the layout (placement.choice)."""
    isvc = planned or snap.isvc
    auto = isvc.spec.autoscaling
    if auto is None:
        return None
    plan = verdict.plan
    desired = isvc.spec.desired_replicas()
    pool_max = verdict.slots
    limited = pool_max < auto.max_replicas and desired >= pool_max
    status = AutoscalingStatus(
        current_replicas=int(((snap.deployment or {}).get("status") or {}).get("replicas") or 0),
        desired_replicas=desired,
        pool_max_replicas=pool_max,
        limited_by="pool" if limited else "load",
        replicas_with_auto_cache=replicas_with_auto_cache(
            desired, plan.ratio_vs_auto if plan else None
        ),
    )
    if not snap.keda:
        return Autoscaled(
            None,
            ConditionUpdate(
                "Autoscaling",
                "False",
                "AutoscalingUnavailable",
                "KEDA's ScaledObject API is not served in this cluster: install KEDA to "
                f"scale on load. kvq runs {desired} replica(s) (spec.replicas within "
                f"[{auto.min_replicas}, {auto.max_replicas}]) meanwhile.",
            ),
            status,
        )
    prometheus = snap.config.autoscaling_prometheus
    if prometheus is None:
        return Autoscaled(
            None,
            ConditionUpdate(
                "Autoscaling",
                "False",
                "PrometheusUnavailable",
                "The operator has no Prometheus (kvq run --prometheus-url, chart value "
                "engineMetrics.prometheusUrl): KEDA would have nothing to read. kvq runs "
                f"{desired} replica(s) meanwhile.",
            ),
            status,
        )
    image, version = engine_image_and_version(isvc)
    capability = snap.catalogs.engines.capability(version)
    cpu_tier = host_tier_of(isvc, capability, image)
    offloading = cpu_tier is not None and cpu_tier.mode == "offload"
    concurrency = plan.max_concurrency if plan else None
    manifest = render_scaled_object(
        isvc,
        metrics=capability.metrics,
        prometheus=prometheus,
        concurrency=concurrency,
        max_replicas=auto.max_replicas,
        tier=tier,
        offloading=offloading,
        group=replica_nodes(isvc, verdict.pool) > 1,
    )
    used = scaling_targets(isvc, offloading=offloading, concurrency=concurrency)
    status = status.model_copy(
        update={"scaled_object": manifest["metadata"]["name"], "signals_used": _signals(used)}
    )
    ignored = (
        (IgnoredSetting(field=KV_USAGE_TARGET, reason=OFFLOADING_NOTE),)
        if offloading and auto.targets.kv_cache_usage is not None
        else ()
    )
    return Autoscaled(
        manifest, _condition(snap, status, pool_max, auto.max_replicas), status, ignored
    )


def _signals(targets: AutoscalingTargets) -> list[str]:
    """The engine signals the ScaledObject scales on, by the spec's target names."""
    return [
        name
        for name, value in (
            ("kvCacheUsage", targets.kv_cache_usage),
            ("requestsWaiting", targets.requests_waiting),
            ("runningFraction", targets.running_fraction),
        )
        if value is not None
    ]


def _condition(
    snap: Snapshot, status: AutoscalingStatus, pool_max: int, max_replicas: int
) -> ConditionUpdate:
    live = _live_scaled_object(snap.owned)
    keda = {c.get("type"): c for c in ((live or {}).get("status") or {}).get("conditions") or []}
    if live is None or "Ready" not in keda:
        return ConditionUpdate(
            "Autoscaling", "Unknown", "Pending", "Waiting for KEDA to take the ScaledObject."
        )
    if keda["Ready"].get("status") != "True":
        return ConditionUpdate(
            "Autoscaling",
            "False",
            "ScaledObjectNotReady",
            f"KEDA cannot serve the ScaledObject: {keda['Ready'].get('message', '')}".strip(),
        )
    if keda.get("Fallback", {}).get("status") == "True":
        return ConditionUpdate(
            "Autoscaling",
            "False",
            "SignalsUnavailable",
            "KEDA cannot read the engine signals from Prometheus; it serves the fallback "
            f"of {max_replicas} replica(s) until it can.",
        )
    if snap.engine_metrics is None and (
        snap.isvc.status is None or snap.isvc.status.metrics is None
    ):
        return ConditionUpdate(
            "Autoscaling",
            "True",
            "MetricsPending",
            "Scaling is set up; the engines have not reported signals yet (a new service, "
            "or Prometheus has not scraped them): the minimum runs.",
        )
    if status.limited_by == "pool":
        return ConditionUpdate(
            "Autoscaling",
            "True",
            "LimitedByPool",
            f"The pool holds {pool_max} replica(s) now, fewer than maxReplicas "
            f"{max_replicas}: the pool, not the load, is the limit.",
        )
    return ConditionUpdate(
        "Autoscaling",
        "True",
        "Active",
        f"{status.desired_replicas} replica(s) for the load (status.autoscaling.signals).",
    )


def signals_from(metrics: MetricsStatus | None) -> AutoscalingSignals | None:
    """The signals as status.metrics stores them (written when they move, at most once a
    minute: autoscaling status never churns faster than the metrics do)."""
    if metrics is None or metrics.observed_at is None:
        return None
    return AutoscalingSignals(
        kv_cache_usage=metrics.kv_cache_usage,
        requests_waiting=metrics.requests_waiting,
        requests_running=metrics.requests_running,
        observed_at=metrics.observed_at,
    )


def _live_scaled_object(owned: Any) -> Mapping[str, Any] | None:
    return next((o for o in owned if o.get("kind") == SCALED_OBJECT_KIND), None)
