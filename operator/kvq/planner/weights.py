"""Weight bytes one GPU holds, from the architecture and the weight format.

Tensor parallelism splits every projection and the (vocab-padded) embeddings across
ranks; norms, MoE routers and MLA's kv_a projection are replicated; K/V projections are
replicated when there are fewer KV heads than ranks. AWQ stores linear layers as 4-bit
values packed in int32 plus, per group of 128 inputs, an fp16 scale and a 4-bit zero
point (packed 8 per int32); embeddings, lm_head, norms and routers stay fp16.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

from kvq.catalog.models import ModelArchitecture
from kvq.planner.kv import kv_heads_per_gpu

WeightFormat = Literal["bf16", "fp16", "awq"]

_HALF_BYTES: Final = 2
_VOCAB_PADDING: Final = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE
# Per linear weight element, groups of 128 inputs:
# 0.5 B value + 2 B fp16 scale / 128 + 0.5 B zero point / 128 = 133/256 B.
_AWQ_NUM, _AWQ_DEN = 128 + 4 + 1, 256


@dataclass(frozen=True)
class ParameterCounts:
    """Parameters on one GPU: `linear` is what AWQ quantizes, `other` stays 16-bit."""

    linear: int
    other: int
    experts: int = (
        0  # the routed experts' share of `linear` (MXFP4 checkpoints quantize only these)
    )

    @property
    def total(self) -> int:
        return self.linear + self.other


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _attention_counts(arch: ModelArchitecture, tp: int) -> ParameterCounts:
    h, heads = arch.hidden_size, arch.num_attention_heads
    if arch.attention == "mla":
        assert arch.kv_lora_rank is not None and arch.rope_head_dim is not None
        nope = arch.qk_nope_head_dim if arch.qk_nope_head_dim is not None else arch.head_dim
        v_dim = arch.v_head_dim if arch.v_head_dim is not None else nope
        q_width = heads * (nope + arch.rope_head_dim)
        if arch.q_lora_rank is None:
            q_linear, q_other = h * q_width // tp, 0
        else:
            q_linear = h * arch.q_lora_rank + arch.q_lora_rank * q_width // tp
            q_other = arch.q_lora_rank
        kv_a = h * (arch.kv_lora_rank + arch.rope_head_dim)  # replicated on every rank
        kv_b = arch.kv_lora_rank * heads * (nope + v_dim) // tp
        o = heads * v_dim * h // tp
        return ParameterCounts(q_linear + kv_a + kv_b + o, q_other + arch.kv_lora_rank)
    q_width = heads * arch.head_dim
    kv_width = kv_heads_per_gpu(arch, tp) * arch.head_dim
    linear = h * q_width // tp + 2 * h * kv_width + q_width * h // tp
    bias = q_width // tp + 2 * kv_width if arch.qkv_bias else 0
    return ParameterCounts(linear, bias)


def _mlp_counts(arch: ModelArchitecture, tp: int, moe_layer: bool) -> ParameterCounts:
    h = arch.hidden_size
    if not moe_layer:
        return ParameterCounts(arch.mlp_projections * h * arch.intermediate_size // tp, 0)
    expert = arch.moe_intermediate_size or arch.intermediate_size
    shared = arch.shared_expert_intermediate_size or expert
    routed = arch.num_experts * 3 * h * expert // tp
    linear = routed + arch.num_shared_experts * 3 * h * shared // tp
    return ParameterCounts(linear, h * arch.num_experts, routed)  # router stays replicated


def _state_mixer_counts(arch: ModelArchitecture, tp: int) -> ParameterCounts:
    """One Mamba / gated-delta-net mixer (in/out projections, conv, per-head parameters)."""
    state = arch.state
    assert state is not None
    h = arch.hidden_size
    if state.kind == "gated_delta_net":
        assert state.num_k_heads and state.num_v_heads and state.head_k_dim and state.head_v_dim
        key = state.num_k_heads * state.head_k_dim
        value = state.num_v_heads * state.head_v_dim
        conv = 2 * key + value
        linear = (h * (2 * key + 2 * value + 2 * state.num_v_heads) + value * h) // tp
        other = (conv * state.conv_kernel + 2 * state.num_v_heads) // tp + state.head_v_dim
        return ParameterCounts(linear, other)
    assert state.intermediate_size is not None and state.state_size is not None
    inner = state.intermediate_size
    if state.kind == "mamba2":
        assert state.num_heads is not None
        conv = inner + 2 * state.n_groups * state.state_size
        linear = (h * (inner + conv + state.num_heads) + inner * h) // tp
        other = (conv * state.conv_kernel + 3 * state.num_heads + inner) // tp
        return ParameterCounts(linear, other)
    # Mamba1 (vLLM mamba_mixer.py as Jamba builds it): in_proj, x_proj, dt_proj, out_proj;
    # conv weight + bias, A, D, dt bias split by TP; dt/B/C RMSNorms replicated.
    dt_rank = -(-h // 16)
    linear = (h * 2 * inner + inner * (dt_rank + 2 * state.state_size) + dt_rank * inner) // tp
    linear += inner * h // tp
    other = (inner * state.conv_kernel + inner * state.state_size + 3 * inner) // tp
    return ParameterCounts(linear, other + dt_rank + 2 * state.state_size)


@dataclass(frozen=True)
class StageSpan:
    """The layers one pipeline stage holds (vLLM's get_pp_indices), and its ends: the first
    stage holds the token embedding, the last the final norm and the LM head (and, with tied
    embeddings, its own copy of the embedding: vLLM builds embed_tokens on the last rank
    too, models/llama.py)."""

    start: int
    count: int
    first: bool = True
    last: bool = True

    @staticmethod
    def whole(arch: ModelArchitecture) -> StageSpan:
        return StageSpan(0, arch.num_layers)

    def vocab_matrices(self, tied: bool) -> int:
        if self.first and self.last:
            return 1 if tied else 2
        return int(self.first) + int(self.last)


def parameter_counts_per_gpu(
    arch: ModelArchitecture, tensor_parallel: int = 1, stage: StageSpan | None = None
) -> ParameterCounts:
    """Parameters one rank holds, derived from the shape (vocab padded as vLLM pads it):
    each layer's mixer (attention or Mamba state) and its MLP (dense, experts or none);
    with `stage`, only that pipeline stage's layers and ends."""
    tp = tensor_parallel
    span = stage or StageSpan.whole(arch)
    layers = slice(span.start, span.start + span.count)
    attn = _attention_counts(arch, tp)
    mlp = {
        "dense": _mlp_counts(arch, tp, moe_layer=False),
        "moe": _mlp_counts(arch, tp, moe_layer=True) if arch.is_moe else ParameterCounts(0, 0),
        "none": ParameterCounts(0, 0),
    }
    state = _state_mixer_counts(arch, tp) if arch.state is not None else ParameterCounts(0, 0)
    linear = other = experts = 0
    for kind, mlp_kind in zip(arch.layer_kinds[layers], arch.mlp_kinds[layers], strict=True):
        mixer = {"mamba": state, "linear_attention": state, "mlp": ParameterCounts(0, 0)}.get(
            kind, attn
        )
        linear += mixer.linear + mlp[mlp_kind].linear
        other += mixer.other + mlp[mlp_kind].other
        experts += mlp[mlp_kind].experts
    norms = (2 * span.count + int(span.last)) * arch.hidden_size
    vocab_rows = _ceil_div(_ceil_div(arch.vocab_size, _VOCAB_PADDING) * _VOCAB_PADDING, tp)
    embeddings = vocab_rows * arch.hidden_size * span.vocab_matrices(arch.tie_word_embeddings)
    return ParameterCounts(linear, other + norms + embeddings, experts)


def parameter_count(arch: ModelArchitecture) -> int:
    """Total parameters: the explicit `num_params` when given, else derived from the shape."""
    if arch.num_params is not None:
        return arch.num_params
    return parameter_counts_per_gpu(arch, 1).total


def weight_bytes_per_gpu(
    arch: ModelArchitecture,
    weight_format: WeightFormat = "bf16",
    tensor_parallel: int = 1,
    stage: StageSpan | None = None,
) -> int:
    """Bytes of weights one rank loads (of one pipeline stage, with `stage`)."""
    counts = parameter_counts_per_gpu(arch, tensor_parallel, stage)
    if arch.num_params is not None:
        # Keep the derived split between layers, scaled to the stated total.
        scale = arch.num_params / parameter_counts_per_gpu(arch, 1).total
        counts = ParameterCounts(
            round(counts.linear * scale), round(counts.other * scale), round(counts.experts * scale)
        )
    if weight_format == "awq":
        return counts.linear * _AWQ_NUM // _AWQ_DEN + counts.other * _HALF_BYTES
    if arch.weight_quantization == "fp8":
        # Block FP8 checkpoints (DeepSeek-V3): 1 byte per linear weight + a float32 scale
        # per 128 x 128 block; embeddings, lm_head and norms stay 16-bit.
        return counts.linear + counts.linear // (128 * 128) * 4 + counts.other * _HALF_BYTES
    if arch.weight_quantization == "mxfp4":
        # MXFP4 experts (gpt-oss): 4-bit values + one 8-bit scale per 32 = 17/32 byte.
        dense = counts.linear - counts.experts
        return counts.experts * 17 // 32 + (dense + counts.other) * _HALF_BYTES
    return counts.total * _HALF_BYTES


def rope_cache_bytes(arch: ModelArchitecture) -> int:
    """The rotary cos/sin tables vLLM registers as buffers while loading the model: part
    of "Model loading took", on every rank (layers/rotary_embedding/base.py: a
    (positions, rotary_dim) cache cast to the model dtype). Llama-4's 10,485,760 positions
    x 128 are 2.5 GiB; Gemma-3's linear x8 table 0.5 GiB."""
    return sum(positions * rotary for positions, rotary in arch.rope_tables) * _HALF_BYTES
