"""Pipeline stages of one replica: each stage's GPUs planned on their own, the replica's KV
cache sized by the stage with the least room.

vLLM 0.26.0: every worker profiles its own memory (gpu_worker.py
`determine_available_memory`: its stage's weights, its activation peak) and sizes its own
KV-cache groups from the layers it holds; `get_kv_cache_configs`
(v1/core/kv_cache_utils.py) then gives every worker the smallest block count of any worker,
because one scheduler allocates blocks for all of them. So the bounding stage is the one
with the fewest blocks: not always the one with the most attention layers (DeepSeek-V3 on
TP 8 x PP 2: the second stage's 30 layers are all experts, the first stage's 31 include the
3 dense ones, and the LM head sits on the second).

What a stage holds (planner/weights.py StageSpan): its layers (`get_pp_indices`), the
embedding on the first stage, the final norm and LM head on the last (tied embeddings: a
copy on both ends). Only the last stage runs the sampler in the profile run
(gpu_model_runner.py `profile_run`: `if get_pp_group().is_last_rank`).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from kvq.catalog.models import ModelArchitecture
from kvq.planner.layout import stage_layers
from kvq.planner.weights import StageSpan


class StageCapacity(BaseModel):
    """One pipeline stage on one of its GPUs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    first_layer: int
    layers: int
    attention_layers: int
    weight_bytes_per_gpu: int
    activation_bytes: int
    available_kv_bytes: int
    kv_bytes_per_token_per_gpu: int
    block_bytes_per_gpu: int
    num_blocks: int
    fits: bool
    reason: str | None = None


def stage_spans(arch: ModelArchitecture, pipeline: int) -> tuple[StageSpan, ...]:
    """Each stage's layers and ends, as vLLM splits the model (LayoutError past the layers)."""
    counts = stage_layers(arch.num_layers, pipeline)
    spans, start = [], 0
    for index, count in enumerate(counts):
        spans.append(StageSpan(start, count, first=index == 0, last=index == pipeline - 1))
        start += count
    return tuple(spans)


def stage_architecture(arch: ModelArchitecture, span: StageSpan) -> ModelArchitecture:
    """The model as one stage sees it: its layers only (types, windows and MLP kinds kept
    per layer), for the KV-cache layout, the activation peak and the CUDA graphs."""
    if span.start == 0 and span.count == arch.num_layers:
        return arch
    layers = slice(span.start, span.start + span.count)
    return arch.model_copy(
        update={
            "num_layers": span.count,
            "layer_types": arch.layer_types[layers],
            "layer_windows": arch.layer_windows[layers],
            "layer_mlp": arch.mlp_kinds[layers],
        }
    )


def stage_skip_layers(skip_layers: tuple[str, ...], span: StageSpan) -> tuple[str, ...]:
    """--kv-cache-dtype-skip-layers as one stage reads it: the model's layer indices that
    fall in the stage, renumbered from the stage's first layer ("sliding_window" kept)."""
    found: list[str] = []
    for value in skip_layers:
        if not value.isdigit():
            found.append(value)
        elif span.start <= int(value) < span.start + span.count:
            found.append(str(int(value) - span.start))
    return tuple(found)


def attention_layers(arch: ModelArchitecture) -> int:
    """Layers that keep a KV cache per token (linear attention keeps a state instead)."""
    return sum(
        1 for kind in arch.layer_kinds if kind.endswith("_attention") and kind != "linear_attention"
    )
