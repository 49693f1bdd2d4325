"""Model catalog and config.json reading: the shapes the planner sizes memory from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvq.catalog.models import ModelCatalog, architecture_from_hf_config, load_model_catalog
from kvq.planner.weights import parameter_count

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"


@pytest.fixture(scope="module")
def catalog() -> ModelCatalog:
    return load_model_catalog()


@pytest.mark.parametrize(
    ("query", "name"),
    [
        ("llama-3-8b", "llama-3-8b"),
        ("LLAMA-3-8B", "llama-3-8b"),
        ("meta-llama/Meta-Llama-3-8B", "llama-3-8b"),
        ("hf://meta-llama/Meta-Llama-3-8B", "llama-3-8b"),
        ("hf://meta-llama/meta-llama-3-8b-instruct", "llama-3-8b"),
        ("hf://meta-llama/Meta-Llama-3-8B@main", "llama-3-8b"),
        ("Meta-Llama-3-8B", "llama-3-8b"),
        ("meta-llama/Llama-3.1-70B-Instruct", "llama-3.1-70b"),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b"),
        ("Qwen/Qwen2.5-72B-Instruct", "qwen2.5-72b"),
        ("google/gemma-2-9b-it", "gemma-2-9b"),
        ("microsoft/Phi-3-mini-4k-instruct", "phi-3-mini-4k"),
        ("hf://deepseek-ai/DeepSeek-V2-Lite", "deepseek-v2-lite"),
        ("deepseek-ai/DeepSeek-V3", "deepseek-v3"),
        ("Qwen/Qwen3-30B-A3B-Instruct-2507", "qwen3-30b-a3b"),
        ("Qwen/Qwen3-Next-80B-A3B-Instruct", "qwen3-next-80b-a3b"),
        ("google/gemma-3-1b-it", "gemma-3-1b"),
        ("google/gemma-3-27b-it", "gemma-3-27b"),
        ("openai/gpt-oss-20b", "gpt-oss-20b"),
        ("meta-llama/Llama-4-Scout-17B-16E-Instruct", "llama-4-scout-17b-16e"),
    ],
)
def test_lookup_by_name_or_hub_id(catalog: ModelCatalog, query: str, name: str) -> None:
    found = catalog.lookup(query)
    assert found is not None, query
    assert found.name == name


def test_unknown_model_is_none(catalog: ModelCatalog) -> None:
    assert catalog.lookup("hf://acme/never-heard-of-it") is None


@pytest.mark.parametrize(
    ("name", "published_billions"),
    [
        ("llama-3-8b", 8.03),
        ("llama-3-70b", 70.6),
        ("mistral-7b-v0.1", 7.24),
        ("mixtral-8x7b", 46.7),
        ("qwen2.5-7b", 7.62),
        ("qwen2.5-32b", 32.8),
        ("qwen2.5-72b", 72.7),
        ("gemma-2-9b", 9.24),
        ("phi-3-mini-4k", 3.82),
        ("deepseek-v2-lite", 15.7),
        # 8,100,852,736 counted off the checkpoint: 24 Mamba2 mixers, 24 ungated relu2 MLPs
        ("nemotron-h-8b", 8.10),
        # "52B total parameters" (the model card): 28 Mamba1 mixers, 16 MoE layers of 16
        ("jamba-1.5-mini", 52.0),
        # "7B" (the model card): 64 experts and a shared MLP in each of 40 layers
        ("granite-4.0-h-tiny", 7.0),
    ],
)
def test_parameter_count_matches_the_model_card(
    catalog: ModelCatalog, name: str, published_billions: float
) -> None:
    model = catalog.lookup(name)
    assert model is not None
    assert parameter_count(model.architecture) / 1e9 == pytest.approx(published_billions, rel=0.01)


def test_every_row_names_its_config_json(catalog: ModelCatalog) -> None:
    for model in catalog.all():
        assert model.source.endswith("/config.json"), model.name
        assert model.hf_id.split("/")[-1] in model.source


def test_deepseek_v2_lite_is_mla_moe(catalog: ModelCatalog) -> None:
    model = catalog.lookup("deepseek-v2-lite")
    assert model is not None
    arch = model.architecture
    assert (arch.attention, arch.kv_lora_rank, arch.rope_head_dim) == ("mla", 512, 64)
    assert (arch.num_experts, arch.num_shared_experts, arch.first_k_dense_replace) == (64, 2, 1)


def _llama(**overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
    }
    config.update(overrides)
    return {k: v for k, v in config.items() if v is not None}


@pytest.mark.parametrize(
    ("config", "field", "expected"),
    [
        (_llama(), "head_dim", 128),  # hidden / heads
        (_llama(head_dim=256), "head_dim", 256),  # explicit wins
        (_llama(head_dim=None), "head_dim", 128),  # null means derive
        (_llama(num_key_value_heads=None), "num_kv_heads", 32),  # default: MHA
        (_llama(), "tie_word_embeddings", False),
        (_llama(tie_word_embeddings=True), "tie_word_embeddings", True),
        ({**_llama(), "model_type": "gemma2"}, "tie_word_embeddings", True),
        ({**_llama(), "model_type": "qwen2"}, "qkv_bias", True),
        (_llama(num_local_experts=8, num_experts_per_tok=2), "num_experts", 8),
        (_llama(num_local_experts=8), "moe_intermediate_size", 14336),
        (_llama(n_routed_experts=64, moe_intermediate_size=1408), "num_experts", 64),
        (_llama(num_experts=60, shared_expert_intermediate_size=5632), "num_shared_experts", 1),
        (_llama(sliding_window=4096), "sliding_window", 4096),
        (_llama(sliding_window=131072, use_sliding_window=False), "sliding_window", None),
        (_llama(), "attention", "gqa"),
        (_llama(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128), "attention", "mla"),
        (_llama(kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128), "head_dim", 192),
    ],
)
def test_hf_config_fields(config: dict[str, Any], field: str, expected: object) -> None:
    assert getattr(architecture_from_hf_config(config), field) == expected


def test_multimodal_config_reads_the_text_model() -> None:
    config = {
        "model_type": "llava",
        "tie_word_embeddings": False,
        "text_config": _llama(num_hidden_layers=40),
        "vision_config": {"hidden_size": 1024, "num_hidden_layers": 24},
    }
    arch = architecture_from_hf_config(config)
    assert (arch.num_layers, arch.hidden_size) == (40, 4096)


def test_config_without_layers_is_refused() -> None:
    with pytest.raises(ValueError, match="num_hidden_layers"):
        architecture_from_hf_config({"hidden_size": 64, "num_attention_heads": 2, "vocab_size": 9})


def test_mla_without_latent_is_refused() -> None:
    arch = architecture_from_hf_config(_llama())
    with pytest.raises(ValueError, match="kv_lora_rank"):
        type(arch).model_validate({**arch.model_dump(), "attention": "mla"})


def test_the_cpu_fixture_config_reads_as_a_tiny_llama() -> None:
    config = json.loads((FIXTURES / "cpu-tiny-head80.config.json").read_text())
    arch = architecture_from_hf_config(config)
    assert (arch.num_layers, arch.num_kv_heads, arch.head_dim) == (2, 2, 80)
    assert arch.max_position_embeddings == 2048
