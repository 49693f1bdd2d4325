"""Choose the node pool for one rung: what can run here at all, and what can run now.

Two kinds of "no": a pool that *cannot run* the rung (engine x dtype x compute capability,
model size, taints, selectors: permanent until the spec or the pool changes) and a pool
that *cannot run it now* (nodes NotReady, GPUs taken, a transient taint: it passes). Every
pool gets a verdict with its reasons, so "no pool fits" names what is missing.

Stable: the pool the service runs on is kept while it is compatible; a pool that cannot run
it now is left only when the caller says the grace period is over and another can.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from kvq.api import keys
from kvq.api.scheduling import Toleration
from kvq.catalog.engines import EngineCapability
from kvq.catalog.models import ModelArchitecture
from kvq.placement.discovery import TRANSIENT_TAINT_KEYS, Inventory
from kvq.placement.pool import NodePool, OwnerKey, Taint, nodes_per_replica
from kvq.placement.tensor_parallel import layout_problem
from kvq.planner import CapacityPlan, plan_capacity
from kvq.planner.derived_layout import derive_layout
from kvq.planner.layout import Layout
from kvq.planner.weights import WeightFormat

DEFAULT_BLOCK_SIZE = 16
NOT_ALLOWED = "not in spec.placement.pools"
# Taints kvq tolerates on its own: the GPU vendors' "GPU workloads only" taint.
GPU_TAINT_KEYS = frozenset({keys.GPU_TAINT_KEY})


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
    replicas: int = 1
    owner: OwnerKey | None = None
    """The InferenceService asking: GPUs its own pods hold count as free for it."""
    current_pool: str | None = None
    """The pool the service runs on now (kept while compatible)."""
    leave_current: bool = False
    """The grace period is over: leave the current pool if it cannot run now and another can."""
    unschedulable: str = ""
    """The scheduler's message when the service's pods do not fit on the current pool (it
    knows more than GPU counts: CPU, memory, affinity)."""
    memory_bytes: int | None = None
    """The engine container's memory request: one node must have it allocatable."""
    pod_memory_bytes: Mapping[int, int] = field(default_factory=dict)
    """A pod's memory request when a replica spans N nodes, by N (each pod of the group
    holds its share of the weights, /dev/shm and CPU tier)."""
    host_tier_bytes: int = 0
    """The part of it that is the KV cache's CPU tier (memory.swapSpaceGiB x GPUs)."""
    hybrid_kv_cache_manager: bool = True
    """False when spec.engine.extraArgs has --disable-hybrid-kv-cache-manager."""
    kv_cache_dtype_skip_layers: tuple[str, ...] = ()
    """spec.engine.extraArgs' --kv-cache-dtype-skip-layers: layers kept at the model dtype."""
    pipeline_parallel: int = 1
    """spec.placement.parallelism.pipeline: stages of gpus_per_replica / pipeline GPUs each."""
    parallelism_declared: bool = False
    """spec.placement.parallelism is given (messages name its fields)."""
    derive_pipeline: bool = False
    """spec.placement.parallelism leaves the pipeline out: on each pool, the fewest stages
    whose replica holds the weights and min_concurrency (planner.layout's candidates)."""

    @property
    def tensor_parallel(self) -> int:
        return self.gpus_per_replica // self.pipeline_parallel


@dataclass(frozen=True)
class PoolVerdict:
    pool: NodePool
    reasons: tuple[str, ...]
    """Why the pool cannot run the rung at all; empty when it can."""
    plan: CapacityPlan | None = None
    slots: int = 0
    """Replicas that fit on the pool's usable nodes now (the asking service's own pods
    counted as room)."""
    not_now: str = ""
    """Why the pool cannot take every replica now; empty when it can."""

    @property
    def fits(self) -> bool:
        """Compatible: can run the rung at all."""
        return not self.reasons

    @property
    def runnable(self) -> bool:
        """Compatible and able to take every replica now."""
        return self.fits and not self.not_now


@dataclass(frozen=True)
class PoolChoice:
    chosen: PoolVerdict | None
    verdicts: tuple[PoolVerdict, ...]
    unknown_pools: tuple[str, ...] = ()
    missing_current: str | None = None
    """The current pool, when no node of it is left (scaled to zero, or gone)."""

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

    def why_not_now(self) -> str:
        """Why the chosen pool cannot run every replica now ("" when it can)."""
        if self.missing_current is not None:
            return f"pool {self.missing_current} has no nodes (scaled to zero, or gone)"
        if self.chosen is None:
            return self.why_none()
        if not self.chosen.not_now:
            return ""
        return f"pool {self.chosen.pool.name}: {self.chosen.not_now}"


def choose_pool(
    request: PoolRequest,
    inventory: Inventory,
    capability: EngineCapability,
    arch: ModelArchitecture,
) -> PoolChoice:
    """The pool for the request (stable when it can be), and every pool's verdict."""
    verdicts = tuple(_judge(pool, request, capability, arch) for pool in inventory.pools)
    unknown = tuple(f"{u.name}={u.product_label}" for u in inventory.unknown)
    compatible = [v for v in verdicts if v.fits]
    current = next((v for v in compatible if v.pool.name == request.current_pool), None)
    known = {v.pool.name for v in verdicts}
    missing = request.current_pool if request.current_pool not in (None, *known) else None
    if current is not None and (current.runnable or not request.leave_current):
        return PoolChoice(current, verdicts, unknown)
    runnable = [v for v in compatible if v.runnable]
    if missing is not None and not request.leave_current:
        # Wait for the pool to come back before moving anything (an autoscaler may be
        # bringing its nodes up again).
        return PoolChoice(None, verdicts, unknown, missing_current=missing)
    if current is not None and not runnable:
        return PoolChoice(current, verdicts, unknown)  # nowhere better to go
    if not compatible:
        return PoolChoice(None, verdicts, unknown)
    best = min(compatible, key=lambda v: _rank(v, request))
    return PoolChoice(best, verdicts, unknown)


def _rank(verdict: PoolVerdict, request: PoolRequest) -> tuple[int, float, float, str]:
    assert verdict.plan is not None
    # Pools that can take every replica now first, then those that can take some.
    room = 0 if verdict.runnable else (1 if verdict.slots > 0 else 2)
    cost = verdict.pool.gpu.relative_cost
    headroom = -verdict.plan.kv_tokens
    if request.prefer == "headroom":
        return (room, headroom, cost, verdict.pool.name)
    return (room, cost, headroom, verdict.pool.name)


def _judge(
    pool: NodePool, request: PoolRequest, capability: EngineCapability, arch: ModelArchitecture
) -> PoolVerdict:
    if request.derive_pipeline:
        request = _derived(pool, request, capability, arch)
    reasons: list[str] = []
    if request.allowed_pools and not pool.in_group(request.allowed_pools):
        reasons.append(NOT_ALLOWED)
    missing = {k: v for k, v in request.node_selector.items() if pool.labels.get(k) != v}
    if missing:
        labels = ", ".join(f"{k}={v}" for k, v in sorted(missing.items()))
        reasons.append(f"nodes lack labels {labels}")
    untolerated = [t for t in pool.taints if not tolerated(t, request.tolerations)]
    if untolerated:
        taints = ", ".join(f"{t.key}={t.value or ''}:{t.effect}" for t in untolerated)
        reasons.append(f"taints not tolerated: {taints} (add them to spec.placement.tolerations)")
    nodes = _split_problem(pool, request)
    if nodes is not None:
        reasons.append(nodes)
    memory = _memory_problem(pool, request)
    if memory is not None:
        reasons.append(memory)
    split = layout_problem(
        arch, request.tensor_parallel, request.pipeline_parallel, request.parallelism_declared
    )
    if split is not None:
        reasons.append(split)
    verdict = capability.kv_dtype_verdict(request.kv_cache_dtype, pool.gpu.compute_capability)
    if not verdict.ok:
        reasons.append(verdict.reason)
    if request.weight_format == "awq" and pool.gpu.compute_capability < (7, 5):
        reasons.append("AWQ kernels need compute capability 7.5 or newer")
    plan = _plan(pool, request, capability, arch)
    if not plan.fits:
        reasons.append((plan.reason or "the model does not fit") + _declared(request))
    elif request.min_concurrency is not None and plan.max_concurrency < request.min_concurrency:
        reasons.append(
            f"holds {plan.max_concurrency:.1f} sequences of {plan.max_model_len} tokens, "
            f"spec.capacity needs {request.min_concurrency}{_declared(request)}"
        )
    slots, not_now = _room(pool, request)
    if request.unschedulable and pool.name == request.current_pool:
        not_now = f"replicas cannot be scheduled ({request.unschedulable})"
    return PoolVerdict(pool, tuple(reasons), plan, slots, not_now)


def _plan(
    pool: NodePool, request: PoolRequest, capability: EngineCapability, arch: ModelArchitecture
) -> CapacityPlan:
    return plan_capacity(
        arch,
        pool.gpu,
        request.kv_cache_dtype,
        tensor_parallel=request.tensor_parallel,
        pipeline_parallel=request.pipeline_parallel,
        gpu_memory_utilization=request.gpu_memory_utilization,
        max_model_len=request.max_model_len,
        block_size=request.block_size or DEFAULT_BLOCK_SIZE,
        max_num_seqs=request.max_num_seqs,
        weight_format=request.weight_format,
        hybrid_kv_cache_manager=request.hybrid_kv_cache_manager,
        kv_cache_dtype_skip_layers=request.kv_cache_dtype_skip_layers,
        memory_profile=capability.memory_profile,
    )


def _derived(
    pool: NodePool, request: PoolRequest, capability: EngineCapability, arch: ModelArchitecture
) -> PoolRequest:
    """The request with the fewest pipeline stages that hold the weights, the capacity
    asked for and a pod's memory on this pool (planner.derived_layout, which kvq plan -f
    shows too); the deepest tried when none does, so the verdict says what is missing."""

    def laid(layout: Layout) -> PoolRequest:
        return replace(request, gpus_per_replica=layout.gpus, pipeline_parallel=layout.pipeline)

    derived = derive_layout(
        arch,
        request.tensor_parallel,
        pool.gpus_per_node,
        lambda layout: _plan(pool, laid(layout), capability, arch),
        request.min_concurrency,
        lambda layout: _memory_problem(pool, laid(layout)) is None,
    )
    return request if derived is None else laid(derived.layout)


def _declared(request: PoolRequest) -> str:
    """What the layout adds to "does not hold it": kvq never changes a declared one, and a
    derived one failed at the most stages kvq tries."""
    if request.derive_pipeline:
        return (
            f" even at TP {request.tensor_parallel} x PP {request.pipeline_parallel}, the most"
            " stages kvq tries on this pool"
        )
    if not request.parallelism_declared:
        return ""
    return (
        f" with the declared layout (spec.placement.parallelism: TP {request.tensor_parallel}"
        f" x PP {request.pipeline_parallel}; kvq keeps a declared layout, leave"
        " parallelism.pipeline out to let it pick the stages)"
    )


def _split_problem(pool: NodePool, request: PoolRequest) -> str | None:
    """Why one replica's GPUs do not fit on one node of the pool, nor split over whole nodes
    of it as kvq splits a replica (None: they do)."""
    need, per_node = request.gpus_per_replica, pool.gpus_per_node
    if nodes_per_replica(request.tensor_parallel, request.pipeline_parallel, per_node):
        return None
    return f"nodes have {per_node} GPUs, a replica needs {need}"


def _memory_problem(pool: NodePool, request: PoolRequest) -> str | None:
    """Why no node of the pool can hold one pod's memory (None: one can, or the nodes do
    not report their memory). A replica over several nodes asks each node for its pod's
    share (`pod_memory_bytes`)."""
    largest = pool.largest_memory
    nodes = _nodes(pool, request)
    asked = request.memory_bytes if nodes == 1 else request.pod_memory_bytes.get(nodes)
    if asked is None or not largest or asked <= largest:
        return None
    if nodes > 1:
        return (
            f"each pod of a replica over {nodes} nodes asks for {_gib(asked)} of host memory; "
            f"the largest node has {_gib(largest)} allocatable"
        )
    tier = (
        f", {_gib(request.host_tier_bytes)} of it the KV cache's CPU tier "
        "(memory.swapSpaceGiB x gpusPerReplica)"
        if request.host_tier_bytes
        else ""
    )
    return (
        f"a replica asks for {_gib(asked)} of host memory{tier}; the largest "
        f"node has {_gib(largest)} allocatable"
    )


def _nodes(pool: NodePool, request: PoolRequest) -> int:
    """Nodes one replica spans on the pool (1 when it cannot be split: _split_problem)."""
    found = nodes_per_replica(
        request.tensor_parallel, request.pipeline_parallel, pool.gpus_per_node
    )
    return found or 1


def _gib(size: int) -> str:
    return f"{size / 2**30:.1f} GiB"


def _room(pool: NodePool, request: PoolRequest) -> tuple[int, str]:
    """Replicas that fit now, and why not all of them do ("" when they do)."""
    shape = (
        request.owner,
        request.gpus_per_replica,
        _nodes(pool, request),
        request.replicas,
        tuple((t.key, t.operator, t.value, t.effect) for t in request.tolerations),
    )
    if shape not in pool.rooms:
        pool.rooms[shape] = _count_room(pool, request)
    return pool.rooms[shape]


def _count_room(pool: NodePool, request: PoolRequest) -> tuple[int, str]:
    need = request.gpus_per_replica
    # A replica over several nodes is a group of pods, each taking its share of the GPUs on
    # a node of its own: the group is placed whole, on nodes that each have that share free.
    nodes = _nodes(pool, request)
    per_pod = need // nodes
    allowed: dict[frozenset[Taint], bool] = {}  # a pool's nodes share a few taint sets
    frees = []
    for node in pool.nodes:
        if not node.ready:
            continue
        if node.taints not in allowed:
            allowed[node.taints] = _tolerates_all(node.taints, request.tolerations)
        if allowed[node.taints]:
            frees.append(node.free_for(request.owner))
    # Replicas other services claim take their GPUs from the pool as a whole.
    claimed = pool.claimed_by_others(request.owner)
    free = max(sum(frees) - claimed, 0)
    slots = min(sum(f // per_pod for f in frees) // nodes, free // need)
    if slots >= request.replicas:
        return slots, ""
    if not frees:
        return 0, _unusable(pool, request.tolerations)
    # Users read "promised" in status (tests pin it): the claim by its everyday name.
    claimed_note = f", {claimed} more promised to replicas not bound yet" if claimed else ""
    per_replica = f"{need} per replica" if nodes == 1 else f"{nodes} nodes of {per_pod} per replica"
    return slots, (
        f"room for {slots} of {request.replicas} replicas now ({free} free GPUs on "
        f"{len(frees)} usable nodes{claimed_note}, {per_replica})"
    )


def _tolerates_all(taints: frozenset[Taint], tolerations: Sequence[Toleration]) -> bool:
    return all(t.effect == "PreferNoSchedule" or tolerated(t, tolerations) for t in taints)


def _unusable(pool: NodePool, tolerations: Sequence[Toleration]) -> str:
    not_ready = sum(1 for n in pool.nodes if not n.ready)
    tainted = sorted(
        {
            t.key
            for n in pool.nodes
            if n.ready
            for t in n.taints
            if t.effect != "PreferNoSchedule" and not tolerated(t, tolerations)
        }
    )
    parts = []
    if not_ready:
        parts.append(f"{not_ready} of {pool.node_count} nodes not ready or cordoned")
    if tainted:
        transient = [k for k in tainted if k in TRANSIENT_TAINT_KEYS]
        parts.append(f"nodes tainted {', '.join(transient or tainted)}")
    return "; ".join(parts) or "no usable node"


def tolerated(taint: Taint, tolerations: Sequence[Toleration]) -> bool:
    """Does the pod tolerate `taint`? kvq adds only the GPU taints' tolerations itself."""
    if taint.key in GPU_TAINT_KEYS:
        return True
    for toleration in tolerations:
        if toleration.effect not in (None, taint.effect):
            continue
        if toleration.operator == "Exists" and toleration.key in (None, "", taint.key):
            return True
        if toleration.key == taint.key and (toleration.value or "") == (taint.value or ""):
            return True
    return False
