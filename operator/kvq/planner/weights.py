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
        return ParameterCounts(3 * h * arch.intermediate_size // tp, 0)
    expert = arch.moe_intermediate_size or arch.intermediate_size
    shared = arch.shared_expert_intermediate_size or expert
    linear = (arch.num_experts * 3 * h * expert + arch.num_shared_experts * 3 * h * shared) // tp
    return ParameterCounts(linear, h * arch.num_experts)  # router stays replicated


def parameter_counts_per_gpu(arch: ModelArchitecture, tensor_parallel: int = 1) -> ParameterCounts:
    """Parameters one rank holds, derived from the shape (vocab padded as vLLM pads it)."""
    tp = tensor_parallel
    attn = _attention_counts(arch, tp)
    moe_layers = arch.num_layers - arch.first_k_dense_replace if arch.is_moe else 0
    dense = _mlp_counts(arch, tp, moe_layer=False)
    moe = _mlp_counts(arch, tp, moe_layer=True)
    linear = (
        arch.num_layers * attn.linear
        + (arch.num_layers - moe_layers) * dense.linear
        + moe_layers * moe.linear
    )
    norms = (2 * arch.num_layers + 1) * arch.hidden_size
    other = arch.num_layers * attn.other + moe_layers * moe.other + norms
    vocab_rows = _ceil_div(_ceil_div(arch.vocab_size, _VOCAB_PADDING) * _VOCAB_PADDING, tp)
    embeddings = vocab_rows * arch.hidden_size * (1 if arch.tie_word_embeddings else 2)
    return ParameterCounts(linear, other + embeddings)


def parameter_count(arch: ModelArchitecture) -> int:
    """Total parameters: the explicit `num_params` when given, else derived from the shape."""
    if arch.num_params is not None:
        return arch.num_params
    return parameter_counts_per_gpu(arch, 1).total


def weight_bytes_per_gpu(
    arch: ModelArchitecture, weight_format: WeightFormat = "bf16", tensor_parallel: int = 1
) -> int:
    """Bytes of weights one rank loads."""
    counts = parameter_counts_per_gpu(arch, tensor_parallel)
    if arch.num_params is not None:
        # Keep the derived split between layers, scaled to the stated total.
        scale = arch.num_params / parameter_counts_per_gpu(arch, 1).total
        counts = ParameterCounts(round(counts.linear * scale), round(counts.other * scale))
    if weight_format == "awq":
        return counts.linear * _AWQ_NUM // _AWQ_DEN + counts.other * _HALF_BYTES
    return counts.total * _HALF_BYTES
