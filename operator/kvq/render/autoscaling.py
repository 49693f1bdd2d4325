"""The KEDA ScaledObject of an autoscaled InferenceService.

KEDA scales the InferenceService itself, through its scale subresource: the HPA it creates
writes spec.replicas, and kvq runs that many engines. Every trigger is a Prometheus query
that selects exactly this service's engines by kvq's label contract (`namespace`, and
`service` = the engine Service, named after the InferenceService), summed over the
replicas, against a per-replica threshold (AverageValue): the HPA's desired count is then
ceil(sum / threshold). Metric names follow the engine version (the catalog).

With KV offloading (a CPU tier on a V1 engine) the KV-cache usage gauge is no scaling
signal: the tier's purpose is to let the GPU cache run full and serve evicted prefixes
from host memory, so a full GPU cache no longer means a replica is short (users of
llm-d's autoscaler saw vllm:kv_cache_usage_perc sit near 100% with offloading on and scale
up for nothing). The ScaledObject then scales on requests waiting and on requests running
against the sequences one replica holds (the planner's concurrency), which measure what a
user waits for. V0 swap (vLLM 0.8-0.10) changes nothing here: it only catches preempted
sequences.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kvq.api.autoscaling import AutoscalingTargets
from kvq.api.keys import API_VERSION, KIND
from kvq.api.resource import InferenceService
from kvq.api.tiers import TierSpec
from kvq.catalog.engines import EngineMetrics
from kvq.render.leaderworkerset import API_VERSION as LWS_API_VERSION
from kvq.render.leaderworkerset import group_name
from kvq.render.manifests import labels_for, workload_name

SCALED_OBJECT_API = "keda.sh/v1alpha1"
SCALED_OBJECT_KIND = "ScaledObject"
# KEDA's threshold and activation values are strings; the HPA compares milli-units.
_DECIMALS = 3
ACTIVITY_ONLY = 1_000_000.0
OFFLOAD_RUNNING_FRACTION = 0.8
"""The running-fraction target used with KV offloading when the spec gives none."""
OFFLOAD_REQUESTS_WAITING = 2.0
"""The queue target used with KV offloading when nothing else is left (the CRD default)."""


@dataclass(frozen=True)
class PrometheusAccess:
    """How KEDA reaches the Prometheus that scrapes the engines."""

    server_address: str
    """A URL without credentials (KEDA's trigger metadata is not a secret)."""
    authentication: str | None = None
    """A ClusterTriggerAuthentication with Prometheus' credentials, by name, if it needs any."""


def render_scaled_object(
    isvc: InferenceService,
    *,
    metrics: EngineMetrics,
    prometheus: PrometheusAccess,
    concurrency: float | None,
    max_replicas: int,
    tier: TierSpec | None = None,
    offloading: bool = False,
    group: bool = False,
) -> dict[str, Any]:
    """The ScaledObject for `isvc` (which must have spec.autoscaling). `group`: a replica
    spans several nodes, so an extra tier's engine is its LeaderWorkerSet (scaled through
    LWS's scale subresource, a group per replica), not a Deployment.

    `concurrency`: the sequences one replica holds at maxModelLen (the plan of the rung
    that runs), for the running-fraction target. `max_replicas`: spec's maxReplicas, or
    fewer when the pool cannot hold that many. `offloading`: the engine keeps a CPU tier
    by KV offloading; the KV-usage target is then left out (see `scaling_targets`).
    """
    auto = isvc.spec.autoscaling
    assert auto is not None, "render_scaled_object needs spec.autoscaling"
    namespace = isvc.metadata.namespace or ""
    name = workload_name(isvc, tier)
    selector = f'namespace="{namespace}",service="{name}"'
    triggers: list[dict[str, Any]] = []
    targets = scaling_targets(isvc, offloading=offloading, concurrency=concurrency)
    if targets.kv_cache_usage is not None:
        triggers.append(
            _trigger(
                "kv-cache-usage",
                f"sum({metrics.kv_cache_usage}{{{selector}}})",
                targets.kv_cache_usage,
                prometheus,
            )
        )
    if targets.requests_waiting is not None:
        triggers.append(
            _trigger(
                "requests-waiting",
                f"sum({metrics.requests_waiting}{{{selector}}})",
                targets.requests_waiting,
                prometheus,
            )
        )
    if targets.running_fraction is not None and concurrency:
        triggers.append(
            _trigger(
                "requests-running",
                f"sum({metrics.requests_running}{{{selector}}})",
                max(targets.running_fraction * concurrency, 10**-_DECIMALS),
                prometheus,
            )
        )
    spec: dict[str, Any] = {
        # The default tier scales through the InferenceService's scale subresource; an
        # extra tier through its own Deployment (kvq then leaves its replicas alone).
        "scaleTargetRef": (
            {"apiVersion": API_VERSION, "kind": KIND, "name": name}
            if tier is None
            else {
                "apiVersion": LWS_API_VERSION,
                "kind": "LeaderWorkerSet",
                "name": group_name(name),
            }
            if group
            else {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}
        ),
        "pollingInterval": auto.polling_seconds,
        "cooldownPeriod": auto.cooldown_seconds,
        "minReplicaCount": max(auto.min_replicas, 1),
        "maxReplicaCount": max(max_replicas, 1),
        # When KEDA cannot read the signals (Prometheus down), serve at the ceiling rather
        # than guess: never scale a busy service down on missing data.
        "fallback": {"failureThreshold": 3, "replicas": max(max_replicas, 1)},
        "advanced": {
            "horizontalPodAutoscalerConfig": {
                "behavior": {
                    "scaleDown": {
                        "stabilizationWindowSeconds": auto.scale_down_stabilization_seconds
                    }
                }
            }
        },
        "triggers": triggers,
    }
    if auto.min_replicas == 0:
        # Scale to zero only after idleSeconds without a request: an activity trigger that
        # counts requests finished, running or queued in that window.
        spec["idleReplicaCount"] = 0
        window = f"{auto.idle_seconds}s"
        activity = (
            f"sum(increase({metrics.requests_finished}{{{selector}}}[{window}])) "
            f"+ sum({metrics.requests_running}{{{selector}}}) "
            f"+ sum({metrics.requests_waiting}{{{selector}}})"
        )
        # The threshold is out of reach on purpose: this trigger decides activity only,
        # never how many replicas.
        triggers.append(_trigger("activity", activity, ACTIVITY_ONLY, prometheus, activation=0.0))
    return {
        "apiVersion": SCALED_OBJECT_API,
        "kind": SCALED_OBJECT_KIND,
        "metadata": {
            "name": name,
            **({"namespace": namespace} if namespace else {}),
            "labels": labels_for(isvc, tier),
            "annotations": {
                # KEDA would otherwise fight kvq over who may scale the target.
                "scaledobject.keda.sh/transfer-hpa-ownership": "true",
            },
        },
        "spec": spec,
    }


def scaling_targets(
    isvc: InferenceService, *, offloading: bool, concurrency: float | None
) -> AutoscalingTargets:
    """The targets the ScaledObject scales on: the spec's, but with KV offloading without
    the KV-usage gauge, and with running requests against the planned concurrency (0.8
    of it unless the spec says) so that a full replica is still seen."""
    auto = isvc.spec.autoscaling
    assert auto is not None
    targets = auto.targets
    if not offloading:
        return targets
    running = targets.running_fraction
    if running is None and concurrency:
        running = OFFLOAD_RUNNING_FRACTION
    waiting = targets.requests_waiting
    if waiting is None and running is None:
        waiting = OFFLOAD_REQUESTS_WAITING
    return AutoscalingTargets(
        kv_cache_usage=None, requests_waiting=waiting, running_fraction=running
    )


def replicas_with_auto_cache(replicas: int, ratio_vs_auto: float | None) -> int | None:
    """Replicas a KV-bound load would need with the auto cache: fp8 holds `ratio` times the
    tokens, so the same load spread over auto replicas needs that many times more."""
    if ratio_vs_auto is None or replicas <= 0:
        return None
    # Tenths: block rounding makes the ratio 2.001 or 1.999, not a twentieth replica.
    return math.ceil(round(replicas * max(ratio_vs_auto, 1.0), 1))


def _trigger(
    name: str,
    query: str,
    threshold: float,
    prometheus: PrometheusAccess,
    *,
    activation: float | None = None,
) -> dict[str, Any]:
    metadata: dict[str, str] = {
        "serverAddress": prometheus.server_address,
        "query": query,
        "threshold": _number(threshold),
        # A new service has no series yet: that is zero load, not an error.
        "ignoreNullValues": "true",
    }
    if activation is not None:
        metadata["activationThreshold"] = _number(activation)
    trigger: dict[str, Any] = {
        "type": "prometheus",
        "name": name,
        "metricType": "AverageValue",
        "metadata": metadata,
    }
    if prometheus.authentication:
        trigger["authenticationRef"] = {
            "name": prometheus.authentication,
            "kind": "ClusterTriggerAuthentication",
        }
    return trigger


def _number(value: float) -> str:
    rounded = round(value, _DECIMALS)
    return str(int(rounded)) if float(rounded).is_integer() else f"{rounded:g}"


__all__ = [
    "SCALED_OBJECT_API",
    "SCALED_OBJECT_KIND",
    "PrometheusAccess",
    "render_scaled_object",
    "replicas_with_auto_cache",
    "scaling_targets",
]
