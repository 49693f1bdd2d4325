"""The KV cache's host-memory tier: what spec.memory.swapSpaceGiB buys on one engine.

The same declaration (GiB of CPU memory per GPU that catches the KV cache) is one of two
mechanisms, by engine version (catalog `kv_cpu_tier`):

- swap (V0 engines, vLLM 0.8-0.10): each worker allocates `--swap-space` GiB of pinned
  host memory; when the GPU cache runs short the scheduler swaps a preempted sequence's
  blocks out and back in. Unset means the engine's default, 4 GiB per GPU.
- offload (V1, vLLM 0.12+): blocks written on the GPU are also kept in host memory
  (`--kv-offloading-size`, GiB in total over every rank of the replica, TP x PP); a
  request whose prefix was
  evicted from the GPU loads it from there instead of recomputing it. Unset means none.

Either way the host copy is the GPU cache's bytes as they are (same dtype, same blocks),
so its capacity in tokens is its bytes over the GPU's block bytes (V0: num_cpu_blocks =
swap bytes // cache block bytes, per worker). Offload, vLLM 0.26.0's source:
vllm/config/vllm.py `VllmConfig._post_init_kv_transfer_config` makes the size
`cpu_bytes_to_use` (GiB x 2**30, one figure for the whole engine);
vllm/v1/kv_offload/cpu/spec.py `CPUOffloadingSpec.__init__` takes num_blocks =
cpu_bytes_to_use // (worker_kv_bytes_per_block x world_size x blocks_per_chunk, aligned),
where world_size is vllm/config/parallel.py `ParallelConfig.__post_init__`'s PP x TP x PCP
(pipeline ranks count) and worker_kv_bytes_per_block is the first worker's (the
scheduler's KV config is worker 0's: vllm/v1/core/kv_cache_utils.py
`generate_scheduler_kv_cache_config`), i.e. the first pipeline stage's. Each rank then
holds about a world-size share. (CacheConfig's docstring says "summed across all TP
ranks"; the division is by the whole world size.)
"""

from __future__ import annotations

from dataclasses import dataclass

from kvq.catalog.engines import (
    CpuTierMode,
    CpuTierVerdict,
    EngineCapability,
    OffloadBackend,
    Platform,
)
from kvq.planner.capacity import CapacityPlan
from kvq.planner.overhead import GIB

DEFAULT_SWAP_GIB = 4.0
"""vLLM's default --swap-space (CacheConfig.swap_space), per GPU."""


@dataclass(frozen=True)
class HostTierPlan:
    """The CPU tier of one replica."""

    mode: CpuTierMode
    """swap (V0 --swap-space) or offload (V1 KV offloading)."""
    gib_per_gpu: float
    """The rendered size per GPU (the engine's default when the spec gives none)."""
    bytes: int
    """Host memory of the tier, all GPUs of the replica together."""
    tokens: int
    """KV tokens it holds: whole blocks of the GPU cache's block size."""
    kv_cache_dtype: str
    """What it stores: the GPU cache's dtype (vLLM's value), copied block by block."""
    backend: str | None = None
    """The offloading backend (offload mode)."""
    connector: str | None = None
    """The KV connector vLLM runs for it; its name is in the engine's log."""
    defaulted: bool = False
    """The size is the engine's default, not the spec's."""
    note: str = ""

    @property
    def offload_gib_total(self) -> float:
        """--kv-offloading-size: the total over every rank (TP x PP)."""
        return self.bytes / GIB


def cpu_tier_verdict(
    capability: EngineCapability,
    swap_space_gib: float | None,
    backend: OffloadBackend,
    image: str,
    platform: Platform = "cuda",
) -> CpuTierVerdict | None:
    """What the spec's CPU tier is on this engine; None when the spec asks for none.

    Unset asks for the engine's default (swap engines keep 4 GiB per GPU; offload engines
    none); 0 asks for no tier anywhere.
    """
    if swap_space_gib == 0:
        return None
    if swap_space_gib is None and capability.cpu_tier.mode != "swap":
        return None
    return capability.cpu_tier_verdict(backend, image, platform)


def host_tier_gib_per_gpu(mode: CpuTierMode | None, swap_space_gib: float | None) -> float:
    """The tier's size per GPU as rendered: the spec's, or the swap engines' default."""
    if mode == "swap":
        return DEFAULT_SWAP_GIB if swap_space_gib is None else swap_space_gib
    if mode == "offload":
        return swap_space_gib or 0.0
    return 0.0


def plan_host_tier(
    verdict: CpuTierVerdict,
    swap_space_gib: float | None,
    capacity: CapacityPlan,
    engine_kv_cache_dtype: str,
) -> HostTierPlan:
    """The tier's bytes and tokens for one replica, from the GPU plan's block size."""
    if not verdict.ok or verdict.mode == "none":
        raise ValueError(f"no CPU tier to plan: {verdict.reason}")
    gib = host_tier_gib_per_gpu(verdict.mode, swap_space_gib)
    # vLLM divides the size by the world size, pipeline ranks too (module docstring).
    world = capacity.tensor_parallel * capacity.pipeline_parallel
    total = int(gib * GIB * world)
    # A block spans every rank: each holds its share (its KV heads) of every block; vLLM
    # sizes it by the first worker's, the first pipeline stage's.
    first = (
        capacity.stages[0].block_bytes_per_gpu if capacity.stages else capacity.block_bytes_per_gpu
    )
    blocks = total // (first * world) if first else 0
    return HostTierPlan(
        mode=verdict.mode,
        gib_per_gpu=gib,
        bytes=total,
        tokens=blocks * capacity.block_size,
        kv_cache_dtype=engine_kv_cache_dtype,
        backend=verdict.backend,
        connector=verdict.connector,
        defaulted=swap_space_gib is None,
        note=verdict.note,
    )


def host_tier_figures(
    capability: EngineCapability,
    capacity: CapacityPlan,
    swap_space_gib: float | None,
    backend: OffloadBackend,
    image: str,
) -> dict[str, object] | None:
    """The CPU tier as `kvq plan -o json` prints it (None: the spec asks for none)."""
    verdict = cpu_tier_verdict(capability, swap_space_gib, backend, image)
    if verdict is None:
        return None
    if not verdict.ok:
        return {"ok": False, "reason": verdict.reason}
    dtype = capability.engine_value(capacity.kv_cache_dtype) or capacity.kv_cache_dtype
    tier = plan_host_tier(verdict, swap_space_gib, capacity, dtype)
    figures: dict[str, object] = {
        "ok": True,
        "mode": tier.mode,
        "backend": tier.backend,
        "connector": tier.connector,
        "gibPerGpu": tier.gib_per_gpu,
        "bytes": tier.bytes,
        "tokens": tier.tokens,
        "dtype": tier.kv_cache_dtype,
    }
    if tier.note:
        figures["note"] = tier.note
    return figures


__all__ = [
    "DEFAULT_SWAP_GIB",
    "HostTierPlan",
    "cpu_tier_verdict",
    "host_tier_figures",
    "host_tier_gib_per_gpu",
    "plan_host_tier",
]
