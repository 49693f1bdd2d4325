"""KV-cache bytes per token, per block and per GPU, the way vLLM's KV-cache spec counts them.

vLLM (v1/kv_cache_interface.py) sizes one page as
    GQA: 2 (K and V) x block_size x kv_heads x head_size x dtype bytes      per layer
    MLA: block_size x (kv_lora_rank + qk_rope_head_dim) x dtype bytes       per layer
and `int8_per_token_head` adds one float32 scale for K and one for V per token and KV
head. A block spans every layer, so blocks = floor(available / (page x layers)).
"""

from __future__ import annotations

from typing import Final

from kvq.catalog.models import ModelArchitecture

# The dtypes `kvq plan --kv-cache-dtype all` compares, in the order a user reads them.
PLANNED_DTYPES: Final = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "int8")

_ELEMENT_BYTES: Final = {
    "auto": 2,  # the model dtype: bf16 / fp16
    "bfloat16": 2,
    "float16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
    "fp8_inc": 1,
    "fp8_ds_mla": 1,
    "int8": 1,
    "int8_per_token_head": 1,
    "fp8_per_token_head": 1,
}
# kvq's `int8` is rendered as vLLM's `int8_per_token_head` (no plain int8 upstream).
_PER_TOKEN_HEAD: Final = frozenset({"int8", "int8_per_token_head", "fp8_per_token_head"})
_SCALE_BYTES: Final = 4  # float32 scale, one for K and one for V
# DeepSeek's sparse-MLA fp8 layout: 512 fp8 latent + 4 float32 scales + 64 bf16 rope values.
_FP8_DS_MLA_TOKEN_BYTES: Final = 512 + 4 * 4 + 64 * 2


def kv_element_bytes(kv_cache_dtype: str) -> int:
    """Bytes of one cached K/V element for a `--kv-cache-dtype` value."""
    try:
        return _ELEMENT_BYTES[kv_cache_dtype]
    except KeyError:
        known = ", ".join(sorted(_ELEMENT_BYTES))
        raise ValueError(f"unknown kv_cache_dtype {kv_cache_dtype!r} (known: {known})") from None


def kv_heads_per_gpu(arch: ModelArchitecture, tensor_parallel: int) -> int:
    """KV heads one GPU stores: split across TP ranks, replicated when TP > KV heads."""
    return max(1, -(-arch.num_kv_heads // tensor_parallel))


def layer_token_bytes(arch: ModelArchitecture, kv_cache_dtype: str, kv_heads: int) -> int:
    """One attention layer's KV bytes per token for `kv_heads` heads."""
    element = kv_element_bytes(kv_cache_dtype)
    if arch.attention == "mla":
        if kv_cache_dtype == "fp8_ds_mla":
            return _FP8_DS_MLA_TOKEN_BYTES
        assert arch.kv_lora_rank is not None and arch.rope_head_dim is not None
        return (arch.kv_lora_rank + arch.rope_head_dim) * element
    per_head = 2 * arch.head_dim * element
    if kv_cache_dtype in _PER_TOKEN_HEAD:
        per_head += 2 * _SCALE_BYTES
    return kv_heads * per_head


def _attention_layers(arch: ModelArchitecture) -> int:
    return sum(
        1 for kind in arch.layer_kinds if kind.endswith("_attention") and kind != "linear_attention"
    )


def kv_bytes_per_token(arch: ModelArchitecture, kv_cache_dtype: str) -> int:
    """Whole-model KV bytes for one token: all attention layers, all KV heads (MLA: one
    latent). Sliding and chunked layers count as full here (what a token costs while it is
    in their window); Mamba / linear-attention state is per sequence, not per token."""
    return _attention_layers(arch) * layer_token_bytes(arch, kv_cache_dtype, arch.num_kv_heads)


def kv_bytes_per_token_per_gpu(
    arch: ModelArchitecture, kv_cache_dtype: str, tensor_parallel: int = 1
) -> int:
    """KV bytes one GPU stores per token. MLA's latent is replicated on every rank."""
    heads = kv_heads_per_gpu(arch, tensor_parallel)
    return _attention_layers(arch) * layer_token_bytes(arch, kv_cache_dtype, heads)


def block_bytes_per_gpu(
    arch: ModelArchitecture, kv_cache_dtype: str, block_size: int, tensor_parallel: int = 1
) -> int:
    """One block (block_size tokens across all layers) on one GPU."""
    return block_size * kv_bytes_per_token_per_gpu(arch, kv_cache_dtype, tensor_parallel)


def kv_tokens_for_bytes(available_bytes: int, block_bytes: int, block_size: int) -> tuple[int, int]:
    """(blocks, tokens) vLLM allocates: whole blocks only, never a partial one."""
    blocks = max(0, available_bytes // block_bytes)
    return blocks, blocks * block_size
