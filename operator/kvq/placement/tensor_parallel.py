"""Which tensor- and pipeline-parallel sizes a model can be split into, as vLLM decides at
start-up.

vLLM shards attention by heads: the query heads must divide evenly over the GPUs
("Total number of attention heads must be divisible by tensor parallel size"). KV heads
either divide evenly too or, when there are fewer KV heads than GPUs, are replicated:
then the GPUs must be a multiple of the KV heads (QKVParallelLinear's
`num_kv_head_replicas = divide(tp_size, total_num_kv_heads)`). MLA models have one
latent per token instead of KV heads: only the query heads count. Pipeline stages split the
layers (`get_pp_indices`): more stages than layers leaves a stage with none.
"""

from __future__ import annotations

from kvq.catalog.models import ModelArchitecture

MAX_GPUS_PER_REPLICA = 8
MAX_PIPELINE_STAGES = 16


def layout_problem(
    arch: ModelArchitecture, tensor: int, pipeline: int, declared: bool
) -> str | None:
    """Why vLLM would refuse `tensor` x `pipeline` for `arch`; None when it can. `declared`:
    the spec says placement.parallelism (the message names the field the user wrote)."""
    field = "parallelism.tensor" if declared else "gpusPerReplica"
    problem = tensor_parallel_problem(arch, tensor, field)
    if problem is not None or pipeline <= arch.num_layers:
        return problem
    top = min(arch.num_layers, MAX_PIPELINE_STAGES)
    sizes = ", ".join(str(n) for n in range(1, top + 1)) if top <= 8 else f"1 to {top}"
    return (
        f"parallelism.pipeline {pipeline} is more stages than the model's {arch.num_layers} "
        f"layers (a stage would hold none); valid sizes: {sizes}"
    )


def tensor_parallel_problem(
    arch: ModelArchitecture, tp: int, field: str = "gpusPerReplica"
) -> str | None:
    """Why vLLM would refuse to split `arch` over `tp` GPUs; None when it can."""
    heads = arch.num_attention_heads
    if heads % tp:
        why = f"does not divide the model's {heads} attention heads"
    elif arch.attention == "gqa" and not _kv_heads_split(arch.num_kv_heads, tp):
        kv = arch.num_kv_heads
        why = (
            f"does not divide the model's {kv} KV heads"
            if kv >= tp
            else f"is not a multiple of the model's {kv} KV heads (vLLM replicates KV heads "
            "only in whole copies)"
        )
    else:
        return None
    sizes = ", ".join(str(n) for n in valid_tensor_parallel_sizes(arch))
    return (
        f"{field} {tp} {why}, which vLLM refuses at start-up; valid sizes: "
        f"{sizes or 'none up to ' + str(MAX_GPUS_PER_REPLICA)}"
    )


def valid_tensor_parallel_sizes(
    arch: ModelArchitecture, limit: int = MAX_GPUS_PER_REPLICA
) -> list[int]:
    """Every GPU count from 1 to `limit` that vLLM can split `arch` over."""
    return [
        tp
        for tp in range(1, limit + 1)
        if arch.num_attention_heads % tp == 0
        and (arch.attention != "gqa" or _kv_heads_split(arch.num_kv_heads, tp))
    ]


def _kv_heads_split(kv_heads: int, tp: int) -> bool:
    if kv_heads >= tp:
        return kv_heads % tp == 0
    return tp % kv_heads == 0
