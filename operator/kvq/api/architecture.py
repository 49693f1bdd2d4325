"""`spec.model.architecture`: the model's shape, for capacity planning without a catalog entry."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from kvq.api.base import KubeModel
from kvq.api.rules import Rule

AttentionKind = Literal["gqa", "mla"]
# What vLLM's KV-cache manager keeps per layer (vllm/v1/kv_cache_interface.py, 0.26.0): a full
# attention page per token, a sliding window, a chunk of local attention (Llama-4), a fixed
# recurrent state per sequence (Mamba; gated delta net = linear_attention), or nothing (mlp).
LayerType = Literal[
    "full_attention", "sliding_attention", "chunked_attention", "linear_attention", "mamba", "mlp"
]
MlpKind = Literal["dense", "moe", "none"]
StateKind = Literal["mamba1", "mamba2", "gated_delta_net"]


_STATE_NEEDS = {
    "mamba1": ("intermediate_size", "state_size"),
    "mamba2": ("intermediate_size", "state_size", "num_heads", "head_dim"),
    "gated_delta_net": ("num_k_heads", "num_v_heads", "head_k_dim", "head_v_dim"),
}


class StateSpec(KubeModel):
    """The fixed per-sequence state of Mamba / linear-attention layers (config.json names
    in brackets); vLLM keeps one per sequence and layer, whatever the context length."""

    kube_rules = (
        Rule(
            cel="self.kind != 'mamba1' || (has(self.intermediateSize) && has(self.stateSize))",
            message="a mamba1 state needs intermediateSize (mamba_expand x hidden_size) and "
            "stateSize (mamba_d_state)",
            check=lambda s: (
                s.kind != "mamba1" or (s.intermediate_size is not None and s.state_size is not None)
            ),
        ),
        Rule(
            cel="self.kind != 'mamba2' || (has(self.intermediateSize) && has(self.stateSize) "
            "&& has(self.numHeads) && has(self.headDim))",
            message="a mamba2 state needs intermediateSize, stateSize, numHeads and headDim "
            "(mamba heads x head dim, ssm_state_size)",
            check=lambda s: (
                s.kind != "mamba2"
                or all(
                    v is not None
                    for v in (s.intermediate_size, s.state_size, s.num_heads, s.head_dim)
                )
            ),
        ),
        Rule(
            cel="self.kind != 'gated_delta_net' || (has(self.numKHeads) && has(self.numVHeads) "
            "&& has(self.headKDim) && has(self.headVDim))",
            message="a gated_delta_net state needs numKHeads, numVHeads, headKDim and headVDim "
            "(config.json linear_num_key_heads, linear_num_value_heads, linear_key_head_dim, "
            "linear_value_head_dim)",
            check=lambda s: (
                s.kind != "gated_delta_net"
                or all(
                    v is not None
                    for v in (s.num_k_heads, s.num_v_heads, s.head_k_dim, s.head_v_dim)
                )
            ),
        ),
    )

    kind: StateKind
    """mamba1 (Jamba), mamba2 (Nemotron-H, Granite-4.0-H) or gated_delta_net (Qwen3-Next)."""
    conv_kernel: Annotated[int, Field(ge=2, le=64)] = 4
    """Convolution width (conv_kernel, mamba_d_conv, linear_conv_kernel_dim)."""
    intermediate_size: Annotated[int | None, Field(ge=1, le=1_048_576)] = None
    """Mamba inner width."""
    state_size: Annotated[int | None, Field(ge=1, le=65_536)] = None
    """SSM state size (ssm_state_size, mamba_d_state)."""
    n_groups: Annotated[int, Field(ge=1, le=1024)] = 1
    """Mamba2 groups (n_groups, mamba_n_groups)."""
    num_heads: Annotated[int | None, Field(ge=1, le=65_536)] = None
    """Mamba2 heads (mamba_num_heads, mamba_n_heads)."""
    head_dim: Annotated[int | None, Field(ge=1, le=65_536)] = None
    """Mamba2 head dimension (mamba_head_dim, mamba_d_head)."""
    num_k_heads: Annotated[int | None, Field(ge=1, le=65_536)] = None
    """Gated delta net key heads."""
    num_v_heads: Annotated[int | None, Field(ge=1, le=65_536)] = None
    """Gated delta net value heads."""
    head_k_dim: Annotated[int | None, Field(ge=1, le=65_536)] = None
    """Gated delta net key head dimension."""
    head_v_dim: Annotated[int | None, Field(ge=1, le=65_536)] = None
    """Gated delta net value head dimension."""
    ssm_dtype: Literal["float32", "bfloat16", "float16"] | None = None
    """The model's own dtype for the ssm state (Nemotron-H: float32); the model dtype if unset."""


_HAS_TYPE_CEL = "has(self.layerTypes) && self.layerTypes.exists(t, t == '{0}')"


def _has_type(a: ArchitectureSpec, *kinds: str) -> bool:
    return a.layer_types is not None and any(t in kinds for t in a.layer_types)


class ArchitectureSpec(KubeModel):
    """Architecture facts for capacity planning when kvq cannot look the model up.

    Copy them from the model's config.json (num_hidden_layers, num_key_value_heads, ...).
    """

    kube_rules = (
        Rule(
            cel="self.attention != 'mla' || (has(self.kvLoraRank) && has(self.ropeHeadDim))",
            message="attention mla needs kvLoraRank and ropeHeadDim (its KV cache holds the "
            "compressed latent, not per-head keys and values)",
            check=lambda a: (
                a.attention != "mla" or (a.kv_lora_rank is not None and a.rope_head_dim is not None)
            ),
        ),
        Rule(
            cel="self.attention != 'gqa' || (has(self.numKvHeads) && has(self.headDim))",
            message="attention gqa needs numKvHeads and headDim",
            check=lambda a: (
                a.attention != "gqa" or (a.num_kv_heads is not None and a.head_dim is not None)
            ),
        ),
        Rule(
            cel="!has(self.numKvHeads) || !has(self.numAttentionHeads) || "
            "self.numAttentionHeads % self.numKvHeads == 0",
            message="numAttentionHeads must be a multiple of numKvHeads",
            check=lambda a: (
                a.num_kv_heads is None
                or a.num_attention_heads is None
                or a.num_attention_heads % a.num_kv_heads == 0
            ),
            field_path=".numKvHeads",
        ),
        Rule(
            cel="!has(self.layerTypes) || size(self.layerTypes) == self.numLayers",
            message="layerTypes needs one entry per layer (numLayers)",
            check=lambda a: a.layer_types is None or len(a.layer_types) == a.num_layers,
            field_path=".layerTypes",
        ),
        Rule(
            cel="!has(self.layerWindows) || size(self.layerWindows) == self.numLayers",
            message="layerWindows needs one entry per layer (numLayers; 0 = slidingWindow)",
            check=lambda a: a.layer_windows is None or len(a.layer_windows) == a.num_layers,
            field_path=".layerWindows",
        ),
        Rule(
            cel="!(" + _HAS_TYPE_CEL.format("sliding_attention") + ") || has(self.slidingWindow) "
            "|| has(self.layerWindows)",
            message="sliding_attention layers need slidingWindow (or layerWindows): their KV "
            "cache holds only that many tokens",
            check=lambda a: (
                not _has_type(a, "sliding_attention")
                or a.sliding_window is not None
                or a.layer_windows is not None
            ),
        ),
        Rule(
            cel="!(" + _HAS_TYPE_CEL.format("chunked_attention") + ") || "
            "has(self.attentionChunkSize)",
            message="chunked_attention layers need attentionChunkSize",
            check=lambda a: (
                not _has_type(a, "chunked_attention") or a.attention_chunk_size is not None
            ),
        ),
        Rule(
            cel="!("
            + _HAS_TYPE_CEL.format("mamba")
            + " || "
            + _HAS_TYPE_CEL.format("linear_attention")
            + ") || has(self.state)",
            message="mamba and linear_attention layers need state (its kind and shape): vLLM "
            "keeps one such state per sequence and layer",
            check=lambda a: not _has_type(a, "mamba", "linear_attention") or a.state is not None,
        ),
        Rule(
            cel="!has(self.numExpertsPerTok) || (has(self.numExperts) && "
            "self.numExpertsPerTok <= self.numExperts)",
            message="numExpertsPerTok needs numExperts and cannot exceed it",
            check=lambda a: (
                a.num_experts_per_tok is None
                or (a.num_experts is not None and a.num_experts_per_tok <= a.num_experts)
            ),
            field_path=".numExpertsPerTok",
        ),
        Rule(
            cel="has(self.numParams) || (has(self.hiddenSize) && has(self.intermediateSize) "
            "&& has(self.vocabSize))",
            message="give hiddenSize, intermediateSize and vocabSize, or numParams: kvq needs "
            "the weight size to know what memory is left for the KV cache",
            check=lambda a: (
                a.num_params is not None
                or (
                    a.hidden_size is not None
                    and a.intermediate_size is not None
                    and a.vocab_size is not None
                )
            ),
        ),
    )

    num_layers: Annotated[int, Field(ge=1, le=1024)]
    """Number of transformer layers (config.json num_hidden_layers)."""
    attention: AttentionKind = "gqa"
    """gqa (multi-head or grouped-query attention) or mla (DeepSeek-style latent attention)."""
    num_attention_heads: Annotated[int | None, Field(ge=1, le=1024)] = None
    """Query heads (config.json num_attention_heads)."""
    num_kv_heads: Annotated[int | None, Field(ge=1, le=1024)] = None
    """Key/value heads (config.json num_key_value_heads); equals the query heads without GQA."""
    head_dim: Annotated[int | None, Field(ge=1, le=4096)] = None
    """Dimension of one attention head."""
    # Upper bounds far above any model, below int64 (the API server refuses larger integers).
    hidden_size: Annotated[int | None, Field(ge=1, le=1_048_576)] = None
    """Model width (config.json hidden_size)."""
    intermediate_size: Annotated[int | None, Field(ge=1, le=4_194_304)] = None
    """MLP width (config.json intermediate_size)."""
    vocab_size: Annotated[int | None, Field(ge=1, le=16_777_216)] = None
    """Vocabulary size (config.json vocab_size)."""
    num_params: Annotated[int | None, Field(ge=1, le=10**15)] = None
    """Total parameter count; overrides the estimate from the shape."""
    kv_lora_rank: Annotated[int | None, Field(ge=1, le=65_536)] = None
    """MLA only: rank of the compressed KV latent (config.json kv_lora_rank)."""
    rope_head_dim: Annotated[int | None, Field(ge=1, le=4096)] = None
    """MLA only: decoupled RoPE key dimension (config.json qk_rope_head_dim)."""
    layer_types: Annotated[list[LayerType] | None, Field(max_length=1024)] = None
    """One per layer: full_attention, sliding_attention, chunked_attention (Llama-4),
    linear_attention (gated delta net), mamba, or mlp (no cache). Unset: every layer full
    attention (or sliding, when only slidingWindow is set)."""
    sliding_window: Annotated[int | None, Field(ge=1, le=16_777_216)] = None
    """Tokens a sliding_attention layer attends to (config.json sliding_window)."""
    layer_windows: Annotated[
        list[Annotated[int, Field(ge=0, le=16_777_216)]] | None, Field(max_length=1024)
    ] = None
    """Per-layer sliding windows, one per layer (0: slidingWindow)."""
    attention_chunk_size: Annotated[int | None, Field(ge=1, le=16_777_216)] = None
    """Chunk of chunked_attention layers (config.json attention_chunk_size)."""
    num_experts: Annotated[int | None, Field(ge=1, le=65_536)] = None
    """Routed experts per MoE layer (num_experts, num_local_experts, n_routed_experts)."""
    num_experts_per_tok: Annotated[int | None, Field(ge=1, le=1024)] = None
    """Experts each token is routed to (top-k)."""
    moe_intermediate_size: Annotated[int | None, Field(ge=1, le=4_194_304)] = None
    """Width of one expert (moe_intermediate_size)."""
    num_shared_experts: Annotated[int | None, Field(ge=0, le=1024)] = None
    """Shared experts every token also runs."""
    shared_expert_intermediate_size: Annotated[int | None, Field(ge=1, le=4_194_304)] = None
    """Width of the shared expert(s), when it differs from an expert's."""
    state: StateSpec | None = None
    """The Mamba / linear-attention state, for mamba and linear_attention layers."""
    model_class: Annotated[
        str | None, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    ] = None
    """vLLM's model class (config.json architectures[0], e.g. Gemma3ForCausalLM): it picks
    vLLM's model runner and kernels the plan accounts for (Gemma's MLP on a cold start)."""
