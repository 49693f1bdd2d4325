"""Pipeline stages planned on their own GPUs (kvq.planner.stages, plan_capacity with
pipeline_parallel): each stage's weights and KV, the replica bounded by the fewest blocks."""

from __future__ import annotations

import pytest

from kvq.catalog.gpus import GpuModel, load_gpu_catalog
from kvq.catalog.models import ModelArchitecture, load_model_catalog
from kvq.planner import plan_capacity
from kvq.planner.stages import stage_skip_layers, stage_spans
from kvq.planner.weights import StageSpan, parameter_count, weight_bytes_per_gpu

GIB = 2**30


def _arch(name: str) -> ModelArchitecture:
    model = load_model_catalog().lookup(name)
    assert model is not None
    return model.architecture


def _gpu(product: str) -> GpuModel:
    gpu = load_gpu_catalog().lookup(product)
    assert gpu is not None
    return gpu


def test_llama_405b_is_the_public_config() -> None:
    arch = _arch("meta-llama/Llama-3.1-405B-Instruct")
    assert (arch.num_layers, arch.hidden_size, arch.num_attention_heads) == (126, 16384, 128)
    assert round(parameter_count(arch) / 1e9, 1) == 405.9
    # llama3 rope scaling keeps one table of max_position_embeddings positions.
    assert arch.rope_tables == ((131072, 128),)


def test_the_stages_split_the_weights_with_the_embedding_first_and_the_head_last() -> None:
    arch = _arch("meta-llama/Llama-3.1-405B-Instruct")
    first, last = stage_spans(arch, 2)
    assert (first, last) == (StageSpan(0, 63, True, False), StageSpan(63, 63, False, True))
    whole = weight_bytes_per_gpu(arch, "bf16", 8)
    halves = weight_bytes_per_gpu(arch, "bf16", 8, first) + weight_bytes_per_gpu(
        arch, "bf16", 8, last
    )
    # Every parameter is on exactly one stage; the final norm is the last stage's.
    assert halves == whole
    final_norm = arch.hidden_size * 2
    assert weight_bytes_per_gpu(arch, "bf16", 8, last) - weight_bytes_per_gpu(
        arch, "bf16", 8, first
    ) == pytest.approx(final_norm)


def test_llama_405b_on_two_h100_nodes_holds_twice_the_tokens_in_fp8() -> None:
    arch = _arch("meta-llama/Llama-3.1-405B-Instruct")
    h100 = _gpu("H100")
    auto = plan_capacity(arch, h100, "auto", tensor_parallel=8, pipeline_parallel=2)
    fp8 = plan_capacity(arch, h100, "fp8", tensor_parallel=8, pipeline_parallel=2)
    assert auto.fits and fp8.fits
    assert [s.layers for s in auto.stages] == [63, 63]
    assert round(auto.weight_bytes_per_gpu / GIB, 2) == 47.28
    # 63 layers x 1 KV head per GPU x 2 x 128 x 2 bytes.
    assert auto.kv_bytes_per_token_per_gpu == 63 * 2 * 128 * 2
    assert (auto.kv_tokens, fp8.kv_tokens) == (773_632, 1_547_280)
    assert fp8.ratio_vs_auto == pytest.approx(2.0, abs=0.001)


def test_a_stage_too_big_for_its_gpus_says_which_and_what_to_do() -> None:
    arch = _arch("meta-llama/Llama-3.1-405B-Instruct")
    plan = plan_capacity(arch, _gpu("H100"), "fp8", tensor_parallel=4, pipeline_parallel=2)
    assert not plan.fits
    assert plan.reason == (
        "bf16 weights need 94.53 GiB per GPU but only 71.30 GiB is available for vLLM on "
        "H100-SXM-80GB (TP=4, the stage of layers 0-62); try more pipeline stages or AWQ weights"
    )


def test_the_stage_with_the_least_room_bounds_the_replica_not_the_most_attention() -> None:
    # DeepSeek-V3 on TP 8 x PP 2: the first stage has 31 attention layers (3 dense), the
    # second 30 expert layers and the LM head: less room, fewer blocks, and vLLM gives
    # every stage that count.
    deepseek = _arch("deepseek-ai/DeepSeek-V3")
    plan = plan_capacity(deepseek, _gpu("H200"), "auto", tensor_parallel=8, pipeline_parallel=2)
    first, second = plan.stages
    assert (first.attention_layers, second.attention_layers) == (31, 30)
    assert second.weight_bytes_per_gpu > first.weight_bytes_per_gpu
    assert second.num_blocks < first.num_blocks
    assert plan.bounding_stage == 1
    assert plan.num_blocks == second.num_blocks
    assert plan.kv_bytes_per_token_per_gpu == 30 * (512 + 64) * 2


def test_one_stage_is_the_plan_it_always_was() -> None:
    arch = _arch("meta-llama/Llama-3.1-70B-Instruct")
    h100 = _gpu("H100")
    assert plan_capacity(arch, h100, "fp8", tensor_parallel=8, pipeline_parallel=1) == (
        plan_capacity(arch, h100, "fp8", tensor_parallel=8)
    )
    assert plan_capacity(arch, h100, "fp8", tensor_parallel=8).stages == ()


def test_skip_layers_are_renumbered_within_their_stage() -> None:
    span = StageSpan(40, 40, first=False, last=True)
    assert stage_skip_layers(("0", "41", "79", "sliding_window"), span) == (
        "1",
        "39",
        "sliding_window",
    )
