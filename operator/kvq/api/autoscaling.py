"""`spec.autoscaling`: scaling the replicas on the engine's own signals (KEDA)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from kvq.api.base import KubeModel
from kvq.api.rules import FieldRule, Rule


class AutoscalingTargets(KubeModel):
    """What one replica should carry; the autoscaler adds replicas when the load asks for more.

    Each target is per replica, averaged over the replicas (KEDA's AverageValue): a target
    of 0.7 KV-cache usage with two replicas at 0.9 asks for three.
    """

    kube_rules = (
        Rule(
            cel="has(self.kvCacheUsage) || has(self.requestsWaiting) || has(self.runningFraction)",
            message="give at least one target: kvCacheUsage, requestsWaiting or runningFraction",
            check=lambda t: (
                t.kv_cache_usage is not None
                or t.requests_waiting is not None
                or t.running_fraction is not None
            ),
        ),
    )

    kv_cache_usage: Annotated[
        float | None,
        FieldRule(
            cel="self > 0.0 && self <= 1.0",
            message="kvCacheUsage is a fraction of the KV cache: greater than 0, at most 1",
            check=lambda v: 0.0 < v <= 1.0,
        ),
    ] = None
    """KV-cache usage per replica (vllm:kv_cache_usage_perc, 0-1)."""
    requests_waiting: Annotated[
        float | None,
        FieldRule(
            cel="self > 0.0 && self <= 10000.0",
            message="requestsWaiting must be greater than 0 (queued requests per replica)",
            check=lambda v: 0.0 < v <= 10_000.0,
        ),
    ] = None
    """Requests queued per replica (vllm:num_requests_waiting)."""
    running_fraction: Annotated[
        float | None,
        FieldRule(
            cel="self > 0.0 && self <= 1.0",
            message="runningFraction is a fraction of the concurrency kvq planned per "
            "replica: greater than 0, at most 1",
            check=lambda v: 0.0 < v <= 1.0,
        ),
    ] = None
    """Running requests per replica as a fraction of the sequences one replica holds at
    maxModelLen (status.capacity.maxConcurrentSequences): 0.8 adds a replica when each is
    80% full. The figure follows the KV dtype that runs: fp8 holds twice the sequences."""


class AutoscalingSpec(KubeModel):
    """Scale the replicas on the engine's own signals, with KEDA (its ScaledObject is kvq's).

    The autoscaler owns spec.replicas (through the scale subresource); kvq runs what it
    asks, within [minReplicas, maxReplicas]. Needs KEDA in the cluster and a Prometheus
    that scrapes the engines (`kvq run --prometheus-url`).
    """

    kube_rules = (
        Rule(
            cel="self.minReplicas <= self.maxReplicas",
            message="minReplicas must not be above maxReplicas",
            check=lambda a: a.min_replicas <= a.max_replicas,
            field_path=".minReplicas",
        ),
        Rule(
            cel="self.minReplicas > 0 || has(self.idleSeconds)",
            message="minReplicas 0 (scale to zero) needs idleSeconds: how long without a "
            "request before the last replica goes",
            check=lambda a: a.min_replicas > 0 or a.idle_seconds is not None,
            field_path=".idleSeconds",
        ),
    )

    min_replicas: Annotated[int, Field(ge=0, le=1000)] = 1
    """Fewest replicas; 0 scales to zero after idleSeconds without requests."""
    max_replicas: Annotated[int, Field(ge=1, le=1000)]
    """Most replicas (also bounded by the GPUs the pool can offer: status says when)."""
    targets: AutoscalingTargets = Field(
        default_factory=lambda: AutoscalingTargets(kv_cache_usage=0.8, requests_waiting=2),
        json_schema_extra={"default": {"kvCacheUsage": 0.8, "requestsWaiting": 2}},
    )
    """Per-replica targets; a replica is added when any is exceeded."""
    scale_down_stabilization_seconds: Annotated[int, Field(ge=0, le=3600)] = 300
    """How long the load must stay low before replicas are removed (HPA behaviour)."""
    cooldown_seconds: Annotated[int, Field(ge=0, le=86400)] = 300
    """After the last activity, how long before scaling to zero (KEDA cooldownPeriod)."""
    idle_seconds: Annotated[int | None, Field(ge=60, le=86400)] = None
    """Scale to zero only when no request arrived in this window (with minReplicas 0)."""
    polling_seconds: Annotated[int, Field(ge=5, le=600)] = 15
    """How often KEDA reads the signals."""
