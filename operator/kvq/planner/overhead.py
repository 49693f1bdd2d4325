"""Memory vLLM spends on a GPU besides weights and KV cache, modelled from the architecture.

vLLM (v1/worker/gpu_worker.py, `determine_available_memory`) sizes the KV cache as

    available = cuda_total x gpu_memory_utilization
                - weights - torch peak increase during profile_run - non-torch increase

`profile_run` runs one forward pass over `max_num_batched_tokens` tokens (attention
skipped) and then the sampler over `min(max_num_seqs, tokens)` rows, so the torch peak
is the larger of the two. The CUDA context and NCCL buffers exist before the baseline
snapshot and CUDA graphs are captured after the KV cache is allocated: none of them is
subtracted, but all must fit in the `1 - gpu_memory_utilization` headroom.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from kvq.catalog.gpus import GpuModel
from kvq.catalog.models import ModelArchitecture
from kvq.planner.kv import kv_heads_per_gpu

GIB: Final = 1 << 30
MIB: Final = 1 << 20

_ACT_BYTES: Final = 2  # bf16 / fp16 activations
_LOGITS_FP32_BYTES: Final = 4  # the sampler copies logits to float32
_FUSED_MOE_CHUNK: Final = 32768  # VLLM_FUSED_MOE_CHUNK_SIZE: fused MoE runs in token chunks

# CUDA reports less memory than the driver: H200 143771 -> 143155 MiB (0.43%, our H200
# log), H100 81559 -> 81121 MiB (0.54%, vLLM PR #10511). Rows without a measurement
# use the mean.
_DRIVER_RESERVED_FRACTION: Final = 0.005
# Measured on the H200 (vLLM 0.26.0): cuBLAS/cuBLASLt workspaces and kernel images
# loaded during profile_run ("0.22 GiB for non-torch memory"), and the CUDA context
# (free 139.29 of 139.8 GiB at start).
NON_TORCH_BYTES: Final = round(0.22 * GIB)
CUDA_CONTEXT_BYTES: Final = round(0.51 * GIB)
# CUDA graphs (FULL_AND_PIECEWISE): 0.99 GiB for 2 x 51 capture sizes x 32 layers on the
# H200 Llama-3-8B run; scaled by graphs x layers. Only used for the headroom warning.
_CUDAGRAPH_BYTES_PER_GRAPH_LAYER: Final = round(0.99 * GIB / (2 * 51 * 32))

# vLLM's scheduler defaults (engine/arg_utils.py `get_batch_defaults`): GPUs with at least
# 70 GiB that are not an A100 get the large budget.
_LARGE_GPU_BYTES: Final = 70 * GIB
_BATCH_DEFAULTS: Final = {
    ("serve", True): (8192, 1024),
    ("offline", True): (16384, 1024),
    ("serve", False): (2048, 256),
    ("offline", False): (8192, 256),
}

Usage = Literal["serve", "offline"]


@dataclass(frozen=True)
class SchedulerLimits:
    max_num_batched_tokens: int
    max_num_seqs: int


def cuda_total_bytes(gpu: GpuModel) -> int:
    """What `torch.cuda.mem_get_info` reports as total: the base of gpu_memory_utilization."""
    if gpu.cuda_total_mib is not None:
        return gpu.cuda_total_mib * MIB
    return round(gpu.memory_mib * (1 - _DRIVER_RESERVED_FRACTION)) * MIB


def engine_scheduler_defaults(gpu: GpuModel, usage: Usage = "serve") -> SchedulerLimits:
    """The batched-token budget and sequence cap vLLM picks when the user sets neither."""
    large = cuda_total_bytes(gpu) >= _LARGE_GPU_BYTES and "a100" not in gpu.product.lower()
    tokens, seqs = _BATCH_DEFAULTS[(usage, large)]
    return SchedulerLimits(tokens, min(seqs, tokens))


def _attention_width(arch: ModelArchitecture, tp: int) -> int:
    """Activation columns live around one attention call on one rank."""
    heads = -(-arch.num_attention_heads // tp)
    if arch.attention == "mla":
        assert arch.kv_lora_rank is not None and arch.rope_head_dim is not None
        nope = arch.qk_nope_head_dim or arch.head_dim
        v_dim = arch.v_head_dim or nope
        q = heads * (nope + arch.rope_head_dim)
        return q + (arch.kv_lora_rank + arch.rope_head_dim) + heads * (nope + v_dim) + heads * v_dim
    q = heads * arch.head_dim
    kv = kv_heads_per_gpu(arch, tp) * arch.head_dim
    # qkv projection output, rotated q and k copies, attention output
    return (q + 2 * kv) + (q + kv) + q


def _dense_mlp_width(arch: ModelArchitecture, tp: int) -> int:
    # gate_up output (2 x I) is alive while SiLU-and-mul writes its I-wide result
    return 3 * -(-arch.intermediate_size // tp)


def _moe_bytes(arch: ModelArchitecture, tp: int, tokens: int) -> int:
    """Fused-MoE caches: per routed copy of a token 2I + I (gate_up, act) and H (output)."""
    expert = -(-(arch.moe_intermediate_size or arch.intermediate_size) // tp)
    chunk = min(tokens, _FUSED_MOE_CHUNK)
    routed = chunk * arch.num_experts_per_tok * (3 * expert + arch.hidden_size) * _ACT_BYTES
    shared_width = arch.num_shared_experts * (
        arch.shared_expert_intermediate_size or arch.moe_intermediate_size or 0
    )
    shared = tokens * 3 * -(-shared_width // tp) * _ACT_BYTES
    router_logits = tokens * arch.num_experts * _LOGITS_FP32_BYTES
    return routed + shared + router_logits


def forward_peak_bytes(arch: ModelArchitecture, tensor_parallel: int, tokens: int) -> int:
    """Torch peak of one forward pass over `tokens` tokens: residual stream + widest transient."""
    residual = tokens * arch.hidden_size * _ACT_BYTES
    transient = tokens * _attention_width(arch, tensor_parallel) * _ACT_BYTES
    if not arch.is_moe or arch.first_k_dense_replace > 0:
        dense = tokens * _dense_mlp_width(arch, tensor_parallel) * _ACT_BYTES
        transient = max(transient, dense)
    if arch.is_moe:
        transient = max(transient, _moe_bytes(arch, tensor_parallel, tokens))
    return residual + transient


def sampler_peak_bytes(
    arch: ModelArchitecture, tensor_parallel: int, tokens: int, max_num_seqs: int
) -> int:
    """Sampler dummy run: bf16 logits (gathered across ranks) and their float32 copy,
    while the forward pass's hidden states are still referenced."""
    rows = min(max_num_seqs, tokens)
    hidden = tokens * arch.hidden_size * _ACT_BYTES
    shard = 0 if tensor_parallel == 1 else rows * -(-arch.vocab_size // tensor_parallel) * 2
    logits = rows * arch.vocab_size * (_ACT_BYTES + _LOGITS_FP32_BYTES)
    return hidden + shard + logits


def activation_peak_bytes(
    arch: ModelArchitecture, tensor_parallel: int, max_num_batched_tokens: int, max_num_seqs: int
) -> int:
    """What vLLM logs as "peak activation": the larger of forward and sampler peaks."""
    return max(
        forward_peak_bytes(arch, tensor_parallel, max_num_batched_tokens),
        sampler_peak_bytes(arch, tensor_parallel, max_num_batched_tokens, max_num_seqs),
    )


def cudagraph_capture_sizes(max_num_seqs: int) -> list[int]:
    """Batch sizes vLLM captures: 1, 2, 4, then every 8 to 256, every 16 to the cap."""
    cap = min(2 * max_num_seqs, 512)
    sizes = [1, 2, 4, *range(8, 257, 8), *range(272, 513, 16)]
    return [s for s in sizes if s <= cap]


def cudagraph_bytes(arch: ModelArchitecture, max_num_seqs: int) -> int:
    """Rough CUDA-graph pool after capture (FULL and PIECEWISE graphs per size)."""
    graphs = 2 * len(cudagraph_capture_sizes(max_num_seqs))
    return graphs * arch.num_layers * _CUDAGRAPH_BYTES_PER_GRAPH_LAYER
