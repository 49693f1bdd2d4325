"""A replica's parallel layout: tensor parallel (TP) within a node, pipeline parallel (PP)
across nodes, and what one GPU of each pipeline stage holds.

Facts from vLLM 0.26.0's source:
- Layers per stage: `get_pp_indices` (vllm/distributed/utils.py): `num_layers // pp` each;
  the remainder goes one layer each to the stages before the last, from the second-to-last
  backwards (the last stage also holds the final norm and the LM head).
- Attention heads must divide by TP (`ModelConfig.verify_with_parallel_config`,
  vllm/config/model.py: "Total number of attention heads ... must be divisible by tensor
  parallel size").
- KV heads (`QKVParallelLinear`, vllm/model_executor/layers/linear.py): TP below the KV-head
  count must divide it; TP at or above it must be a multiple of it (each head is then
  replicated on TP / heads ranks). MLA has one latent per token, replicated on every rank
  (`ModelConfig.get_num_kv_heads`: 1 for MLA), so only the attention-head rule applies.
- vLLM gives every rank the smallest block count of any rank: the stage with the least room
  bounds a replica's tokens (planner/stages.py plans each stage's memory; it is not always
  the stage with the most attention layers).

`spec.placement.parallelism` declares the layout; `kvq plan` shows it. The operator places a
multi-node replica as a LeaderWorkerSet (render/leaderworkerset.py, issue 24).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvq.api.placement import MAX_PIPELINE  # the deepest pipeline the spec describes
from kvq.catalog.models import ModelArchitecture
from kvq.planner.kv import kv_heads_per_gpu, layer_token_bytes

# vLLM's tensor parallel sizes in practice: one node's GPU counts (NVLink domains of 1-8).
TENSOR_SIZES = (1, 2, 4, 8)


class LayoutError(ValueError):
    """A layout vLLM refuses for this model, or that does not fit the nodes."""


@dataclass(frozen=True)
class Layout:
    """TP x PP GPUs for one replica."""

    tensor: int = 1
    pipeline: int = 1

    @property
    def gpus(self) -> int:
        return self.tensor * self.pipeline


@dataclass(frozen=True)
class LayoutPlan:
    """What one replica of a layout is: its nodes and what each stage's GPUs hold."""

    layout: Layout
    nodes: int
    gpus_per_node: int
    stage_layers: tuple[int, ...]
    # Attention layers (those with a KV cache) per stage.
    stage_attention_layers: tuple[int, ...]
    kv_heads_per_gpu: int
    # KV bytes per token on one GPU of the stage with the most attention layers (what
    # bounds the cache is the stage with the least room: planner/stages.py).
    kv_bytes_per_token_per_gpu: int


def stage_layers(num_layers: int, pipeline: int) -> tuple[int, ...]:
    """Layers of each pipeline stage, as vLLM 0.26's get_pp_indices splits them."""
    if not 1 <= pipeline <= num_layers:
        raise LayoutError(f"pipeline size {pipeline} must be between 1 and the {num_layers} layers")
    partitions = [num_layers // pipeline] * pipeline
    for i in range(2, num_layers % pipeline + 2):
        partitions[-i] += 1
    return tuple(partitions)


def valid_tensor_sizes(arch: ModelArchitecture) -> tuple[int, ...]:
    """The TP sizes of TENSOR_SIZES vLLM accepts for this model's heads."""
    return tuple(t for t in TENSOR_SIZES if not _head_problem(arch, t))


def check_layout(arch: ModelArchitecture, layout: Layout) -> None:
    """LayoutError naming the valid sizes when vLLM would refuse this layout."""
    problem = _head_problem(arch, layout.tensor)
    if problem:
        valid = ", ".join(str(t) for t in valid_tensor_sizes(arch)) or "none"
        raise LayoutError(f"tensor parallel size {layout.tensor}: {problem} (valid: {valid})")
    stage_layers(arch.num_layers, layout.pipeline)


def nodes_per_replica(layout: Layout, gpus_per_node: int) -> int:
    """Nodes one replica spans: TP stays within a node, whole TP groups on each node."""
    if gpus_per_node < 1:
        raise LayoutError(f"gpus per node must be >= 1, got {gpus_per_node}")
    if layout.tensor > gpus_per_node:
        raise LayoutError(
            f"tensor parallel size {layout.tensor} exceeds the {gpus_per_node} GPUs of one node"
            " (tensor parallel stays within a node; span nodes with pipeline parallel)"
        )
    if layout.gpus <= gpus_per_node:
        return 1
    if layout.gpus % gpus_per_node or gpus_per_node % layout.tensor:
        raise LayoutError(
            f"{layout.tensor} x {layout.pipeline} = {layout.gpus} GPUs do not fill nodes of"
            f" {gpus_per_node} GPUs with whole tensor-parallel groups (a multi-node replica"
            f" takes every GPU of each of its nodes: tensor x pipeline must be a multiple of"
            f" {gpus_per_node})"
        )
    return layout.gpus // gpus_per_node


def pipeline_candidates(
    arch: ModelArchitecture, tensor: int, gpus_per_node: int
) -> tuple[Layout, ...]:
    """The layouts kvq tries, fewest stages first, when spec.placement.parallelism leaves
    the pipeline out: tensor x 1, 2, ... stages that vLLM accepts for the model and that
    place on nodes of `gpus_per_node` GPUs (nodes_per_replica's rule). The first whose
    replica holds the weights and the KV capacity asked for is the derived layout."""
    found = []
    for pipeline in range(1, min(MAX_PIPELINE, arch.num_layers) + 1):
        layout = Layout(tensor=tensor, pipeline=pipeline)
        try:
            check_layout(arch, layout)
            nodes_per_replica(layout, gpus_per_node)
        except LayoutError:
            continue
        found.append(layout)
    return tuple(found)


def describe(layout: Layout, nodes: int) -> str:
    """`2 nodes (TP 8 x PP 2)`: how status and events name a replica's layout."""
    where = f"{nodes} nodes" if nodes > 1 else "1 node"
    return f"{where} (TP {layout.tensor} x PP {layout.pipeline})"


def plan_layout(
    arch: ModelArchitecture, layout: Layout, gpus_per_node: int, kv_cache_dtype: str = "auto"
) -> LayoutPlan:
    """The layout checked against the model and the nodes, with its per-stage split."""
    check_layout(arch, layout)
    nodes = nodes_per_replica(layout, gpus_per_node)
    layers = stage_layers(arch.num_layers, layout.pipeline)
    kinds = arch.layer_kinds
    attention, start = [], 0
    for count in layers:
        attention.append(sum(1 for k in kinds[start : start + count] if _has_kv(k)))
        start += count
    heads = 1 if arch.attention == "mla" else kv_heads_per_gpu(arch, layout.tensor)
    per_layer = layer_token_bytes(arch, kv_cache_dtype, heads)
    return LayoutPlan(
        layout=layout,
        nodes=nodes,
        gpus_per_node=min(gpus_per_node, layout.gpus),
        stage_layers=layers,
        stage_attention_layers=tuple(attention),
        kv_heads_per_gpu=heads,
        kv_bytes_per_token_per_gpu=max(attention) * per_layer,
    )


def _has_kv(kind: str) -> bool:
    # The same rule as the planner's whole-model count (kv.py): attention layers but
    # linear attention, whose state is per sequence.
    return kind.endswith("_attention") and kind != "linear_attention"


def _head_problem(arch: ModelArchitecture, tensor: int) -> str:
    if arch.num_attention_heads % tensor:
        return f"the {arch.num_attention_heads} attention heads do not divide by it"
    if arch.attention == "mla":
        return ""
    kv = arch.num_kv_heads
    if tensor < kv and kv % tensor:
        return f"the {kv} KV heads do not divide by it"
    if tensor >= kv and tensor % kv:
        return f"it is not a multiple of the {kv} KV heads"
    return ""
