"""Engine metrics in status: written when they change (at most once a minute), and the
engine's KV capacity checked against the planner's.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from kvq.api.status import CapacityStatus, EffectiveStatus, MetricsStatus
from kvq.decide.conditions import ConditionUpdate
from kvq.fallback.ladder import rfc3339

# Beyond this the planner's figure misleads people: say so in a condition.
CAPACITY_TOLERANCE = 0.05
# Usage moves with every request; smaller moves are not worth a status write.
USAGE_STEP = 0.01


@dataclass(frozen=True)
class EngineReading:
    """What Prometheus says about this InferenceService's engines, at one moment."""

    observed_at: datetime
    kv_cache_usage: float | None = None
    requests_running: float | None = None
    requests_waiting: float | None = None
    cache_dtype: str | None = None
    kv_tokens: int | None = None
    """KV capacity of one replica (vllm:cache_config_info kv_cache_size_tokens)."""


def metrics_status(
    previous: MetricsStatus | None,
    reading: EngineReading | None,
    *,
    min_interval: timedelta,
) -> MetricsStatus | None:
    """The metrics to store: the new reading, or the stored one when a write is not due."""
    if reading is None:
        return previous
    fresh = MetricsStatus(
        kv_cache_usage=_rounded(reading.kv_cache_usage),
        requests_running=reading.requests_running,
        requests_waiting=reading.requests_waiting,
        engine_kv_cache_dtype=reading.cache_dtype,
        engine_kv_tokens=reading.kv_tokens,
        observed_at=rfc3339(reading.observed_at),
    )
    if previous is None or previous.observed_at is None:
        return fresh
    stored_at = datetime.fromisoformat(previous.observed_at)
    if reading.observed_at - stored_at < min_interval or not _changed(previous, fresh):
        return previous
    return fresh


def capacity_condition(
    metrics: MetricsStatus | None,
    capacity: CapacityStatus | None,
    effective: EffectiveStatus | None,
) -> ConditionUpdate | None:
    """CapacityMismatch from the engine's own figures; None while there is nothing to compare.

    The caller asks only once the Deployment runs the current spec on every replica: during
    a rollout the old replicas still report the old capacity.
    """
    if metrics is None or metrics.engine_kv_tokens is None or capacity is None:
        return None
    planned = capacity.kv_tokens
    engine = metrics.engine_kv_tokens
    problems: list[str] = []
    if planned:
        off = abs(engine - planned) / planned
        if off > CAPACITY_TOLERANCE:
            problems.append(
                f"the engine reports {engine:,} KV tokens per replica, kvq planned "
                f"{planned:,} ({off:.0%} off)"
            )
    wanted_dtype = effective.kv_cache_dtype if effective else None
    if (
        metrics.engine_kv_cache_dtype
        and wanted_dtype
        and metrics.engine_kv_cache_dtype != (wanted_dtype)
    ):
        problems.append(
            f"the engine runs a {metrics.engine_kv_cache_dtype} KV cache, kvq rendered "
            f"{wanted_dtype}"
        )
    if problems:
        return ConditionUpdate("CapacityMismatch", "True", "EngineDisagrees", "; ".join(problems))
    if not planned:
        return None
    return ConditionUpdate(
        "CapacityMismatch",
        "False",
        "AsPlanned",
        f"The engine reports {engine:,} KV tokens per replica, within "
        f"{CAPACITY_TOLERANCE:.0%} of the plan.",
    )


def _changed(old: MetricsStatus, new: MetricsStatus) -> bool:
    if (old.engine_kv_cache_dtype, old.engine_kv_tokens) != (
        new.engine_kv_cache_dtype,
        new.engine_kv_tokens,
    ):
        return True
    if (old.requests_running, old.requests_waiting) != (
        new.requests_running,
        new.requests_waiting,
    ):
        return True
    before, after = old.kv_cache_usage, new.kv_cache_usage
    if (before is None) != (after is None):
        return True
    return before is not None and after is not None and abs(after - before) >= USAGE_STEP


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
