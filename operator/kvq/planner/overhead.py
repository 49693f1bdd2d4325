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

from kvq.catalog.engines import DEFAULT_MEMORY_PROFILE, MemoryProfile
from kvq.catalog.gpus import GpuModel
from kvq.catalog.models import ModelArchitecture
from kvq.planner.kv import kv_heads_per_gpu
from kvq.planner.mla_backend import mla_backend

GIB: Final = 1 << 30
MIB: Final = 1 << 20

_ACT_BYTES: Final = 2  # bf16 / fp16 activations
_LOGITS_FP32_BYTES: Final = 4  # the sampler copies logits to float32
# Streaming multiprocessors sizing the V1 sampler's Triton top-k/top-p buffer (H100/H200: 132).
_SM_COUNT: Final = 132
# config/vllm.py DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES (vLLM 0.26.0): MoE classes on V2.
_V2_MOE_ARCHITECTURES: Final = frozenset(
    {
        "DeepseekV2ForCausalLM",
        "GraniteMoeForCausalLM",
        "InklingForCausalLM",
        "LongcatFlashNgramForCausalLM",
        "Qwen2MoeForCausalLM",
    }
)

# Gemma's MLP on a cold start of the V2 runner. vLLM's Gemma-2/3 classes (gemma2.py,
# gemma3.py) always build GeluAndMul(approximate="tanh"); on a cold start the profile's peak
# also holds torch.compile / Inductor scratch (vllm#54122, not fixed in 0.26.0), and every
# kvq pod starts cold (the compile cache lives in the container). Measured on one H200
# (vLLM 0.26.0, 8,192 batched tokens, e2e/gpu/results/2026-12-04-h200-cold-*.md): the
# logged peak is the forward's plus 10.5 bytes per token per intermediate column, on
# Gemma-3-4B, -12B and -27B (10.52, 10.48, 10.51) and Gemma-2-9B (10.15, predicted before
# it ran). Gemma-3-1B peaks below the rule (0.60 GiB logged, 0.88 planned: 0.2 % less KV
# than vLLM's). SiLU MLPs (Llama, Qwen, Phi) add 0.2-0.4 GiB with no rule (README, Known
# error). Under tensor parallel the rank's share of the columns is charged (not measured).
_COLD_COMPILE_ARCHITECTURES: Final = frozenset(
    {"Gemma2ForCausalLM", "Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"}
)
_COLD_COMPILE_HALF_BYTES: Final = 21  # 10.5 bytes per token per column, in half bytes

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

# V1's profiled estimate per graph (FULL and PIECEWISE per capture size), fitted on one
# point: Qwen3-30B-A3B on the H200 (vLLM 0.26.0, 102 graphs) left 0.67 GiB less KV memory
# than weights + activation + non-torch explain.
_CUDAGRAPH_ESTIMATE_PER_GRAPH: Final = round(0.67 * GIB / 102)

# config/attention.py flash_attn_max_num_splits_for_cuda_graph (vLLM 0.26.0).
_FA_MAX_SPLITS: Final = 32

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
ModelRunner = Literal["v1", "v2"]


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
        # Alive when the profile run enters the MLA layer (layers/mla.py forward): the
        # q projection, the fused a-projection output (q latent, kv latent, rope key; the
        # rope key is a view of it), the normed kv latent and the empty attention output.
        assert arch.kv_lora_rank is not None and arch.rope_head_dim is not None
        nope = arch.qk_nope_head_dim or arch.head_dim
        v_dim = arch.v_head_dim or nope
        q = heads * (nope + arch.rope_head_dim)
        a_proj = (arch.q_lora_rank or 0) + arch.kv_lora_rank + arch.rope_head_dim
        return q + a_proj + arch.kv_lora_rank + heads * v_dim
    q = heads * arch.head_dim
    kv = kv_heads_per_gpu(arch, tp) * arch.head_dim
    # qkv projection output, rotated q and k copies, attention output
    return (q + 2 * kv) + (q + kv) + q


def _dense_mlp_width(arch: ModelArchitecture, tp: int) -> int:
    # gate_up output (2 x I) is alive while SiLU-and-mul writes its I-wide result
    return 3 * -(-arch.intermediate_size // tp)


def held_moe_workspace_bytes(arch: ModelArchitecture, tp: int, tokens: int) -> int:
    """The part of the fused-MoE memory still allocated after the forward pass: the
    modular kernels' WorkspaceManager buffer. MXFP4 experts on Hopper run the monolithic
    Triton kernel (fused_moe/oracle/mxfp4.py: TRITON before the CUTLASS and Marlin paths;
    OAITritonMxfp4ExpertsMonolithic first), which allocates inside the kernel and keeps
    nothing (assumed; not yet checked against a gpt-oss log)."""
    if arch.weight_quantization == "mxfp4":
        return 0
    return moe_workspace_bytes(arch, tp, tokens)


def moe_workspace_bytes(arch: ModelArchitecture, tp: int, tokens: int) -> int:
    """The fused-MoE workspace (Triton experts), allocated once and kept for the process.

    TritonExperts.workspace_shapes (fused_moe/experts/triton_moe.py, vLLM 0.26.0): workspace13
    (M, topk, max(I, K)) shared with the (M, K) output, workspace2 (M, topk, max(2I, K)), in
    the activation dtype, for all M tokens at once (0.26 no longer chunks by
    VLLM_FUSED_MOE_CHUNK_SIZE); the WorkspaceManager (v1/worker/workspace.py) keeps the buffer,
    so it is still allocated while the sampler runs.
    """
    if not arch.is_moe:
        return 0
    expert = -(-(arch.moe_intermediate_size or arch.intermediate_size) // tp)
    k, topk = arch.hidden_size, arch.num_experts_per_tok
    ws13 = max(tokens * topk * max(expert, k), tokens * k) * _ACT_BYTES
    ws2 = tokens * topk * max(2 * expert, k) * _ACT_BYTES
    return _round_up(ws13, 256) + _round_up(ws2, 256)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _moe_transient_bytes(arch: ModelArchitecture, tp: int, tokens: int) -> int:
    """Besides the workspace: router logits (bf16), top-k weights and ids, shared experts."""
    shared_width = arch.num_shared_experts * (
        arch.shared_expert_intermediate_size or arch.moe_intermediate_size or 0
    )
    shared = tokens * 3 * -(-shared_width // tp) * _ACT_BYTES
    router = tokens * arch.num_experts * _ACT_BYTES + tokens * arch.num_experts_per_tok * 8
    return shared + router


# MLACommonMetadataBuilder.determine_chunked_prefill_workspace_size (vLLM 0.26.0): at most
# 64k rows of context gathered per prefill chunk.
_MLA_WORKSPACE_CAP_ROWS: Final = 64 * 1024


def mla_chunked_prefill_workspace_rows(
    max_model_len: int, max_num_seqs: int, block_size: int
) -> int:
    """Rows of MLA's chunked-prefill context workspace (layers/attention/mla_attention.py,
    `determine_chunked_prefill_workspace_size`): 8 full-length requests or 4 blocks per
    sequence, capped at 64k, but at least one block per sequence."""
    rows = min(max(8 * max_model_len, 4 * max_num_seqs * block_size), _MLA_WORKSPACE_CAP_ROWS)
    return max(rows, max_num_seqs * block_size)


def mla_profile_up_projection_bytes(
    arch: ModelArchitecture, tensor_parallel: int, workspace_rows: int
) -> int:
    """The tensor every MLA layer allocates in the profile run (attention metadata None).

    MLAAttention.forward_impl (layers/attention/mla_attention.py, vLLM 0.26.0): "During the
    profile run try to simulate to worse case output size for `self.kv_b_proj(kv_c_normed)`
    in `_compute_prefill_context`": torch.empty((chunked_prefill_workspace_size, num_heads,
    qk_nope_head_dim + v_head_dim)) in the activation dtype, whatever the KV-cache dtype.
    Both runners skip attention metadata in profile_run (V1 `_dummy_run`, V2
    `skip_attn=True`). DeepSeek-V3: 65,536 x 128 x 256 x 2 B = 4 GiB.
    """
    if arch.attention != "mla":
        return 0
    heads = -(-arch.num_attention_heads // tensor_parallel)
    nope = arch.qk_nope_head_dim or arch.head_dim
    v_dim = arch.v_head_dim or nope
    return workspace_rows * heads * (nope + v_dim) * _ACT_BYTES


def forward_peak_bytes(
    arch: ModelArchitecture,
    tensor_parallel: int,
    tokens: int,
    *,
    mla_workspace_rows: int = _MLA_WORKSPACE_CAP_ROWS,
) -> int:
    """Torch peak of one forward pass over `tokens` tokens: residual stream + widest transient.

    An MLA layer adds its profile-run up-projection tensor (`mla_profile_up_projection_bytes`)
    on top of its live inputs; once an MoE layer has run, the fused-MoE workspace it keeps
    is still allocated when the next layer's attention runs (DeepSeek-V2-Lite: layer 2 on;
    the 4-layer DeepSeek-V3 has its only MoE layer last, so it never overlaps)."""
    residual = tokens * arch.hidden_size * _ACT_BYTES
    transient = tokens * _attention_width(arch, tensor_parallel) * _ACT_BYTES
    if arch.attention == "mla":
        transient += mla_profile_up_projection_bytes(arch, tensor_parallel, mla_workspace_rows)
        if "moe" in arch.mlp_kinds[:-1]:
            transient += held_moe_workspace_bytes(arch, tensor_parallel, tokens)
    mlps = set(arch.mlp_kinds)
    if "dense" in mlps:
        dense = tokens * _dense_mlp_width(arch, tensor_parallel) * _ACT_BYTES
        transient = max(transient, dense)
    if "moe" in mlps:
        moe = moe_workspace_bytes(arch, tensor_parallel, tokens)
        transient = max(transient, moe + _moe_transient_bytes(arch, tensor_parallel, tokens))
    return residual + transient


def sampler_peak_bytes(
    arch: ModelArchitecture,
    tensor_parallel: int,
    tokens: int,
    max_num_seqs: int,
    runner: ModelRunner = "v2",
) -> int:
    """The sampler's dummy run over `min(max_num_seqs, tokens)` rows of logits, while the
    forward pass's hidden states (and any MoE workspace) are still allocated.

    V2 runner (v1/worker/gpu/sample/sampler.py): bf16 logits, sampled in place.
    V1 runner (v1/sample/sampler.py + ops/topk_topp_sampler.py, forward_native as the GPU
    tier runs it with VLLM_USE_FLASHINFER_SAMPLER=0): the bf16 logits stay referenced while
    a float32 copy, the float32 softmax and the float32 exponential noise are alive, plus
    the Triton top-k/top-p buffer (min(rows, SMs) x vocab float32, cached).
    """
    rows = min(max_num_seqs, tokens)
    hidden = tokens * arch.hidden_size * _ACT_BYTES
    shard = 0 if tensor_parallel == 1 else rows * -(-arch.vocab_size // tensor_parallel) * 2
    if runner == "v2":
        return hidden + shard + rows * arch.vocab_size * _ACT_BYTES
    logits = rows * arch.vocab_size * (_ACT_BYTES + 3 * _LOGITS_FP32_BYTES)
    triton = min(rows, _SM_COUNT) * arch.vocab_size * _LOGITS_FP32_BYTES
    workspace = held_moe_workspace_bytes(arch, tensor_parallel, tokens)
    return hidden + shard + logits + triton + workspace


def activation_peak_bytes(
    arch: ModelArchitecture,
    tensor_parallel: int,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    runner: ModelRunner | None = None,
    *,
    mla_workspace_rows: int = _MLA_WORKSPACE_CAP_ROWS,
    samples: bool = True,
) -> int:
    """What vLLM logs as "peak activation": the larger of the forward's peak (with a cold
    start's compile scratch) and the sampler's. Only the last pipeline stage samples
    (`samples=False` for the others)."""
    runner = runner or model_runner(arch)
    forward = forward_peak_bytes(
        arch, tensor_parallel, max_num_batched_tokens, mla_workspace_rows=mla_workspace_rows
    ) + cold_compile_bytes(arch, tensor_parallel, max_num_batched_tokens, runner)
    if not samples:
        return forward
    return max(
        forward,
        sampler_peak_bytes(arch, tensor_parallel, max_num_batched_tokens, max_num_seqs, runner),
    )


def cold_compile_bytes(
    arch: ModelArchitecture, tensor_parallel: int, tokens: int, runner: ModelRunner
) -> int:
    """What a cold start's compile adds to the forward's logged peak: measured for Gemma's
    MLP on the V2 runner (`_COLD_COMPILE_HALF_BYTES`), nothing elsewhere."""
    if runner != "v2" or arch.hf_architecture not in _COLD_COMPILE_ARCHITECTURES:
        return 0
    columns = -(-arch.intermediate_size // tensor_parallel)
    return tokens * columns * _COLD_COMPILE_HALF_BYTES // 2


def model_runner(
    arch: ModelArchitecture, profile: MemoryProfile = DEFAULT_MEMORY_PROFILE
) -> ModelRunner:
    """Which GPU model runner vLLM picks. 0.26 (config/vllm.py
    `_is_default_v2_model_runner_model`): V2 for dense models and the listed MoE classes,
    V1 for other MoE models and for Mamba / linear-attention hybrids; 0.32: V2."""
    if profile.runner == "v2":
        return "v2"
    if arch.is_hybrid:
        return "v1"
    if arch.is_moe and arch.hf_architecture not in _V2_MOE_ARCHITECTURES:
        return "v1"
    return "v2"


def cudagraph_capture_sizes(max_num_seqs: int, largest: int = 512) -> list[int]:
    """Batch sizes vLLM captures: 1, 2, 4, then every 8 below 256, every 16 from 256 to the
    cap, min(2 x max_num_seqs, 512) (config/vllm.py `_set_cudagraph_sizes`)."""
    cap = min(2 * max_num_seqs, largest)
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, largest + 1, 16)]
    return [s for s in sizes if s <= cap]


def cudagraph_modes(arch: ModelArchitecture) -> int:
    """How many graphs vLLM captures per size: FULL and PIECEWISE, or PIECEWISE alone when
    an attention backend cannot be captured whole. Chunked local attention (Llama-4) is
    AttentionCGSupport.NEVER, so vLLM logs "setting cudagraph_mode=PIECEWISE"
    (config/compilation.py)."""
    return 1 if "chunked_attention" in arch.layer_kinds else 2


def mla_split_accumulator_bytes(
    arch: ModelArchitecture,
    tensor_parallel: int,
    largest: int,
    gpu: GpuModel | None,
    kv_cache_dtype: str = "auto",
) -> int:
    """FlashAttention-MLA's split-KV buffers in the first FULL graph's capture.

    With FULL graphs the backend fixes the split count at
    `flash_attn_max_num_splits_for_cuda_graph` (32, config/attention.py) so that "the
    intermediate buffers of size [num_splits, num_heads, num_tokens, head_size] are
    allocated" at capture (v1/attention/backends/mla/flashattn_mla.py): float32 output
    (head size kv_lora_rank) and log-sum-exp, for the largest capture size. FLASH_ATTN_MLA
    is the backend vLLM picks on Hopper (cc 9.x) for a 16-bit cache; an fp8 cache runs on
    FLASHMLA, which has no such buffers (planner/mla_backend.py); elsewhere kvq adds nothing.
    """
    if mla_backend(arch, kv_cache_dtype, gpu) != "FLASH_ATTN_MLA":
        return 0
    assert arch.kv_lora_rank is not None
    heads = -(-arch.num_attention_heads // tensor_parallel)
    return _FA_MAX_SPLITS * largest * heads * (arch.kv_lora_rank + 1) * _LOGITS_FP32_BYTES


def cudagraph_estimate_bytes(
    arch: ModelArchitecture,
    max_num_seqs: int,
    runner: ModelRunner,
    profile: MemoryProfile = DEFAULT_MEMORY_PROFILE,
    *,
    tensor_parallel: int = 1,
    gpu: GpuModel | None = None,
    kv_cache_dtype: str = "auto",
) -> int:
    """CUDA-graph memory vLLM subtracts before sizing the KV cache.

    vLLM 0.26 profiles graph memory (gpu_worker.py determine_available_memory,
    VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 by default) and subtracts it, but only the V1
    runner measures anything: the V2 runner's profile_cudagraph_memory returns 0
    (v1/worker/gpu/model_runner.py); from 0.32 both runners measure (engines.yaml
    kv_memory_profile). The V1 runner (gpu_model_runner.py profile_cudagraph_memory)
    captures the two largest sizes of each mode and charges the first capture once plus
    the second's increase for every other graph. kvq charges the fitted 6.7 MiB per graph
    (no rule in the source: it is what the capture allocates) plus, for MLA on Hopper, the
    split-KV accumulators of the first FULL capture. gpt-oss captures up to 1,024 tokens
    (models/config.py GptOssForCausalLMConfig), other models up to 512.
    """
    if runner == "v2" and profile.graphs_subtracted == "v1-runner":
        return 0
    largest = 1024 if arch.hf_architecture == "GptOssForCausalLM" else 512
    sizes = cudagraph_capture_sizes(max_num_seqs, largest)
    modes = cudagraph_modes(arch)
    split = 0
    if modes == 2 and sizes:
        split = mla_split_accumulator_bytes(arch, tensor_parallel, sizes[-1], gpu, kv_cache_dtype)
    return modes * len(sizes) * _CUDAGRAPH_ESTIMATE_PER_GRAPH + split


def cudagraph_bytes(arch: ModelArchitecture, max_num_seqs: int) -> int:
    """Rough CUDA-graph pool after capture (FULL and PIECEWISE graphs per size)."""
    graphs = 2 * len(cudagraph_capture_sizes(max_num_seqs))
    return graphs * arch.num_layers * _CUDAGRAPH_BYTES_PER_GRAPH_LAYER
