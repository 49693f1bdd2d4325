"""A replica's TP x PP layout (kvq.planner.layout): vLLM 0.26's layer split and head rules,
the nodes a replica spans, and the KV one GPU holds per token."""

from __future__ import annotations

import pytest

from kvq.catalog.models import ModelArchitecture, load_model_catalog
from kvq.planner.kv import kv_bytes_per_token_per_gpu
from kvq.planner.layout import (
    Layout,
    LayoutError,
    check_layout,
    nodes_per_replica,
    plan_layout,
    stage_layers,
    valid_tensor_sizes,
)


def _arch(name: str) -> ModelArchitecture:
    model = load_model_catalog().lookup(name)
    assert model is not None
    return model.architecture


def test_layers_split_as_vllm_does_with_the_remainder_before_the_last_stage() -> None:
    # get_pp_indices: Llama-3.1-405B's 126 layers on 4 stages, DeepSeek-V3's 61 on 2.
    assert stage_layers(126, 4) == (31, 32, 32, 31)
    assert stage_layers(61, 2) == (31, 30)
    assert stage_layers(32, 2) == (16, 16)
    with pytest.raises(LayoutError, match="between 1 and the 32 layers"):
        stage_layers(32, 33)


def test_a_tensor_size_the_heads_do_not_divide_names_the_valid_sizes() -> None:
    gemma_1b = _arch("google/gemma-3-1b-it")  # 4 attention heads, 1 KV head
    assert valid_tensor_sizes(gemma_1b) == (1, 2, 4)
    with pytest.raises(LayoutError, match=r"4 attention heads do not divide.*\(valid: 1, 2, 4\)"):
        check_layout(gemma_1b, Layout(tensor=8))
    # TP below the KV heads must divide them (QKVParallelLinear).
    odd_kv = gemma_1b.model_copy(update={"num_attention_heads": 48, "num_kv_heads": 12})
    with pytest.raises(LayoutError, match="the 12 KV heads do not divide by it"):
        check_layout(odd_kv, Layout(tensor=8))
    # MLA's latent is replicated: only the attention heads count.
    assert valid_tensor_sizes(_arch("deepseek-ai/DeepSeek-V3")) == (1, 2, 4, 8)


def test_a_replica_spans_nodes_only_through_pipeline_stages_that_fill_them() -> None:
    assert nodes_per_replica(Layout(tensor=8, pipeline=2), gpus_per_node=8) == 2
    assert nodes_per_replica(Layout(tensor=4, pipeline=2), gpus_per_node=8) == 1
    with pytest.raises(LayoutError, match="exceeds the 8 GPUs of one node"):
        nodes_per_replica(Layout(tensor=16), gpus_per_node=8)
    with pytest.raises(LayoutError, match="must be a multiple of 8"):
        nodes_per_replica(Layout(tensor=4, pipeline=3), gpus_per_node=8)


def test_pipeline_stages_divide_the_kv_a_gpu_holds_per_token() -> None:
    llama_8b = _arch("meta-llama/Llama-3.1-8B")
    plan = plan_layout(llama_8b, Layout(tensor=2, pipeline=2), gpus_per_node=2)
    assert plan.nodes == 2
    assert plan.stage_attention_layers == (16, 16)
    assert plan.kv_bytes_per_token_per_gpu * 2 == kv_bytes_per_token_per_gpu(llama_8b, "auto", 2)

    deepseek = _arch("deepseek-ai/DeepSeek-V3")
    plan = plan_layout(deepseek, Layout(tensor=8, pipeline=2), gpus_per_node=8)
    assert (plan.nodes, plan.stage_layers) == (2, (31, 30))
    # The larger stage bounds the cache: 31 layers of one 576-wide latent in bf16.
    assert plan.kv_bytes_per_token_per_gpu == 31 * (512 + 64) * 2
