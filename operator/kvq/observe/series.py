"""Which Prometheus series belong to an InferenceService, and how its replicas add up.

Label contract: the engine series carry `namespace` (the InferenceService's namespace)
and `service` (the engine Service kvq renders, named after the InferenceService). A
Prometheus Operator ServiceMonitor on that Service sets both itself; a plain scrape
config sets them with relabeling (`__meta_kubernetes_namespace`,
`__meta_kubernetes_service_name`) or as static labels. vLLM's own labels (`engine`,
`model_name`) are left alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kvq.catalog.engines import EngineMetrics
from kvq.decide.metrics import EngineReading

NAMESPACE_LABEL = "namespace"
SERVICE_LABEL = "service"
NAME_LABEL = "__name__"
DTYPE_LABEL = "cache_dtype"
TOKENS_LABEL = "kv_cache_size_tokens"


@dataclass(frozen=True)
class Series:
    """One instant-vector element: its labels and value."""

    labels: Mapping[str, str]
    value: float


def series_query(namespace: str, service: str, metrics: EngineMetrics) -> str:
    """One instant query for every series kvq reads, per replica (aggregated in Python)."""
    names = sorted(
        {
            metrics.kv_cache_usage,
            metrics.requests_running,
            metrics.requests_waiting,
            metrics.cache_config_info,
        }
    )
    return (
        f'{{{NAME_LABEL}=~"{"|".join(names)}",'
        f'{NAMESPACE_LABEL}="{_quoted(namespace)}",{SERVICE_LABEL}="{_quoted(service)}"}}'
    )


def parse_vector(result: Sequence[Mapping[str, Any]]) -> list[Series]:
    """The `result` of an instant query (`[{"metric": {...}, "value": [t, "v"]}]`)."""
    return [Series(labels=dict(item["metric"]), value=float(item["value"][1])) for item in result]


def reading_from_series(
    series: Sequence[Series], metrics: EngineMetrics, observed_at: datetime
) -> EngineReading | None:
    """What the replicas say together; None when Prometheus has no series for them.

    - KV cache usage: the fullest replica (max). It is the one that queues and preempts
      first; a mean would hide one saturated replica behind idle ones.
    - running / waiting requests: the sum over replicas (the service's load).
    - cache dtype: the replicas' common value; None while they differ (a rollout between
      dtypes is in progress, and neither is "the engine's" yet).
    - KV tokens: the smallest replica's. It is a per-replica figure; replicas on like GPUs
      can differ by a few blocks of profiled memory, and the smallest is what every
      replica holds.
    """
    if not series:
        return None

    def values(name: str) -> list[float]:
        found = [s.value for s in series if s.labels.get(NAME_LABEL) == name]
        return [value for value in found if math.isfinite(value)]

    usage = values(metrics.kv_cache_usage)
    running = values(metrics.requests_running)
    waiting = values(metrics.requests_waiting)
    infos = [s.labels for s in series if s.labels.get(NAME_LABEL) == metrics.cache_config_info]
    dtypes = {info[DTYPE_LABEL] for info in infos if info.get(DTYPE_LABEL)}
    tokens = [int(t) for info in infos if (t := info.get(TOKENS_LABEL, "")).isdigit()]
    return EngineReading(
        observed_at=observed_at,
        kv_cache_usage=max(usage) if usage else None,
        requests_running=sum(running) if running else None,
        requests_waiting=sum(waiting) if waiting else None,
        cache_dtype=dtypes.pop() if len(dtypes) == 1 else None,
        kv_tokens=min(tokens) if tokens else None,
    )


def _quoted(value: str) -> str:
    """A PromQL string literal's body (Kubernetes names never need it; be safe anyway)."""
    return value.replace("\\", "\\\\").replace('"', '\\"')
