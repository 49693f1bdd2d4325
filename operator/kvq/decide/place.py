"""Step 1 of decide(): every rung of the ladder, judged against the pools.

For each rung (requested, auto, awq) the pool it would run on, whether any pool can run it
at all, and whether that pool can run it now. The pool the service runs on is kept while it
is compatible; it is left only once the grace period is over and another pool can run the
rung now (placement.choice does the choosing).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvq.api.placement import ParallelismSpec
from kvq.api.resource import InferenceService
from kvq.catalog.engines import EngineCapability
from kvq.catalog.models import ModelArchitecture
from kvq.fallback.ladder import Rung, RungState
from kvq.placement.choice import PoolChoice, PoolRequest, choose_pool
from kvq.placement.discovery import Inventory
from kvq.placement.pool import nodes_per_replica
from kvq.planner.kv_layout import kv_manager_flags
from kvq.planner.layout import Layout, pipeline_candidates
from kvq.planner.weights import WeightFormat
from kvq.render.pod import host_tier_bytes, memory_request_bytes
from kvq.render.settings import (
    EffectiveSettings,
    engine_image_and_version,
    host_tier_of,
    model_footprint,
)


@dataclass(frozen=True)
class RungPlacement:
    """A rung's pool choice and what the ladder needs to know of it."""

    rung: Rung
    kv_cache_dtype: str
    choice: PoolChoice
    state: RungState


def place_rungs(
    isvc: InferenceService,
    inventory: Inventory,
    capability: EngineCapability,
    arch: ModelArchitecture,
    *,
    current_pool: str | None,
    leave_current: bool,
    unschedulable: str | None = None,
) -> dict[Rung, RungPlacement]:
    """The requested rung and every fallback rung this spec can have.

    `unschedulable`: the scheduler's word that the service's current pods do not fit on
    the current pool (the pool cannot run it now, whatever the GPU count says).
    """
    spec = isvc.spec
    meta = isvc.metadata
    owner = (meta.namespace, meta.name) if meta.namespace else None
    rungs: list[tuple[Rung, str, WeightFormat]] = [
        (Rung.REQUESTED, spec.kv_cache.dtype, "bf16"),
        (Rung.AUTO, "auto", "bf16"),
    ]
    if spec.model.awq is not None:
        rungs.append((Rung.AWQ, "auto", "awq"))
    image, version = engine_image_and_version(isvc)
    tier = host_tier_of(isvc, capability, image)
    manager = kv_manager_flags(spec.engine.extra_args)
    placements: dict[Rung, RungPlacement] = {}
    for rung, dtype, weights in rungs:
        # The pod's host memory (weights, /dev/shm, the CPU tier): a node must hold it.
        # The model served and its weights are all the memory needs of the rung.
        sized = EffectiveSettings(
            dtype,
            spec.model.uri,
            None,
            version,
            image,
            capability,
            model_footprint(isvc, arch, rung.value),
            tier,
        )
        request = PoolRequest(
            kv_cache_dtype=dtype,
            weight_format=weights,
            gpus_per_replica=spec.placement.gpus_per_replica,
            gpu_memory_utilization=spec.memory.gpu_memory_utilization,
            max_model_len=spec.memory.max_model_len,
            max_num_seqs=spec.memory.max_num_seqs,
            block_size=spec.kv_cache.block_size,
            min_concurrency=spec.capacity.min_concurrent_sequences,
            allowed_pools=tuple(spec.placement.pools),
            node_selector=spec.placement.node_selector,
            tolerations=spec.placement.tolerations,
            prefer=spec.placement.prefer,
            replicas=spec.desired_replicas(),
            owner=owner,
            current_pool=current_pool,
            leave_current=leave_current,
            unschedulable=unschedulable or "",
            memory_bytes=memory_request_bytes(isvc, sized),
            pod_memory_bytes=_pod_memory(isvc, sized, inventory, arch),
            host_tier_bytes=host_tier_bytes(isvc, sized),
            hybrid_kv_cache_manager=manager.hybrid_manager,
            kv_cache_dtype_skip_layers=manager.skip_layers,
            pipeline_parallel=spec.placement.pipeline_parallel,
            parallelism_declared=spec.placement.parallelism is not None,
            derive_pipeline=spec.placement.pipeline_derived,
        )
        choice = choose_pool(request, inventory, capability, arch)
        placements[rung] = RungPlacement(rung, dtype, choice, _state(rung, choice))
    return placements


def _pod_memory(
    isvc: InferenceService, sized: EffectiveSettings, inventory: Inventory, arch: ModelArchitecture
) -> dict[int, int]:
    """A pod's memory request for each node count a replica spans on some pool (above 1)."""
    placement = isvc.spec.placement
    if placement.pipeline_derived:
        # Each layout kvq may derive on some pool: a pod's share follows its GPUs.
        layouts = {
            (layout, pool.gpus_per_node)
            for pool in inventory.pools
            for layout in pipeline_candidates(arch, placement.tensor_parallel, pool.gpus_per_node)
        }
        found = {}
        for layout, per_node in sorted(layouts, key=lambda x: (x[0].pipeline, x[1])):
            nodes = nodes_per_replica(layout.tensor, layout.pipeline, per_node)
            if nodes is not None and nodes > 1:
                found[nodes] = memory_request_bytes(laid_out(isvc, layout), sized, nodes)
        return {n: b for n, b in found.items() if b is not None}
    spans = {
        nodes_per_replica(placement.tensor_parallel, placement.pipeline_parallel, p.gpus_per_node)
        for p in inventory.pools
    }
    found = {n: memory_request_bytes(isvc, sized, n) for n in spans if n is not None and n > 1}
    return {n: b for n, b in found.items() if b is not None}


def laid_out(isvc: InferenceService, layout: Layout) -> InferenceService:
    """The service with `layout` declared: what the operator renders when it derived the
    layout (spec.placement.parallelism without pipeline)."""
    placement = isvc.spec.placement.model_copy(
        update={
            "parallelism": ParallelismSpec(tensor=layout.tensor, pipeline=layout.pipeline),
            "gpus_per_replica": layout.gpus,
        }
    )
    spec = isvc.spec.model_copy(update={"placement": placement})
    return isvc.model_copy(update={"spec": spec})


def rung_layout(placement: RungPlacement) -> Layout | None:
    """The layout the rung's chosen pool plans (None: no pool)."""
    chosen = placement.choice.chosen
    if chosen is None or chosen.plan is None:
        return None
    return Layout(chosen.plan.tensor_parallel, chosen.plan.pipeline_parallel)


def _state(rung: Rung, choice: PoolChoice) -> RungState:
    chosen = choice.chosen
    if choice.missing_current is not None:
        return RungState(rung, choice.missing_current, True, False, choice.why_not_now())
    if chosen is None:
        return RungState(rung, None, False, False, choice.why_none())
    return RungState(rung, chosen.pool.name, True, chosen.runnable, choice.why_not_now())
