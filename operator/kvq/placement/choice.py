"""Choose the node pool for one rung: engine x dtype x compute capability, capacity, policy.

Every pool gets a verdict with the reasons it was turned down, so "no pool fits" can
name what is missing instead of just saying no.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kvq.api import keys
from kvq.api.spec import Toleration
from kvq.catalog.engines import EngineCapability
from kvq.catalog.models import ModelArchitecture
from kvq.placement.discovery import Inventory
from kvq.placement.pool import NodePool, Taint
from kvq.planner import CapacityPlan, plan_capacity
from kvq.planner.weights import WeightFormat

DEFAULT_BLOCK_SIZE = 16
NOT_ALLOWED = "not in spec.placement.pools"


@dataclass(frozen=True)
class PoolRequest:
    """What one rung needs from a pool."""

    kv_cache_dtype: str
    weight_format: WeightFormat
    gpus_per_replica: int
    gpu_memory_utilization: float
    max_model_len: int | None
    max_num_seqs: int | None
    block_size: int | None
    min_concurrency: int | None
    allowed_pools: tuple[str, ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: Sequence[Toleration] = ()
    prefer: str = "cheapest"


@dataclass(frozen=True)
class PoolVerdict:
    pool: NodePool
    reasons: tuple[str, ...]
    """Why the pool cannot take the rung; empty when it can."""
    plan: CapacityPlan | None = None

    @property
    def fits(self) -> bool:
        return not self.reasons


@dataclass(frozen=True)
class PoolChoice:
    chosen: PoolVerdict | None
    verdicts: tuple[PoolVerdict, ...]
    unknown_pools: tuple[str, ...] = ()

    def why_none(self) -> str:
        """One sentence naming, per pool, what is missing."""
        if not self.verdicts:
            unknown = (
                f" (GPUs kvq does not know: {', '.join(self.unknown_pools)})"
                if self.unknown_pools
                else ""
            )
            return f"no GPU node pool was found{unknown}"
        # Pools the spec excluded itself are counted, not described: the user chose that.
        excluded = [v for v in self.verdicts if NOT_ALLOWED in v.reasons]
        parts = [
            f"{v.pool.name} ({v.pool.gpu.product}): {'; '.join(v.reasons)}"
            for v in self.verdicts
            if v not in excluded
        ]
        if excluded:
            names = ", ".join(v.pool.name for v in excluded)
            parts.append(f"{len(excluded)} other pools are not in spec.placement.pools ({names})")
        return "no pool fits: " + " | ".join(parts)


def choose_pool(
    request: PoolRequest,
    inventory: Inventory,
    capability: EngineCapability,
    arch: ModelArchitecture,
) -> PoolChoice:
    """The best pool for the request, and every pool's verdict."""
    verdicts = tuple(_judge(pool, request, capability, arch) for pool in inventory.pools)
    fitting = [v for v in verdicts if v.fits]
    unknown = tuple(f"{u.name}={u.product_label}" for u in inventory.unknown)
    if not fitting:
        return PoolChoice(None, verdicts, unknown)
    return PoolChoice(min(fitting, key=lambda v: _rank(v, request.prefer)), verdicts, unknown)


def _rank(verdict: PoolVerdict, prefer: str) -> tuple[float, float, str]:
    assert verdict.plan is not None
    cost = verdict.pool.gpu.relative_cost
    headroom = -verdict.plan.kv_tokens
    if prefer == "headroom":
        return (headroom, cost, verdict.pool.name)
    return (cost, headroom, verdict.pool.name)


def _judge(
    pool: NodePool, request: PoolRequest, capability: EngineCapability, arch: ModelArchitecture
) -> PoolVerdict:
    reasons: list[str] = []
    if request.allowed_pools and pool.name not in request.allowed_pools:
        reasons.append(NOT_ALLOWED)
    missing = {k: v for k, v in request.node_selector.items() if pool.labels.get(k) != v}
    if missing:
        labels = ", ".join(f"{k}={v}" for k, v in sorted(missing.items()))
        reasons.append(f"nodes lack labels {labels}")
    untolerated = [t for t in pool.taints if not _tolerated(t, request.tolerations)]
    if untolerated:
        taints = ", ".join(f"{t.key}={t.value or ''}:{t.effect}" for t in untolerated)
        reasons.append(f"taints not tolerated: {taints}")
    if pool.gpus_per_node < request.gpus_per_replica:
        reasons.append(
            f"nodes have {pool.gpus_per_node} GPUs, a replica needs {request.gpus_per_replica}"
        )
    elif pool.allocatable_gpus < request.gpus_per_replica:
        reasons.append("no ready node with enough allocatable GPUs")
    verdict = capability.kv_dtype_verdict(request.kv_cache_dtype, pool.gpu.compute_capability)
    if not verdict.ok:
        reasons.append(verdict.reason)
    if request.weight_format == "awq" and pool.gpu.compute_capability < (7, 5):
        reasons.append("AWQ kernels need compute capability 7.5 or newer")
    plan = plan_capacity(
        arch,
        pool.gpu,
        request.kv_cache_dtype,
        tensor_parallel=request.gpus_per_replica,
        gpu_memory_utilization=request.gpu_memory_utilization,
        max_model_len=request.max_model_len,
        block_size=request.block_size or DEFAULT_BLOCK_SIZE,
        max_num_seqs=request.max_num_seqs,
        weight_format=request.weight_format,
    )
    if not plan.fits:
        reasons.append(plan.reason or "the model does not fit")
    elif request.min_concurrency is not None and plan.max_concurrency < request.min_concurrency:
        reasons.append(
            f"holds {plan.max_concurrency:.1f} sequences of {plan.max_model_len} tokens, "
            f"spec.capacity needs {request.min_concurrency}"
        )
    return PoolVerdict(pool, tuple(reasons), plan)


def _tolerated(taint: Taint, tolerations: Sequence[Toleration]) -> bool:
    if taint.effect == "PreferNoSchedule" or taint.key == keys.GPU_TAINT_KEY:
        return True  # kvq always tolerates the GPU taint of the pool it chose
    for toleration in tolerations:
        if toleration.effect not in (None, taint.effect):
            continue
        if toleration.operator == "Exists" and toleration.key in (None, "", taint.key):
            return True
        if toleration.key == taint.key and (toleration.value or "") == (taint.value or ""):
            return True
    return False
