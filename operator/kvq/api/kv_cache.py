"""`spec.kvCache`: how vLLM stores the KV cache (dtype, block size, scales)."""

from __future__ import annotations

from typing import Annotated, Literal, get_args

from kvq.api.base import KubeModel
from kvq.api.rules import FieldRule, Rule

KvCacheDtype = Literal["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "int8"]

KV_CACHE_DTYPES: tuple[KvCacheDtype, ...] = get_args(KvCacheDtype)

BLOCK_SIZES = (8, 16, 32, 64, 128, 256)


class KvCacheSpec(KubeModel):
    """How vLLM stores the KV cache."""

    kube_rules = (
        Rule(
            # has(): the API server checks this rule against the bare default {} as well.
            cel="!has(self.calculateScales) || !self.calculateScales || "
            "(has(self.dtype) && self.dtype.startsWith('fp8'))",
            message="calculateScales applies only to fp8 dtypes",
            check=lambda k: not k.calculate_scales or k.dtype.startswith("fp8"),
            field_path=".calculateScales",
        ),
    )

    dtype: KvCacheDtype = "auto"
    """auto (model dtype, no compression), fp8 / fp8_e4m3 / fp8_e5m2 (half the KV memory on
    Ada, Hopper and later) or int8 (int8_per_token_head on vLLM 0.22+)."""
    block_size: Annotated[
        int | None,
        FieldRule(
            cel="self in [8, 16, 32, 64, 128, 256]",
            message="blockSize must be one of 8, 16, 32, 64, 128, 256 (tokens per "
            "PagedAttention block)",
            check=lambda v: v in BLOCK_SIZES,
        ),
    ] = None
    """Tokens per PagedAttention block; the engine's default (16) when omitted."""
    calculate_scales: bool = False
    """Compute fp8 KV scales from the first batches (engines that still have the flag)."""
