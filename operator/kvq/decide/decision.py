"""The status kvq writes: what decide() concluded, as conditions people and tools read.

Conditions follow kstatus (what Flux, cli-utils and `kubectl wait` read): `Ready` says the
service serves; `Reconciling` is True while kvq works toward the spec (a rollout, a wait for
capacity, counting crashes); `Stalled` is True when it cannot get there without a person
(no pool can run it, a credential or setting to fix). `Placed`, `FallbackActive`,
`Degraded` and `CapacityMismatch` say why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kvq.api import keys
from kvq.api.credentials import redact_args, redact_text
from kvq.api.status import (
    CapacityStatus,
    CpuTierStatus,
    EffectiveStatus,
    FailureTally,
    FallbackAttempt,
    FallbackStatus,
    GpuTierStatus,
    IgnoredSetting,
    InferenceServiceStatus,
    LayoutStatus,
    PlacementStatus,
)
from kvq.api.tiers import TierSpec
from kvq.catalog.fp8_accuracy import AccuracyFact
from kvq.decide.accuracy import CONDITION as ACCURACY_CONDITION
from kvq.decide.accuracy import risk_condition, risk_status
from kvq.decide.autoscale import Autoscaled, signals_from
from kvq.decide.conditions import ConditionUpdate, merge_conditions
from kvq.decide.manifests import Rendered
from kvq.decide.metrics import capacity_condition, metrics_status
from kvq.decide.place import RungPlacement
from kvq.decide.quality import QualityGate
from kvq.decide.types import Snapshot
from kvq.fallback.classifier import Action, Classification
from kvq.fallback.ladder import NONE, Rung, rfc3339
from kvq.placement.pool import nodes_per_replica
from kvq.planner.capacity import CapacityPlan
from kvq.planner.host_tier import HostTierPlan
from kvq.render.manifests import selector_for

# Status lives in etcd: keep the newest moves only (several keys' worth).
MAX_ATTEMPTS = 20
WAITING = "WaitingForCapacity"

# Which spec field a flag the engine lacks came from (status.effective.ignored).
_FLAG_FIELDS = {
    "--calculate-kv-scales": "spec.kvCache.calculateScales",
}


@dataclass(frozen=True)
class Decision:
    """What decide() concluded, before it is written as status."""

    key: str | None = None
    rung: Rung | None = None
    placement: RungPlacement | None = None
    rendered: Rendered | None = None
    waiting: bool = False
    """The rung cannot run now and kvq waits for it (Placed=False, WaitingForCapacity)."""
    exhausted: bool = False
    ladder_reason: str = ""
    moves: tuple[FallbackAttempt, ...] = ()
    failure: Classification | None = None
    """A failure of the current rung's engines that moved nothing."""
    rung_of_failure: Rung | None = None
    fallback_disabled: bool = False
    tally: FailureTally | None = None
    retry_token: str | None = None
    reset_at: datetime | None = None
    blocked: tuple[str, str] | None = None
    """(reason, message) when kvq cannot even plan: unknown engine version or model."""
    autoscaled: Autoscaled | None = None
    """The autoscaling outcome, with spec.autoscaling."""
    tier: TierSpec | None = None
    """The extra tier this decision is about (None: the default tier)."""
    quality: QualityGate | None = None
    """The quality gate's verdict (with spec.quality)."""
    accuracy_risks: tuple[AccuracyFact, ...] | None = None
    """Known FP8 accuracy problems of the rendered rung (None: nothing rendered, keep the
    stored ones)."""


def build_status(
    snap: Snapshot, previous: InferenceServiceStatus, decision: Decision
) -> InferenceServiceStatus:
    generation = snap.isvc.metadata.generation or 1
    stored = previous.fallback
    attempts = [*(stored.attempts if stored else []), *decision.moves][-MAX_ATTEMPTS:]
    rendered = decision.rendered
    chosen = decision.placement.choice.chosen if decision.placement else None
    ready = _ready(snap, decision)
    stalled = _stalled(decision)
    updates = [
        ready,
        _reconciling(ready, stalled, decision),
        stalled,
        _placed(decision),
        _fallback_active(decision, attempts),
        _degraded(decision),
    ]
    replicas, ready_replicas = _replica_counts(snap.deployment)
    effective = _effective(rendered, decision) if rendered else (previous.effective)
    capacity = _capacity(decision) if (rendered and chosen) else previous.capacity
    metrics = metrics_status(
        previous.metrics, snap.engine_metrics, min_interval=snap.config.metrics_min_interval
    )
    mismatch = capacity_condition(metrics, capacity, effective)
    if mismatch is not None and _rolled_out(snap, decision):
        updates.append(mismatch)
    quality = previous.quality if snap.isvc.spec.quality else None
    if decision.quality is not None and decision.quality.condition is not None:
        updates.append(decision.quality.condition)
        quality = decision.quality.status
    autoscaling = previous.autoscaling if snap.isvc.spec.autoscaling else None
    if decision.autoscaled is not None:
        updates.append(decision.autoscaled.condition)
        autoscaling = decision.autoscaled.status.model_copy(
            update={"signals": signals_from(metrics)}
        )
    risks = previous.known_accuracy_risks
    judged = decision.accuracy_risks is not None and rendered is not None
    if decision.accuracy_risks is not None and rendered is not None:
        risks = risk_status(decision.accuracy_risks)
        if decision.accuracy_risks:
            updates.append(
                risk_condition(decision.accuracy_risks, rendered.effective.engine_version)
            )
    placement = previous.placement
    if chosen is not None:
        placement = PlacementStatus.model_validate(
            {
                "pool": chosen.pool.name,
                "gpuProduct": chosen.pool.gpu.product,
                "computeCapability": chosen.pool.gpu.compute_capability_str,
                "gpuMemoryMiB": chosen.pool.gpu.memory_mib,
            }
        )
    return InferenceServiceStatus(
        observed_generation=generation,
        conditions=[
            c
            for c in merge_conditions(
                previous.conditions, updates, generation=generation, now=rfc3339(snap.now)
            )
            # The condition goes with the last matching fact (a new rung, engine or pool);
            # a decision that rendered nothing keeps what the last one said.
            if c.type != ACCURACY_CONDITION or risks or not judged
        ],
        effective=effective,
        placement=placement,
        capacity=capacity,
        fallback=FallbackStatus(
            active_rung=_active_rung(decision, stored),
            key=decision.key or (stored.key if stored else None),
            attempts=attempts,
            tally=decision.tally,
            retry_token=decision.retry_token or (stored.retry_token if stored else None),
            reset_at=rfc3339(decision.reset_at) if decision.reset_at else None,
        ),
        metrics=metrics,
        autoscaling=autoscaling,
        quality=quality,
        known_accuracy_risks=risks,
        replicas=replicas,
        ready_replicas=ready_replicas,
        selector=",".join(
            f"{k}={v}" for k, v in sorted(selector_for(snap.isvc, decision.tier).items())
        ),
    )


def waits_for(
    snap: Snapshot, previous: InferenceServiceStatus, decision: Decision
) -> tuple[bool, bool]:
    """(GPUs, nodes): whether GPUs taken or freed on any pool, or nodes that come or change,
    may change this decision. GPUs: the service is not placed, runs a fallback for lack of
    room, or its pool caps its autoscaling. Nodes: it runs a fallback a new pool may end.
    Judged by the conditions and fields `build_status` writes."""
    stored = previous.fallback
    attempts = [*(stored.attempts if stored else []), *decision.moves][-MAX_ATTEMPTS:]
    placed = _placed(decision).status == "True"
    fallback = _fallback_active(decision, attempts).status == "True"
    for_room = fallback and bool(attempts) and attempts[-1].cause == "Capacity"
    autoscaling = previous.autoscaling if snap.isvc.spec.autoscaling else None
    if decision.autoscaled is not None:
        autoscaling = decision.autoscaled.status
    capped = autoscaling is not None and autoscaling.limited_by == "pool"
    return not placed or for_room or capped, fallback


def _active_rung(decision: Decision, stored: FallbackStatus | None) -> str | None:
    if decision.blocked is not None:
        return stored.active_rung if stored else None
    if decision.exhausted:
        return NONE
    return decision.rung.value if decision.rung else None


def _ready(snap: Snapshot, decision: Decision) -> ConditionUpdate:
    if decision.blocked or decision.exhausted:
        return ConditionUpdate("Ready", "False", "NotDeployable", _why_not(decision))
    want = snap.isvc.spec.desired_replicas()
    ready = int((snap.deployment or {}).get("status", {}).get("readyReplicas") or 0)
    # A failing engine outranks the Deployment's counts, which lag the pods: Ready must
    # never say True while Stalled says a person is needed (kstatus would read Failed).
    if decision.failure is not None:
        return ConditionUpdate(
            "Ready", "False", str(decision.failure.kind), decision.failure.reason
        )
    if _rolled_out(snap, decision):
        if want == 0:
            return ConditionUpdate("Ready", "True", "ScaledToZero", "No replica is asked for.")
        rendered = decision.rendered
        assert rendered is not None and decision.placement is not None
        pool = decision.placement.choice.chosen
        where = f" on pool {pool.pool.name}" if pool else ""
        message = (
            f"{ready}/{want} replicas ready{where}, KV cache {rendered.effective.kv_cache_dtype}, "
            f"model {rendered.effective.model_uri}."
        )
        return ConditionUpdate("Ready", "True", "Available", message)
    if decision.waiting:
        return ConditionUpdate("Ready", "False", WAITING, decision.ladder_reason)
    return ConditionUpdate(
        "Ready", "False", "Progressing", f"{ready}/{want} replicas of the current spec ready."
    )


def _reconciling(
    ready: ConditionUpdate, stalled: ConditionUpdate, decision: Decision
) -> ConditionUpdate:
    if ready.status == "True" or stalled.status == "True":
        return ConditionUpdate("Reconciling", "False", "Settled", "Nothing left to do.")
    if decision.waiting:
        return ConditionUpdate("Reconciling", "True", WAITING, decision.ladder_reason)
    if decision.failure is not None:
        return ConditionUpdate(
            "Reconciling",
            "True",
            str(decision.failure.kind),
            f"{decision.failure.reason} {decision.failure.remedy}",
        )
    if decision.moves:
        return ConditionUpdate("Reconciling", "True", "FallingBack", decision.moves[-1].reason)
    return ConditionUpdate("Reconciling", "True", "Progressing", ready.message)


def _stalled(decision: Decision) -> ConditionUpdate:
    if decision.blocked:
        return ConditionUpdate("Stalled", "True", decision.blocked[0], decision.blocked[1])
    if decision.exhausted:
        return ConditionUpdate("Stalled", "True", "FallbackExhausted", _why_not(decision))
    failure = decision.failure
    if failure is not None and (
        failure.action is Action.FIX
        or (failure.action is Action.FALLBACK and decision.fallback_disabled)
    ):
        return ConditionUpdate(
            "Stalled", "True", str(failure.kind), f"{failure.reason} {failure.remedy}"
        )
    return ConditionUpdate("Stalled", "False", "Progressing", "No person is needed.")


def _rolled_out(snap: Snapshot, decision: Decision) -> bool:
    return decision.rendered is not None and rolled_out(snap, decision.rendered.pod_hash)


def rolled_out(snap: Snapshot, pod_hash: str) -> bool:
    """Every replica runs the rendering `pod_hash` and is available."""
    want = snap.isvc.spec.desired_replicas()
    deployment = snap.deployment or {}
    template = deployment.get("spec", {}).get("template", {}).get("metadata", {})
    live_hash = (template.get("annotations") or {}).get(keys.ANNOTATION_SPEC_HASH)
    st = deployment.get("status") or {}
    return (
        live_hash == pod_hash
        and deployment.get("spec", {}).get("replicas", want) == want
        and st.get("observedGeneration", 0) >= deployment.get("metadata", {}).get("generation", 1)
        and st.get("updatedReplicas", 0) >= want
        and st.get("readyReplicas", 0) >= want
        and st.get("availableReplicas", 0) >= want
    )


def _placed(decision: Decision) -> ConditionUpdate:
    if decision.blocked:
        return ConditionUpdate("Placed", "False", decision.blocked[0], decision.blocked[1])
    if decision.exhausted or decision.placement is None:
        return ConditionUpdate("Placed", "False", "NoPoolFits", _why_not(decision))
    if decision.waiting:
        return ConditionUpdate("Placed", "False", WAITING, decision.ladder_reason)
    chosen = decision.placement.choice.chosen
    assert chosen is not None and chosen.plan is not None
    plan = chosen.plan
    message = (
        f"Pool {chosen.pool.name} ({chosen.pool.gpu.product}, compute capability "
        f"{chosen.pool.gpu.compute_capability_str}) with the "
        f"{decision.placement.kv_cache_dtype} KV cache: {plan.kv_tokens:,} KV tokens, "
        f"{plan.max_concurrency:.1f} sequences of {plan.max_model_len:,} tokens per replica."
    )
    host = _host_tier(decision)
    if host is not None:
        how = f"{host.mode} {host.backend}" if host.backend else host.mode
        message += (
            f" CPU tier ({how}): {host.tokens:,} KV tokens in {host.bytes / 2**30:.1f} GiB "
            "of host memory."
        )
    return ConditionUpdate("Placed", "True", "PoolChosen", message)


def _fallback_active(decision: Decision, attempts: list[FallbackAttempt]) -> ConditionUpdate:
    if decision.rung in (None, Rung.REQUESTED) or decision.blocked:
        return ConditionUpdate("FallbackActive", "False", "AsRequested", "No fallback in force.")
    mine = [a for a in attempts if a.key == decision.key and a.to == decision.rung.value]
    if not mine:
        return ConditionUpdate("FallbackActive", "True", "Fallback", decision.ladder_reason)
    last = mine[-1]
    return ConditionUpdate("FallbackActive", "True", f"{last.cause}Fallback", last.reason)


def _degraded(decision: Decision) -> ConditionUpdate:
    if decision.exhausted:
        return ConditionUpdate("Degraded", "True", "FallbackExhausted", _why_not(decision))
    failure = decision.failure
    if failure is not None:
        message = f"{failure.reason} {failure.remedy}"
        if failure.action is Action.FALLBACK and decision.fallback_disabled:
            message = (
                f"{failure.reason} Fallback is disabled for this service "
                "(spec.fallback.enabled: false)."
            )
        elif decision.tally is not None and failure.action is Action.FALLBACK_AFTER_REPEATS:
            message = f"{failure.reason} Seen {decision.tally.count} time(s); {failure.remedy}"
        return ConditionUpdate("Degraded", "True", str(failure.kind), message)
    return ConditionUpdate("Degraded", "False", "Healthy", "No failure observed.")


def _why_not(decision: Decision) -> str:
    if decision.blocked:
        return decision.blocked[1]
    return decision.ladder_reason or "Not deployable."


def _engine_dtype(rendered: Rendered) -> str:
    """The --kv-cache-dtype value rendered (vLLM's name, e.g. int8_per_token_head)."""
    if "--kv-cache-dtype" in rendered.args:
        return rendered.args[rendered.args.index("--kv-cache-dtype") + 1]
    return rendered.effective.kv_cache_dtype


def _effective(rendered: Rendered, decision: Decision) -> EffectiveStatus:
    effective = rendered.effective
    engine_dtype = _engine_dtype(rendered)
    scaling = decision.autoscaled.ignored if decision.autoscaled else ()
    return EffectiveStatus(
        kv_cache_dtype=engine_dtype,
        model_uri=effective.model_uri,
        quantization=effective.quantization,
        engine_version=effective.engine_version,
        image=effective.image,
        # The CRD refuses credentials in extraArgs; an older CRD may not have: never echo them.
        engine_args=redact_args(rendered.args),
        args_hash=rendered.pod_hash,
        ignored=[
            *(
                IgnoredSetting(field=_FLAG_FIELDS.get(d.flag, d.flag), reason=redact_text(d.reason))
                for d in rendered.dropped
            ),
            *scaling,
        ],
    )


def _kv_layout(plan: CapacityPlan) -> str:
    padding = f", {plan.padding_layers} padding layers" if plan.padding_layers else ""
    return f"{plan.kv_layout}{padding}"


def _capacity(decision: Decision) -> CapacityStatus:
    assert decision.placement is not None and decision.placement.choice.chosen is not None
    plan = decision.placement.choice.chosen.plan
    assert plan is not None
    assert decision.rendered is not None
    dtype = _engine_dtype(decision.rendered)
    host = _host_tier(decision)
    gpus_per_node = decision.placement.choice.chosen.pool.gpus_per_node
    return CapacityStatus(
        layout=_layout(plan, gpus_per_node),
        kv_bytes_per_token=plan.kv_bytes_per_token,
        kv_tokens=plan.kv_tokens,
        max_concurrent_sequences=round(plan.max_concurrency, 2),
        kv_layout=_kv_layout(plan) if plan.kv_cache_groups > 1 else None,
        ratio_vs_auto=round(plan.ratio_vs_auto, 3),
        max_model_len=plan.max_model_len,
        gpu_tier=GpuTierStatus(
            tokens=plan.kv_tokens,
            bytes=_gpu_tier_bytes(plan),
            dtype=dtype,
        ),
        cpu_tier=None
        if host is None
        else CpuTierStatus(
            mode=host.mode if host.mode != "none" else None,
            backend=host.backend,
            connector=host.connector,
            tokens=host.tokens,
            bytes=host.bytes,
            dtype=host.kv_cache_dtype,
            note=host.note,
        ),
    )


def _layout(plan: CapacityPlan, gpus_per_node: int) -> LayoutStatus:
    stages = plan.stages
    # The planner's rule (placement asks the same); a plan placed here always splits.
    nodes = nodes_per_replica(plan.tensor_parallel, plan.pipeline_parallel, gpus_per_node)
    return LayoutStatus(
        tensor=plan.tensor_parallel,
        pipeline=plan.pipeline_parallel,
        nodes_per_replica=nodes or 1,
        layers_per_stage=[s.layers for s in stages] if stages else [plan.num_layers],
        bounding_stage=plan.bounding_stage + 1 if stages else None,
    )


def _gpu_tier_bytes(plan: CapacityPlan) -> int:
    """The GPU cache of one replica: every stage allocates the same block count, each
    with its own layers' pages."""
    if not plan.stages:
        return plan.num_blocks * plan.block_bytes_per_gpu * plan.tensor_parallel
    per_gpu = sum(plan.num_blocks * s.block_bytes_per_gpu for s in plan.stages)
    return per_gpu * plan.tensor_parallel


def _host_tier(decision: Decision) -> HostTierPlan | None:
    """The CPU tier of the rendered rung (None: the engine keeps none)."""
    return decision.rendered.host_tier if decision.rendered is not None else None


def _replica_counts(deployment: Mapping[str, Any] | None) -> tuple[int | None, int | None]:
    if not deployment:
        return None, None
    st = deployment.get("status") or {}
    return int(st.get("replicas") or 0), int(st.get("readyReplicas") or 0)


__all__ = ["Decision", "build_status"]
