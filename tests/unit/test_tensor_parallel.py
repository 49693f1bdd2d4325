"""Tensor-parallel sizes as vLLM accepts them: heads divide evenly, KV heads divide or are
replicated in whole copies; placement refuses the rest with the valid sizes named."""

from __future__ import annotations

from typing import Any

import pytest

from kvq.catalog.models import ModelArchitecture, load_model_catalog
from kvq.placement.choice import choose_pool
from kvq.placement.tensor_parallel import (
    layout_problem,
    tensor_parallel_problem,
    valid_tensor_parallel_sizes,
)
from tests.unit.test_choice import ENGINE, inventory, reasons, request

MODELS = load_model_catalog()


def model(name: str) -> ModelArchitecture:
    found = MODELS.lookup(name)
    assert found is not None, name
    return found.architecture


def shape(heads: int, kv_heads: int, attention: Any = "gqa") -> ModelArchitecture:
    extra = {"kv_lora_rank": 512, "rope_head_dim": 64} if attention == "mla" else {}
    return ModelArchitecture(
        num_layers=2,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=64,
        hidden_size=heads * 64,
        intermediate_size=4 * heads * 64,
        vocab_size=32000,
        attention=attention,
        **extra,
    )


@pytest.mark.parametrize(
    ("arch", "valid"),
    [
        (model("llama-3-8b"), [1, 2, 4, 8]),  # 32 heads, 8 KV heads
        (model("llama-3-70b"), [1, 2, 4, 8]),  # 64 heads, 8 KV heads
        (shape(28, 4), [1, 2, 4]),  # Qwen2.5-7B: 28 heads do not split over 8
        (shape(32, 2), [1, 2, 4, 8]),  # 2 KV heads: replicated 2x on 4 GPUs, 4x on 8
        (shape(12, 3), [1, 3, 6]),  # 3 KV heads: not over 2 or 4 GPUs; replicated 2x on 6
        (shape(40, 40), [1, 2, 4, 5, 8]),  # multi-head attention: KV heads = heads
        (shape(16, 1, "mla"), [1, 2, 4, 8]),  # MLA: only the query heads count
    ],
)
def test_valid_sizes(arch: ModelArchitecture, valid: list[int]) -> None:
    assert valid_tensor_parallel_sizes(arch) == valid
    for tp in range(1, 9):
        assert (tensor_parallel_problem(arch, tp) is None) == (tp in valid)


def test_reasons_name_the_heads_and_the_valid_sizes() -> None:
    assert tensor_parallel_problem(shape(28, 4), 8) == (
        "gpusPerReplica 8 does not divide the model's 28 attention heads, which vLLM refuses "
        "at start-up; valid sizes: 1, 2, 4"
    )
    assert tensor_parallel_problem(shape(12, 3), 2) == (
        "gpusPerReplica 2 does not divide the model's 3 KV heads, which vLLM refuses at "
        "start-up; valid sizes: 1, 3, 6"
    )


def test_kv_heads_fewer_than_gpus_but_not_a_divisor() -> None:
    # 24 heads, 3 KV heads over 6 GPUs: heads split (4 each), KV heads replicated 2x: fine.
    assert tensor_parallel_problem(shape(24, 3), 6) is None
    # Over 4 GPUs: 24 heads split, but 3 KV heads cannot be copied in whole onto 4.
    problem = tensor_parallel_problem(shape(24, 3), 4)
    assert problem is not None
    assert "is not a multiple of the model's 3 KV heads" in problem


def test_placement_refuses_a_split_vllm_would_refuse_on_every_pool() -> None:
    choice = choose_pool(request(gpus_per_replica=8), inventory(), ENGINE, shape(28, 4))
    assert choice.chosen is None
    assert "valid sizes: 1, 2, 4" in reasons(choice, "gpu-h100")
    # The pool's own limit is reported beside it: one GPU per T4 node.
    assert "nodes have 1 GPUs, a replica needs 8" in reasons(choice, "t4-pool")


def test_a_declared_layout_names_its_own_fields_and_the_valid_sizes() -> None:
    assert layout_problem(shape(28, 4), 8, 2, declared=True) == (
        "parallelism.tensor 8 does not divide the model's 28 attention heads, which vLLM "
        "refuses at start-up; valid sizes: 1, 2, 4"
    )
    # Two layers: a third stage would hold none.
    assert layout_problem(shape(28, 4), 4, 3, declared=True) == (
        "parallelism.pipeline 3 is more stages than the model's 2 layers (a stage would hold "
        "none); valid sizes: 1, 2"
    )
    assert layout_problem(model("llama-3-70b"), 8, 16, declared=True) is None


def test_placement_takes_a_replica_over_several_nodes_and_waits_for_whole_nodes() -> None:
    llama_405b = model("meta-llama/Llama-3.1-405B-Instruct")
    two_nodes = request(gpus_per_replica=16, pipeline_parallel=2, parallelism_declared=True)
    choice = choose_pool(two_nodes, inventory(), ENGINE, llama_405b)
    # hetero has one 8-GPU node per H100/H200/B200 pool: compatible, not runnable now.
    assert choice.chosen is not None and choice.chosen.fits
    assert reasons(choice, "gpu-h100") == ""
    assert choice.chosen.not_now == (
        "room for 0 of 1 replicas now (8 free GPUs on 1 usable nodes, 2 nodes of 8 per replica)"
    )
    # Tensor parallel across nodes is not how kvq splits a replica.
    across = request(gpus_per_replica=16, parallelism_declared=True)
    assert "nodes have 8 GPUs, a replica needs 16" in reasons(
        choose_pool(across, inventory(), ENGINE, llama_405b), "gpu-h100"
    )
    # Stages within one node are placed like any replica: 4 x 2 on an 8-GPU node.
    one_node = request(gpus_per_replica=8, pipeline_parallel=2, parallelism_declared=True)
    llama_70b = model("meta-llama/Llama-3.1-70B-Instruct")
    chosen = choose_pool(one_node, inventory(), ENGINE, llama_70b).chosen
    assert chosen is not None and chosen.plan is not None
    assert (chosen.plan.tensor_parallel, chosen.plan.pipeline_parallel) == (4, 2)
