"""Each rung of the ladder, judged against the pools: can it run, where, holding what."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kvq.api.models import InferenceService
from kvq.catalog.engines import EngineCapability
from kvq.catalog.models import ModelArchitecture
from kvq.fallback.ladder import Rung, RungOption
from kvq.placement.choice import PoolChoice, PoolRequest, choose_pool
from kvq.placement.discovery import Inventory
from kvq.planner.weights import WeightFormat


@dataclass(frozen=True)
class RungOutlook:
    """A rung's pool choice; `choice.chosen` is None when no pool can run it."""

    rung: Rung
    kv_cache_dtype: str
    choice: PoolChoice
    capacity_required: bool

    @property
    def option(self) -> RungOption:
        chosen = self.choice.chosen
        return RungOption(
            rung=self.rung,
            # A pool only qualifies when it keeps spec.capacity, so any chosen pool keeps it.
            keeps_capacity=chosen is not None,
            available=chosen is not None,
            why_unavailable=None if chosen else self.choice.why_none(),
            capacity_required=self.capacity_required,
        )


def rung_outlooks(
    isvc: InferenceService,
    inventory: Inventory,
    capability: EngineCapability,
    arch: ModelArchitecture,
) -> dict[Rung, RungOutlook]:
    """The requested rung and every fallback rung the spec can have."""
    spec = isvc.spec
    rungs: list[tuple[Rung, str, WeightFormat]] = [
        (Rung.REQUESTED, spec.kv_cache.dtype, "bf16"),
        (Rung.AUTO, "auto", "bf16"),
    ]
    if spec.model.awq is not None:
        rungs.append((Rung.AWQ, "auto", "awq"))
    outlooks: dict[Rung, RungOutlook] = {}
    for rung, dtype, weights in rungs:
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
        )
        outlooks[rung] = RungOutlook(
            rung,
            dtype,
            choose_pool(request, inventory, capability, arch),
            capacity_required=spec.capacity.min_concurrent_sequences is not None,
        )
    return outlooks


def ladder_options(outlooks: Mapping[Rung, RungOutlook]) -> dict[str, RungOption]:
    return {rung.value: outlook.option for rung, outlook in outlooks.items()}
