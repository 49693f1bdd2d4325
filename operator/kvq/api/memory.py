"""`spec.memory`: the GPU memory budget, swap space and context length."""

from __future__ import annotations

from typing import Annotated

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
    """CPU swap space for KV overflow, GiB per GPU; the engine's default (4 GiB up to vLLM
    0.17) when omitted. Engines from vLLM 0.18 have no swap: a value set here is then not
    rendered, and status says so. Latency-sensitive services should use 0."""
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
