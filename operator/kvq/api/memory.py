"""`spec.memory`: the GPU memory budget, the KV cache's CPU tier and context length."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from kvq.api.base import KubeModel
from kvq.api.rules import FieldRule


class MemorySpec(KubeModel):
    """GPU memory budget and context length."""

    gpu_memory_utilization: Annotated[
        float,
        FieldRule(
            cel="self > 0.0 && self <= 1.0",
            message="gpuMemoryUtilization is the fraction of each GPU's memory vLLM may use: "
            "it must be greater than 0 and at most 1",
            check=lambda v: 0.0 < v <= 1.0,
        ),
    ] = 0.90
    """Fraction of each GPU's memory vLLM may use (0.90-0.95 dedicated, 0.6-0.8 shared)."""
    swap_space_gib: Annotated[
        float | None,
        Field(alias="swapSpaceGiB"),
        FieldRule(
            cel="self >= 0.0 && self <= 1024.0",
            message="swapSpaceGiB must be between 0 and 1024 (GiB of CPU memory per GPU)",
            check=lambda v: 0.0 <= v <= 1024.0,
        ),
    ] = None
    """CPU memory per GPU that catches the KV cache (pinned host memory, counted in the
    pod's memory request). vLLM 0.8-0.10 (V0 engine): --swap-space, a preempted sequence's
    blocks are swapped out and back in (omitted: the engine's 4 GiB). vLLM 0.12+ (V1, which
    never swaps): KV offloading, blocks evicted from the GPU stay in host memory and a
    prefix hit loads them back instead of recomputing them (--kv-offloading-size, this
    times gpusPerReplica; omitted: none). Helps shared prefixes and long multi-turn
    sessions; a latency-critical service should use 0. Refused where the engine keeps no
    CPU tier (vLLM 0.11; native offloading before 0.14)."""
    offload_backend: Literal["native", "lmcache"] = "native"
    """KV offloading backend (vLLM 0.12+): native (vLLM's own connector, vLLM 0.14+) or
    lmcache (LMCache in the engine, vLLM 0.12-0.22, an image that has LMCache)."""
    max_model_len: Annotated[
        int | None,
        FieldRule(
            cel="self >= 16 && self <= 10485760",
            message="maxModelLen must be between 16 and 10485760 tokens",
            check=lambda v: 16 <= v <= 10_485_760,
        ),
    ] = None
    """Context length per request; the model's own maximum when omitted."""
    max_num_seqs: Annotated[
        int | None,
        FieldRule(
            cel="self >= 1 && self <= 65536",
            message="maxNumSeqs must be between 1 and 65536",
            check=lambda v: 1 <= v <= 65_536,
        ),
    ] = None
    """Most sequences the engine batches at once."""
