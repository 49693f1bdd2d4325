"""Which MLA attention backend vLLM 0.26 picks on a GPU for a KV-cache dtype, and what the
choice costs: its block size and, for FlashAttention-MLA, the split-KV buffers of the
first FULL CUDA graph.

On Hopper (compute capability 9.x) vLLM's selector (platforms/cuda.py) tries
FLASH_ATTN_MLA, FLASHMLA, TRITON_MLA in that order and keeps the first that supports the
cache dtype. FLASH_ATTN_MLA takes only a 16-bit cache, so an fp8 cache goes to FLASHMLA,
which sets the block size to 64 ("Setting kv cache block size to 64 for FLASHMLA backend")
and captures no split-KV buffers. Measured on an H200 (e2e/gpu/results/2026-12-04-h200*):
DeepSeek-V3 (4 layers) auto logs FLASH_ATTN_MLA and 4.27 GiB of CUDA-graph estimate, fp8
logs FLASHMLA and 0.56 GiB.
"""

from __future__ import annotations

from typing import Final, Literal

from kvq.catalog.gpus import GpuModel
from kvq.catalog.models import ModelArchitecture

MlaBackend = Literal["FLASH_ATTN_MLA", "FLASHMLA"]

FLASHMLA_BLOCK_SIZE: Final = 64
# A cache of this dtype keeps the model's 16-bit activations dtype (bf16/fp16).
_SIXTEEN_BIT: Final = frozenset({"auto", "bfloat16", "float16"})


def mla_backend(
    arch: ModelArchitecture, kv_cache_dtype: str, gpu: GpuModel | None
) -> MlaBackend | None:
    """The backend vLLM 0.26 runs an MLA model's attention with on Hopper; None for other
    attention, other GPUs (kvq models no other MLA backend) or an unknown GPU."""
    if arch.attention != "mla" or gpu is None or gpu.compute_capability[0] != 9:
        return None
    return "FLASH_ATTN_MLA" if kv_cache_dtype in _SIXTEEN_BIT else "FLASHMLA"


def mla_block_size(
    arch: ModelArchitecture, kv_cache_dtype: str, gpu: GpuModel | None, block_size: int
) -> int:
    """The KV block size the engine uses: FLASHMLA's own 64, otherwise `block_size`."""
    if mla_backend(arch, kv_cache_dtype, gpu) == "FLASHMLA":
        return FLASHMLA_BLOCK_SIZE
    return block_size
