"""The status a decision writes, and the Events that tell people what changed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvq.api import keys
from kvq.api.status import (
    CapacityStatus,
    EffectiveStatus,
    FallbackAttempt,
    FallbackStatus,
    IgnoredSetting,
    InferenceServiceStatus,
    PlacementStatus,
)
from kvq.decide.conditions import ConditionUpdate, condition, merge_conditions
from kvq.decide.history import MAX_ATTEMPTS, rfc3339
from kvq.decide.metrics import capacity_condition, metrics_status
from kvq.decide.rungs import RungOutlook
from kvq.decide.types import EventSpec, Snapshot
from kvq.fallback.classifier import Classification
from kvq.fallback.ladder import Rung
from kvq.render import DroppedFlag, EffectiveSettings

# Which spec field a flag the engine lacks came from (status.effective.ignored).
_FLAG_FIELDS = {
    "--swap-space": "spec.memory.swapSpaceGiB",
    "--calculate-kv-scales": "spec.kvCache.calculateScales",
}


@dataclass(frozen=True)
class Outcome:
    """What decide() concluded, before it is written as status."""

    rung: Rung | None = None
    outlook: RungOutlook | None = None
    effective: EffectiveSettings | None = None
    args: tuple[str, ...] = ()
    dropped: tuple[DroppedFlag, ...] = ()
    pod_hash: str | None = None
    failure: Classification | None = None
    fallback_disabled: bool = False
    exhausted: bool = False
    ladder_reason: str | None = None
    not_placed: str | None = None
    blocked: tuple[str, str] | None = None
    """(reason, message) when kvq cannot even plan: unknown engine version or model."""


def build_status(
    snap: Snapshot,
    previous: InferenceServiceStatus,
    outcome: Outcome,
    new_attempts: Sequence[FallbackAttempt],
) -> InferenceServiceStatus:
    generation = snap.isvc.metadata.generation or 1
    attempts = [*(previous.fallback.attempts if previous.fallback else []), *new_attempts]
    placed = outcome.outlook is not None and outcome.outlook.choice.chosen is not None
    updates = [
        _ready(snap, outcome),
        _placed(outcome),
        _fallback_active(outcome, attempts, generation),
        _degraded(outcome),
    ]
    replicas, ready_replicas = _replica_counts(snap.deployment)
    effective = _effective(outcome) if placed else previous.effective
    capacity = _capacity(outcome) if placed else previous.capacity
    metrics = metrics_status(
        previous.metrics, snap.engine_metrics, min_interval=snap.config.metrics_min_interval
    )
    mismatch = capacity_condition(metrics, capacity, effective)
    if mismatch is not None and _rolled_out(snap, outcome):
        updates.append(mismatch)
    return InferenceServiceStatus(
        observed_generation=generation,
        conditions=merge_conditions(
            previous.conditions, updates, generation=generation, now=rfc3339(snap.now)
        ),
        effective=effective,
        placement=_placement(outcome) if placed else previous.placement,
        capacity=capacity,
        fallback=FallbackStatus(
            active_rung=outcome.rung.value if outcome.rung not in (None, Rung.REQUESTED) else None,
            attempts=attempts[-MAX_ATTEMPTS:],
        ),
        metrics=metrics,
        replicas=replicas,
        ready_replicas=ready_replicas,
    )


def decision_events(
    previous: InferenceServiceStatus,
    status: InferenceServiceStatus,
    new_attempts: Sequence[FallbackAttempt],
) -> tuple[EventSpec, ...]:
    """Events for what changed between the stored status and the new one; none at rest."""
    events: list[EventSpec] = []
    for attempt in new_attempts:
        if attempt.to == "none":
            events.append(EventSpec("Warning", "FallbackExhausted", attempt.reason))
        else:
            kind = "FallbackStatic" if attempt.static else "FallbackRuntime"
            events.append(EventSpec("Warning", kind, attempt.reason))
    before = {c.type: c for c in previous.conditions}
    for now in status.conditions:
        old = before.get(now.type)
        if old is not None and (old.status, old.reason) == (now.status, now.reason):
            continue
        if now.type == "Placed" and now.status == "True":
            events.append(EventSpec("Normal", "Placed", now.message))
        elif now.type == "CapacityMismatch" and now.status == "True":
            events.append(EventSpec("Warning", "CapacityMismatch", now.message))
        elif (now.type == "Placed" and now.status == "False") or (
            now.type == "Degraded" and now.status == "True" and not new_attempts
        ):
            events.append(EventSpec("Warning", now.reason, now.message))
        elif now.type == "Ready" and now.status == "True":
            events.append(EventSpec("Normal", "Ready", now.message))
    old_ignored = previous.effective.ignored if previous.effective else []
    new_ignored = status.effective.ignored if status.effective else []
    for ignored in new_ignored:
        if ignored not in old_ignored:
            message = f"{ignored.field} is not rendered: {ignored.reason}"
            events.append(EventSpec("Normal", "SettingIgnored", message))
    return tuple(events)


def _ready(snap: Snapshot, outcome: Outcome) -> ConditionUpdate:
    if outcome.blocked or outcome.not_placed or outcome.exhausted:
        return ConditionUpdate("Ready", "False", "NotDeployable", _why_not(outcome))
    want = snap.isvc.spec.replicas
    if want == 0:
        return ConditionUpdate("Ready", "True", "ScaledToZero", "spec.replicas is 0.")
    ready = int((snap.deployment or {}).get("status", {}).get("readyReplicas") or 0)
    if _rolled_out(snap, outcome):
        assert outcome.effective is not None and outcome.outlook is not None
        pool = outcome.outlook.choice.chosen
        where = f" on pool {pool.pool.name}" if pool else ""
        message = (
            f"{ready}/{want} replicas ready{where}, KV cache {outcome.effective.kv_cache_dtype}, "
            f"model {outcome.effective.model_uri}."
        )
        return ConditionUpdate("Ready", "True", "Available", message)
    if outcome.failure is not None:
        return ConditionUpdate("Ready", "False", str(outcome.failure.kind), outcome.failure.reason)
    return ConditionUpdate(
        "Ready", "False", "Progressing", f"{ready}/{want} replicas of the current spec ready."
    )


def _rolled_out(snap: Snapshot, outcome: Outcome) -> bool:
    """Every replica runs the current rendering and is available."""
    want = snap.isvc.spec.replicas
    deployment = snap.deployment or {}
    template = deployment.get("spec", {}).get("template", {}).get("metadata", {})
    live_hash = (template.get("annotations") or {}).get(keys.ANNOTATION_SPEC_HASH)
    st = deployment.get("status") or {}
    return (
        outcome.pod_hash is not None
        and live_hash == outcome.pod_hash
        and st.get("observedGeneration", 0) >= deployment.get("metadata", {}).get("generation", 1)
        and st.get("updatedReplicas", 0) >= want
        and st.get("readyReplicas", 0) >= want
        and st.get("availableReplicas", 0) >= want
    )


def _placed(outcome: Outcome) -> ConditionUpdate:
    if outcome.blocked:
        return ConditionUpdate("Placed", "False", outcome.blocked[0], outcome.blocked[1])
    if outcome.not_placed is not None:
        message = outcome.ladder_reason or outcome.not_placed
        if outcome.ladder_reason and outcome.not_placed not in outcome.ladder_reason:
            message = f"{outcome.ladder_reason} ({outcome.not_placed})"
        return ConditionUpdate("Placed", "False", "NoPoolFits", message)
    assert outcome.outlook is not None and outcome.outlook.choice.chosen is not None
    chosen = outcome.outlook.choice.chosen
    plan = chosen.plan
    assert plan is not None
    message = (
        f"Pool {chosen.pool.name} ({chosen.pool.gpu.product}, compute capability "
        f"{chosen.pool.gpu.compute_capability_str}) with a {outcome.outlook.kv_cache_dtype} KV "
        f"cache: {plan.kv_tokens:,} KV tokens, {plan.max_concurrency:.1f} sequences of "
        f"{plan.max_model_len:,} tokens per replica."
    )
    return ConditionUpdate("Placed", "True", "PoolChosen", message)


def _fallback_active(
    outcome: Outcome, attempts: Sequence[FallbackAttempt], generation: int
) -> ConditionUpdate:
    mine = [a for a in attempts if a.generation == generation]
    if outcome.rung in (None, Rung.REQUESTED) or not mine:
        return ConditionUpdate("FallbackActive", "False", "AsRequested", "No fallback in force.")
    last = mine[-1]
    reason = "StaticFallback" if last.static else "RuntimeFallback"
    return ConditionUpdate("FallbackActive", "True", reason, last.reason)


def _degraded(outcome: Outcome) -> ConditionUpdate:
    if outcome.exhausted:
        return ConditionUpdate(
            "Degraded", "True", "FallbackExhausted", outcome.ladder_reason or _why_not(outcome)
        )
    if outcome.failure is not None:
        reason = str(outcome.failure.kind)
        message = outcome.failure.reason
        if outcome.fallback_disabled:
            message += " Fallback is disabled for this service (spec.fallback.enabled: false)."
        return ConditionUpdate("Degraded", "True", reason, message)
    return ConditionUpdate("Degraded", "False", "Healthy", "No failure observed.")


def _why_not(outcome: Outcome) -> str:
    if outcome.blocked:
        return outcome.blocked[1]
    return outcome.ladder_reason or outcome.not_placed or "Not deployable."


def _effective(outcome: Outcome) -> EffectiveStatus:
    effective = outcome.effective
    assert effective is not None
    engine_dtype = effective.kv_cache_dtype
    if "--kv-cache-dtype" in outcome.args:
        engine_dtype = outcome.args[outcome.args.index("--kv-cache-dtype") + 1]
    return EffectiveStatus(
        kv_cache_dtype=engine_dtype,
        model_uri=effective.model_uri,
        quantization=effective.quantization,
        engine_version=effective.engine_version,
        image=effective.image,
        engine_args=list(outcome.args),
        args_hash=outcome.pod_hash,
        ignored=[
            IgnoredSetting(field=_FLAG_FIELDS.get(d.flag, d.flag), reason=d.reason)
            for d in outcome.dropped
        ],
    )


def _placement(outcome: Outcome) -> PlacementStatus:
    assert outcome.outlook is not None and outcome.outlook.choice.chosen is not None
    pool = outcome.outlook.choice.chosen.pool
    return PlacementStatus.model_validate(
        {
            "pool": pool.name,
            "gpuProduct": pool.gpu.product,
            "computeCapability": pool.gpu.compute_capability_str,
            "gpuMemoryMiB": pool.gpu.memory_mib,
        }
    )


def _capacity(outcome: Outcome) -> CapacityStatus:
    assert outcome.outlook is not None and outcome.outlook.choice.chosen is not None
    plan = outcome.outlook.choice.chosen.plan
    assert plan is not None
    return CapacityStatus(
        kv_bytes_per_token=plan.kv_bytes_per_token,
        kv_tokens=plan.kv_tokens,
        max_concurrent_sequences=round(plan.max_concurrency, 2),
        ratio_vs_auto=round(plan.ratio_vs_auto, 3),
        max_model_len=plan.max_model_len,
    )


def _replica_counts(deployment: Mapping[str, Any] | None) -> tuple[int | None, int | None]:
    if not deployment:
        return None, None
    st = deployment.get("status") or {}
    return int(st.get("replicas") or 0), int(st.get("readyReplicas") or 0)


__all__ = ["Outcome", "build_status", "condition", "decision_events"]
