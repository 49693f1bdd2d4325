"""`spec.model.architecture`: the model's shape, for capacity planning without a catalog entry."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from kvq.api.base import KubeModel
from kvq.api.rules import Rule

AttentionKind = Literal["gqa", "mla"]


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
