"""The planner's model of vLLM 0.26's KV-cache manager by layer type, against the figures real
vLLM printed on an H200 and against the arithmetic of vllm/v1/core/kv_cache_utils.py and
vllm/v1/kv_cache_interface.py worked by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvq.catalog.gpus import GpuModel, load_gpu_catalog
from kvq.catalog.models import (
    ModelArchitecture,
    UnknownLayerTypeError,
    architecture_from_hf_config,
    load_model_catalog,
)
from kvq.planner import plan_capacity
from kvq.planner.kv_layout import KvLayoutError, kv_layout, kv_manager_flags, state_bytes
from kvq.planner.overhead import GIB

# serve's defaults on a >= 70 GiB GPU: 8,192 batched tokens, two batches in flight
# (async scheduling), so a sliding window holds window - 1 + 16,384 tokens per request.
IN_FLIGHT = 2 * 8192


def _arch(name: str) -> ModelArchitecture:
    found = load_model_catalog().lookup(name)
    assert found is not None, name
    return found.architecture


def _h200() -> GpuModel:
    gpu = load_gpu_catalog().lookup("NVIDIA H200", 143771)
    assert gpu is not None
    return gpu


# Real vLLM 0.26.0 on one H200, util 0.90, dummy weights, serve defaults (issue 21).
@pytest.mark.parametrize(
    ("model", "max_model_len", "tokens", "concurrency", "logged"),
    [
        (
            "gemma-3-1b",
            32768,
            7_873_400,
            240.28,
            ("Add 2 padding layers, may waste at most 9.09% KV cache memory",),
        ),
        ("qwen3-30b-a3b", 4096, 714_128, 174.35, ()),
    ],
)
def test_the_plan_is_within_one_percent_of_real_vllm(
    model: str, max_model_len: int, tokens: int, concurrency: float, logged: tuple[str, ...]
) -> None:
    plan = plan_capacity(_arch(model), _h200(), "auto", max_model_len=max_model_len)
    assert plan.fits, plan.reason
    assert plan.kv_tokens == pytest.approx(tokens, rel=0.01)
    assert plan.max_concurrency == pytest.approx(concurrency, rel=0.01)
    # vLLM's own warning, word for word
    assert plan.warnings[: len(logged)] == logged


def test_gemma3_1b_was_a_third_short_when_every_layer_counted_as_full() -> None:
    """With --disable-hybrid-kv-cache-manager vLLM keeps every token in every layer: the
    old plan's 150x, not the 240x vLLM reaches with the hybrid manager."""
    arch = _arch("gemma-3-1b")
    hybrid = plan_capacity(arch, _h200(), "auto", max_model_len=32768)
    full = plan_capacity(arch, _h200(), "auto", max_model_len=32768, hybrid_kv_cache_manager=False)
    assert full.kv_layout.startswith("1 x 26 full")
    assert full.kv_tokens == full.num_blocks * 16
    assert full.max_concurrency == pytest.approx(full.kv_tokens / 32768)
    assert full.max_concurrency == pytest.approx(150.4, rel=0.01)
    assert hybrid.max_concurrency / full.max_concurrency == pytest.approx(1.6, rel=0.01)


def test_the_activation_peak_of_an_moe_model_matches_vllms_profile() -> None:
    """Qwen3-30B-A3B: vLLM profiled 2.68 GiB (the V1 sampler at 1,024 rows of a 152k
    vocabulary while the fused-MoE workspace is held); the plan was 0.90 GiB before."""
    plan = plan_capacity(_arch("qwen3-30b-a3b"), _h200(), "auto", max_model_len=4096)
    assert plan.model_runner == "v1"
    assert plan.activation_bytes / GIB == pytest.approx(2.68, abs=0.1)


@pytest.mark.parametrize(
    ("model", "max_model_len", "groups", "group_size", "pages_per_request", "padding"),
    [
        # 22 sliding + 4 full: groups of 4, the sliding layers in 6 groups (2 padding layers)
        ("gemma-3-1b", 32768, 7, 4, 2048 + 6 * (-(-(511 + IN_FLIGHT) // 16) + 1), 2),
        # 12 sliding + 12 full alternating: two groups of 12
        ("gpt-oss-20b", 32768, 2, 12, 2048 + (-(-(127 + IN_FLIGHT) // 16) + 1), 0),
        # 36 chunked (8,192) + 12 full: four groups of 12
        ("llama-4-scout-17b-16e", 65536, 4, 12, 4096 + 3 * ((8192 + IN_FLIGHT) // 16), 0),
        # a window longer than the request: cdiv(L, 16) + 1 pages
        ("gemma-2-9b", 4096, 2, 21, 256 + 257, 0),
        # Mistral v0.1: one window on every layer, one group
        ("mistral-7b-v0.1", 32768, 1, 32, -(-(4095 + IN_FLIGHT) // 16) + 1, 0),
        ("llama-3-8b", 4096, 1, 32, 256, 0),
    ],
)
def test_layers_are_grouped_as_vllm_groups_them(
    model: str,
    max_model_len: int,
    groups: int,
    group_size: int,
    pages_per_request: int,
    padding: int,
) -> None:
    layout = kv_layout(_arch(model), "auto")
    assert (len(layout.groups), layout.group_size) == (groups, group_size)
    assert layout.pages_per_request(max_model_len, IN_FLIGHT) == pages_per_request
    assert layout.padding_layers == padding


def test_the_gated_delta_net_state_sets_the_attention_block_size() -> None:
    """Qwen3-Next: one state = conv (2 x 16 x 128 + 32 x 128) x 3 + 32 x 128 x 128, in bf16;
    the attention block grows until a page (2 KV heads x 256 x 2 x 2 bytes per token) holds
    it, and the state is padded to that page."""
    arch = _arch("qwen3-next-80b-a3b")
    assert arch.state is not None
    state = (2 * 16 * 128 + 32 * 128) * 3 * 2 + 32 * 128 * 128 * 2
    assert state_bytes(arch.state, 1) == state == 1_097_728
    auto = kv_layout(arch, "auto")
    assert auto.attention_block_size == 16 * -(-state // (16 * 2048)) == 544
    assert auto.page_bytes == 544 * 2048
    # 36 state layers in 3 groups + 12 full: one state per sequence in each state group
    assert auto.pages_per_request(4096, IN_FLIGHT) == -(-4096 // 544) + 3
    fp8 = kv_layout(arch, "fp8")
    assert fp8.attention_block_size == 16 * -(-state // (16 * 1024)) == 1072
    # TP=2 halves the state and the KV heads per GPU
    assert state_bytes(arch.state, 2) == state // 2


def test_mamba_ssm_state_keeps_its_own_dtype() -> None:
    """Nemotron-H's ssm state is float32 by default (NemotronHForCausalLMConfig), the conv
    state the model dtype; --mamba-ssm-cache-dtype overrides the default."""
    config = {
        "architectures": ["NemotronHForCausalLM"],
        "model_type": "nemotron_h",
        "hidden_size": 4096,
        "intermediate_size": 21504,
        "num_hidden_layers": 4,
        "hybrid_override_pattern": "M-M*",
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 131072,
        "mamba_num_heads": 128,
        "mamba_head_dim": 64,
        "n_groups": 8,
        "ssm_state_size": 128,
        "conv_kernel": 4,
    }
    arch = architecture_from_hf_config(config)
    assert arch.layer_kinds == ("mamba", "mlp", "mamba", "full_attention")
    assert arch.mlp_kinds == ("none", "dense", "none", "none")
    assert arch.state is not None
    conv = (128 * 64 + 2 * 8 * 128) * 3 * 2
    assert state_bytes(arch.state, 1) == conv + 128 * 64 * 128 * 4
    assert state_bytes(arch.state, 1, mamba_ssm_cache_dtype="bfloat16") == conv + 128 * 64 * 128 * 2
    layout = kv_layout(arch, "auto")
    # the MLP layer keeps nothing: 2 state layers + 1 attention layer
    assert sum(g.layers for g in layout.groups) == 3


def test_jamba_attention_and_experts_follow_their_periods() -> None:
    config = {
        "model_type": "jamba",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 8,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 65536,
        "num_experts": 16,
        "num_experts_per_tok": 2,
        "attn_layer_period": 8,
        "attn_layer_offset": 4,
        "expert_layer_period": 2,
        "expert_layer_offset": 1,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
    }
    arch = architecture_from_hf_config(config)
    assert arch.layer_kinds.index("full_attention") == 4
    assert arch.layer_kinds.count("mamba") == 7
    assert arch.mlp_kinds == ("dense", "moe") * 4
    assert arch.state is not None and arch.state.kind == "mamba1"
    # mamba1: conv (8,192 x 3) + ssm (8,192 x 16), bf16
    assert state_bytes(arch.state, 1) == (8192 * 3 + 8192 * 16) * 2


def test_fp8_with_sliding_layers_skipped_aligns_pages_like_vllm() -> None:
    """--kv-cache-dtype-skip-layers sliding_window on gpt-oss: the bf16 sliding pages (16
    tokens x 2,048 bytes) set the fp8 full layers' block to 32 tokens, one shared page."""
    layout = kv_layout(_arch("gpt-oss-20b"), "fp8", skip_layers=frozenset({"sliding_window"}))
    specs = {(g.spec.kind, g.spec.dtype, g.spec.block_size) for g in layout.groups}
    assert specs == {("sliding", "auto", 16), ("full", "fp8", 32)}
    assert layout.page_bytes == 32 * 1024
    plain = plan_capacity(_arch("gpt-oss-20b"), _h200(), "fp8", max_model_len=32768)
    skipped = plan_capacity(
        _arch("gpt-oss-20b"),
        _h200(),
        "fp8",
        max_model_len=32768,
        kv_cache_dtype_skip_layers=("sliding_window",),
    )
    assert skipped.kv_tokens < plain.kv_tokens


def test_state_layers_without_the_hybrid_manager_are_refused() -> None:
    with pytest.raises(KvLayoutError, match="hybrid KV-cache manager"):
        kv_layout(_arch("qwen3-next-80b-a3b"), "auto", hybrid_manager=False)
    plan = plan_capacity(
        _arch("qwen3-next-80b-a3b"),
        _h200(),
        "auto",
        tensor_parallel=2,
        max_model_len=4096,
        hybrid_kv_cache_manager=False,
    )
    assert not plan.fits and plan.reason is not None and "hybrid" in plan.reason


@pytest.mark.parametrize(
    "config",
    [
        {"layer_types": ["full_attention", "cross_attention"]},
        {"hybrid_override_pattern": "M*X-", "num_hidden_layers": 4},
    ],
)
def test_an_unknown_layer_type_is_refused_not_planned_as_full_attention(
    config: dict[str, object],
) -> None:
    base: dict[str, object] = {
        "hidden_size": 1024,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "vocab_size": 1000,
    }
    with pytest.raises(UnknownLayerTypeError, match="kvq"):
        architecture_from_hf_config({**base, **config})


@pytest.mark.parametrize(
    ("extra_args", "hybrid", "skip"),
    [
        ([], True, ()),
        (["--disable-hybrid-kv-cache-manager"], False, ()),
        (["--disable-hybrid-kv-cache-manager=false"], True, ()),
        (["--kv-cache-dtype-skip-layers", "0", "23", "--enforce-eager"], True, ("0", "23")),
        (["--kv-cache-dtype-skip-layers=sliding_window"], True, ("sliding_window",)),
    ],
)
def test_the_layout_flags_are_read_from_extra_args(
    extra_args: list[str], hybrid: bool, skip: tuple[str, ...]
) -> None:
    flags = kv_manager_flags(extra_args)
    assert (flags.hybrid_manager, flags.skip_layers) == (hybrid, skip)


def test_spec_architecture_plans_like_the_catalog_row() -> None:
    """spec.model.architecture can say what Gemma-3-1B's config.json says, and plans the
    same layout and concurrency."""
    from kvq.api.architecture import ArchitectureSpec
    from kvq.planner.architecture import architecture_from_spec

    row = _arch("gemma-3-1b")
    spec = ArchitectureSpec.model_validate(
        {
            "numLayers": 26,
            "numAttentionHeads": 4,
            "numKvHeads": 1,
            "headDim": 256,
            "hiddenSize": 1152,
            "intermediateSize": 6912,
            "vocabSize": 262144,
            "slidingWindow": 512,
            "layerTypes": list(row.layer_kinds),
            "modelClass": "Gemma3ForCausalLM",
        }
    )
    arch = architecture_from_spec(spec).model_copy(update={"tie_word_embeddings": True})
    ours = plan_capacity(arch, _h200(), "auto", max_model_len=32768)
    theirs = plan_capacity(row, _h200(), "auto", max_model_len=32768)
    assert ours.kv_layout == theirs.kv_layout
    assert ours.max_concurrency == pytest.approx(theirs.max_concurrency, rel=1e-3)


def test_spec_state_reaches_the_plan() -> None:
    from kvq.api.architecture import ArchitectureSpec
    from kvq.planner.architecture import architecture_from_spec

    spec = ArchitectureSpec.model_validate(
        {
            "numLayers": 4,
            "numKvHeads": 2,
            "numAttentionHeads": 16,
            "headDim": 256,
            "numParams": 3_000_000_000,
            "layerTypes": ["linear_attention"] * 3 + ["full_attention"],
            "state": {
                "kind": "gated_delta_net",
                "numKHeads": 16,
                "numVHeads": 32,
                "headKDim": 128,
                "headVDim": 128,
            },
        }
    )
    layout = kv_layout(architecture_from_spec(spec), "auto")
    assert layout.attention_block_size == 544


def test_kvq_plan_reads_any_config_json_of_these_families(tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from kvq.cli import app

    row = load_model_catalog().lookup("qwen3-next-80b-a3b")
    assert row is not None
    config = tmp_path / "config.json"
    config.write_text(json.dumps(_catalog_config("qwen3-next-80b-a3b")))
    args = ["plan", "--model", str(config), "--gpu", "H200", "--gpus", "2"]
    result = CliRunner().invoke(app, [*args, "--max-model-len", "8192", "-o", "json"])
    assert result.exit_code == 0, result.output
    row_plan = json.loads(result.stdout)["dtypes"]["auto"]
    assert row_plan["modelRunner"] == "v1" and row_plan["kvCacheGroups"] == 4
    assert row_plan["kvLayout"].startswith("3 x 12 state + 1 x 12 full")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**_catalog_config("gemma-3-1b"), "layer_types": ["x"] * 26}))
    refused = CliRunner().invoke(app, ["plan", "--model", str(bad), "--gpu", "H200"])
    assert refused.exit_code != 0
    assert "layer 0 has type 'x'" in refused.output


def _catalog_config(name: str) -> dict[str, object]:
    from importlib import resources

    import yaml

    rows = yaml.safe_load(
        resources.files("kvq.catalog").joinpath("models.yaml").read_text(encoding="utf-8")
    )["models"]
    return next(dict(r["config"]) for r in rows if r["name"] == name)


@pytest.mark.parametrize(
    ("version", "runner", "graphs", "verified"),
    [
        ("0.20.0", "v2-dense", "v1-runner", False),
        ("0.26.0", "v2-dense", "v1-runner", True),
        ("0.32.0", "v2", "all", True),
    ],
)
def test_the_memory_profile_is_a_fact_of_the_engine_version(
    version: str, runner: str, graphs: str, verified: bool
) -> None:
    from kvq.catalog.engines import load_engine_catalog

    profile = load_engine_catalog().capability(version).memory_profile
    assert (profile.runner, profile.graphs_subtracted, profile.origin.verified) == (
        runner,
        graphs,
        verified,
    )
    plan = plan_capacity(
        _arch("qwen3-30b-a3b"), _h200(), "auto", max_model_len=4096, memory_profile=profile
    )
    # a version whose source kvq has not read says so in the plan
    assert any("memory profile" in w for w in plan.warnings) != verified


def test_vllm_0_32_runs_everything_on_v2_and_subtracts_its_graphs() -> None:
    from kvq.catalog.engines import load_engine_catalog

    v26 = load_engine_catalog().capability("0.26.0").memory_profile
    v32 = load_engine_catalog().capability("0.32.0").memory_profile
    llama = _arch("llama-3-8b")
    old = plan_capacity(llama, _h200(), "auto", max_model_len=4096, memory_profile=v26)
    new = plan_capacity(llama, _h200(), "auto", max_model_len=4096, memory_profile=v32)
    assert (old.cudagraph_estimate_bytes, new.model_runner) == (0, "v2")
    assert new.cudagraph_estimate_bytes > 0
    assert new.kv_tokens < old.kv_tokens
    qwen = plan_capacity(
        _arch("qwen3-30b-a3b"), _h200(), "auto", max_model_len=4096, memory_profile=v32
    )
    assert qwen.model_runner == "v2"


def test_a_published_multimodal_gemma3_config_plans_like_its_catalog_row() -> None:
    """google/gemma-3-4b-it's config.json: the language model is text_config, which leaves
    heads, head size and vocabulary to Gemma3TextConfig's defaults."""
    published = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "text_config": {
            "hidden_size": 2560,
            "intermediate_size": 10240,
            "model_type": "gemma3_text",
            "num_hidden_layers": 34,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
            "sliding_window": 1024,
        },
    }
    arch = architecture_from_hf_config(published)
    row = _arch("gemma-3-4b")
    assert (arch.num_attention_heads, arch.num_kv_heads, arch.head_dim, arch.vocab_size) == (
        8,
        4,
        256,
        262208,
    )
    assert arch.layer_kinds == row.layer_kinds
    assert kv_layout(arch, "auto") == kv_layout(row, "auto")


@pytest.mark.parametrize(
    ("dtype", "kv_per_token_layer"), [("auto", 2 * 8 * 128 * 2), ("fp8", 2 * 8 * 128)]
)
def test_nemotron_h_8b_catalog_row_worked_by_hand(dtype: str, kv_per_token_layer: int) -> None:
    """The catalog's Nemotron-H-8B: 24 Mamba2 layers keep a fixed state per sequence, 4
    attention layers the only KV, 24 MLPs nothing (vLLM 0.26 nemotron_h.py
    get_mamba_state_shape_from_config, kv_cache_utils.py)."""
    arch = _arch("nemotron-h-8b")
    assert arch.layer_kinds.count("mamba") == 24
    assert arch.layer_kinds.count("full_attention") == 4
    assert arch.state is not None
    # conv (d_inner + 2 n_groups d_state, kernel - 1) in bf16 + ssm (heads, head_dim,
    # d_state) in float32: 61,440 + 4,194,304 bytes per layer and sequence
    conv = (128 * 64 + 2 * 8 * 128) * (4 - 1) * 2
    ssm = 128 * 64 * 128 * 4
    assert state_bytes(arch.state, 1) == conv + ssm == 4_255_744
    layout = kv_layout(arch, dtype)
    # attention pages grow in 16-token steps until one holds a state: 1,040 tokens (auto),
    # 2,080 (fp8), both 4,259,840 bytes; 7 groups of 4 layers (6 state, 1 full)
    block = 16 * -(-(conv + ssm) // (16 * kv_per_token_layer))
    assert layout.attention_block_size == block
    assert layout.page_bytes == block * kv_per_token_layer == 4_259_840
    assert layout.group_size == 4 and len(layout.groups) == 7
    # a 32k request: its attention pages plus one state page in each of 6 state groups
    assert layout.pages_per_request(32768, IN_FLIGHT) == -(-32768 // block) + 6
    plan = plan_capacity(arch, _h200(), dtype, max_model_len=32768)
    blocks = plan.available_kv_bytes // (4 * 4_259_840)
    per_request = -(-32768 // block) + 6
    assert plan.max_concurrency == pytest.approx(blocks / per_request)
    assert plan.kv_tokens == int(blocks / per_request * 32768)


@pytest.mark.parametrize(
    ("dtype", "kv_per_token_layer"), [("auto", 2 * 8 * 128 * 2), ("fp8", 2 * 8 * 128)]
)
def test_jamba_1_5_mini_catalog_row_worked_by_hand(dtype: str, kv_per_token_layer: int) -> None:
    """The catalog's Jamba-1.5-Mini: 28 Mamba1 layers keep a fixed state per sequence, the 4
    attention layers (every 8th from layer 4) the only KV (vLLM 0.26 jamba.py
    get_mamba_state_shape_from_config, mamba_utils.py mamba1_state_shape)."""
    arch = _arch("jamba-1.5-mini")
    assert [i for i, k in enumerate(arch.layer_kinds) if k == "full_attention"] == [4, 12, 20, 28]
    assert arch.mlp_kinds == ("dense", "moe") * 16
    assert arch.state is not None and arch.rope_tables == ()
    # conv (d_inner = 2 x 4,096, kernel - 1) + ssm (d_inner, d_state 16), both in the model's
    # bf16 (mamba_ssm_cache_dtype auto follows the conv dtype for Jamba)
    conv = 8192 * (4 - 1) * 2
    ssm = 8192 * 16 * 2
    assert state_bytes(arch.state, 1) == conv + ssm == 311_296
    assert state_bytes(arch.state, 2) == 311_296 // 2  # d_inner splits across TP ranks
    layout = kv_layout(arch, dtype)
    # the attention block grows to 80 tokens (auto) or 160 (fp8): 327,680-byte pages, the
    # state padded by 5.3 % to one page; 7 state groups + 1 full group of 4 layers
    block = 16 * -(-(conv + ssm) // (16 * kv_per_token_layer))
    assert block == {"auto": 80, "fp8": 160}[dtype]
    assert layout.attention_block_size == block
    assert layout.page_bytes == block * kv_per_token_layer == 327_680
    assert layout.group_size == 4 and len(layout.groups) == 8 and layout.padding_layers == 0
    plan = plan_capacity(arch, _h200(), dtype, max_model_len=32768)
    blocks = plan.available_kv_bytes // (4 * 327_680)
    per_request = -(-32768 // block) + 7  # its attention pages + one state page per group
    assert plan.max_concurrency == pytest.approx(blocks / per_request)
    assert plan.kv_tokens == int(blocks / per_request * 32768)


@pytest.mark.parametrize(
    ("dtype", "kv_per_token_layer"), [("auto", 2 * 4 * 128 * 2), ("fp8", 2 * 4 * 128)]
)
def test_granite_4_0_h_tiny_catalog_row_worked_by_hand(dtype: str, kv_per_token_layer: int) -> None:
    """The catalog's Granite-4.0-H-Tiny: 36 Mamba2 layers keep a fixed state per sequence, 4
    NoPE attention layers the only KV; every layer has experts and a shared MLP (vLLM 0.26
    granitemoehybrid.py get_mamba_state_shape_from_config, mamba_utils.py)."""
    arch = _arch("granite-4.0-h-tiny")
    assert [i for i, k in enumerate(arch.layer_kinds) if k == "full_attention"] == [5, 15, 25, 35]
    assert arch.mlp_kinds == ("moe",) * 40
    assert (arch.num_experts, arch.num_experts_per_tok, arch.moe_intermediate_size) == (64, 6, 512)
    assert (arch.num_shared_experts, arch.shared_expert_intermediate_size) == (1, 1024)
    assert arch.state is not None and arch.rope_tables == ()
    # conv (d_inner 3,072 + 2 x 1 group x 128, kernel - 1) + ssm (48 heads, 64, 128), both
    # bf16: the ssm state follows the conv dtype (no float32 default, unlike Nemotron-H)
    conv = (3072 + 2 * 1 * 128) * (4 - 1) * 2
    ssm = 48 * 64 * 128 * 2
    assert state_bytes(arch.state, 1) == conv + ssm == 806_400
    layout = kv_layout(arch, dtype)
    # 400-token attention blocks (auto), 800 (fp8): 819,200-byte pages, the state padded by
    # 1.59 %; 9 state groups + 1 full group of 4 layers, no padding layer
    block = 16 * -(-(conv + ssm) // (16 * kv_per_token_layer))
    assert block == {"auto": 400, "fp8": 800}[dtype]
    assert layout.page_bytes == block * kv_per_token_layer == 819_200
    assert layout.group_size == 4 and len(layout.groups) == 10 and layout.padding_layers == 0
    plan = plan_capacity(arch, _h200(), dtype, max_model_len=32768)
    blocks = plan.available_kv_bytes // (4 * 819_200)
    per_request = -(-32768 // block) + 9
    assert plan.max_concurrency == pytest.approx(blocks / per_request)
    assert plan.kv_tokens == int(blocks / per_request * 32768)


def test_a_dense_granite_4_0_h_has_only_its_shared_mlp() -> None:
    """num_local_experts 0 (Granite-4.0-H-Micro, -1B): vLLM builds no experts, and the
    layer's MLP is the shared_mlp, shared_intermediate_size wide, not intermediate_size."""
    config = {
        "model_type": "granitemoehybrid",
        "hidden_size": 1536,
        "intermediate_size": 512,
        "shared_intermediate_size": 4096,
        "num_local_experts": 0,
        "num_experts_per_tok": 0,
        "num_hidden_layers": 10,
        "layer_types": ["mamba"] * 5 + ["attention"] + ["mamba"] * 4,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
        "mamba_n_heads": 48,
        "mamba_d_head": 64,
        "mamba_d_state": 128,
        "vocab_size": 100352,
    }
    arch = architecture_from_hf_config(config)
    assert not arch.is_moe and arch.num_shared_experts == 0
    assert arch.mlp_kinds == ("dense",) * 10 and arch.intermediate_size == 4096
