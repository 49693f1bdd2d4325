"""The GPU tier for this year's model families (issue 21): any catalog shape at its own
max model length, fewer layers of a model too big for one H200, the hybrid KV-cache
manager's log lines, and plans recomputed offline from a saved run."""

from __future__ import annotations

import copy
import json

import pytest

from tests.unit.gpu_tier_support import FIXTURES, REPO

from gputier import report  # isort: skip
from gputier.gpu import GpuInfo, pool_for  # isort: skip
from gputier.points import Point, ShapeSpec, parse_shape, plan_point, render_point  # isort: skip
from gputier.replan import replan  # isort: skip
from gputier.shapes import config_json, tier_config  # isort: skip
from gputier.tier import TierConfig, dry_run  # isort: skip
from gputier.vllm_output import parse_startup  # isort: skip

H200 = GpuInfo("NVIDIA H200", 143771, "580.159.04", 1)
RESULTS = REPO / "e2e" / "gpu" / "results"


def test_a_shape_spec_sets_its_own_max_model_len_and_layers() -> None:
    assert parse_shape("gemma-3-1b:len=32768", 4096, None) == ShapeSpec("gemma-3-1b", 32768)
    assert parse_shape("qwen3-next-80b-a3b:len=16384:layers=24", 4096, None) == ShapeSpec(
        "qwen3-next-80b-a3b", 16384, 24
    )
    assert parse_shape("qwen3-30b-a3b", 8192, 12) == ShapeSpec("qwen3-30b-a3b", 8192, 12)
    with pytest.raises(ValueError, match="SHAPE"):
        parse_shape("gemma-3-1b:length=32768", 4096, None)


def test_fewer_layers_keep_the_hybrid_pattern_and_every_expert() -> None:
    config, changes = tier_config("qwen3-next-80b-a3b", 24)
    assert (config["num_hidden_layers"], config["full_attention_interval"]) == (24, 4)
    assert (config["num_experts"], config["num_experts_per_tok"]) == (512, 10)
    assert changes == ["24 of 48 layers (the same layer pattern, every 4)"]

    scout = config_json("llama-4-scout-17b-16e", 16)
    assert scout["no_rope_layers"] == [1, 1, 1, 0] * 4  # 12 chunked, 4 global layers
    assert scout["moe_layers"] == list(range(16))
    assert scout["num_local_experts"] == 16

    jamba = config_json("jamba-1.5-mini", 16)  # attention at 4 and 12, experts every 2nd
    assert (jamba["num_hidden_layers"], jamba["attn_layer_period"], jamba["num_experts"]) == (
        16,
        8,
        16,
    )

    gpt_oss = config_json("gpt-oss-20b", 12)
    assert gpt_oss["layer_types"] == ["sliding_attention", "full_attention"] * 6


@pytest.mark.parametrize(
    ("shape", "layers", "message"),
    [
        ("gemma-3-1b", 8, "repeats every 6 layers"),
        ("qwen3-next-80b-a3b", 10, "multiple of 4"),
        ("deepseek-v3", 3, "first 3 layers are dense"),
        ("qwen3-30b-a3b", 48, "give 1..47"),
        ("jamba-1.5-mini", 12, "repeats every 8 layers"),
    ],
)
def test_a_cut_that_would_change_the_layer_pattern_is_refused(
    shape: str, layers: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        config_json(shape, layers)


def test_published_quantization_is_dropped_for_dummy_bf16_weights() -> None:
    config, changes = tier_config("gpt-oss-20b")
    assert "quantization_config" not in config
    assert changes == ["quantization_config dropped: dummy bf16 weights"]
    assert tier_config("gemma-3-1b")[1] == []


def test_a_point_serves_and_plans_its_own_length_and_layers() -> None:
    pool = pool_for(H200)
    point = Point("qwen3-next-80b-a3b", "fp8", max_model_len=32768, layers=24)
    rendered = render_point(point, pool)
    command = list(rendered.command)
    assert command[command.index("--max-model-len") + 1] == "32768"
    assert command[command.index("--model") + 1] == "/models/gpu-tier/qwen3-next-80b-a3b-l24"
    assert point.name == "qwen3-next-80b-a3b-l24-32768-fp8"
    half = plan_point(point, pool)
    full = plan_point(Point("qwen3-next-80b-a3b", "fp8", max_model_len=32768), pool)
    assert half.weight_bytes_per_gpu < full.weight_bytes_per_gpu * 0.55


def test_dry_run_names_the_cut_and_the_dropped_quantization() -> None:
    config = TierConfig(shapes=("deepseek-v3:layers=4:len=32768",), dtypes=("auto",))
    lines = dry_run(H200, config)
    assert lines[1].startswith("# deepseek-v3-l4-32768-auto (deepseek-v3, 4 of 61 layers")
    assert "#   config.json: quantization_config dropped: dummy bf16 weights" in lines
    assert "#   config.json: 4 of 61 layers (the same layer pattern, every 1)" in lines


def test_the_hybrid_managers_padding_line_is_read() -> None:
    # vLLM 0.26 on Gemma-3-1B (issue 21): kv_cache_utils.py's warning, with its log prefix.
    log = (FIXTURES / "h200-v0.26.0-serve-llama3-8b-auto-ok.log").read_text() + (
        "(EngineCore pid=9) WARNING 12-01 10:00:00 [kv_cache_utils.py:1237] Add 2 padding "
        "layers, may waste at most 9.09% KV cache memory\n"
    )
    figures = parse_startup(log)
    assert (figures.padding_layers, figures.padding_waste_pct) == (2, 9.09)
    assert "Add 2 padding layers, may waste at most 9.09% KV cache memory" in (
        figures.kv_cache_lines
    )
    assert "GPU KV cache size: 897,280 tokens" in figures.kv_cache_lines
    plain = parse_startup((FIXTURES / "h200-v0.26.0-serve-llama3-8b-auto-ok.log").read_text())
    assert plain.padding_layers is None and not plain.hybrid_manager_disabled


def test_report_plans_a_saved_run_again_with_todays_planner() -> None:
    saved = json.loads((RESULTS / "2026-12-01-h200.json").read_text())
    document = replan(report.merge([copy.deepcopy(saved)]))
    pool = pool_for(H200)
    for before, after in zip(saved["points"], document["points"], strict=True):
        assert after["plan_at_run"] == before["plan"]
        today = plan_point(Point(after["shape"], after["dtype"]), pool)
        assert after["plan"]["kv_tokens"] == today.kv_tokens
        if after.get("capacity"):
            measured = after["capacity"]["measured_kv_tokens"]
            assert after["capacity"]["error"] == round((today.kv_tokens - measured) / measured, 5)
    assert "plans recomputed" in report.render_markdown(document)


def test_report_plans_from_the_saved_config_not_the_catalog() -> None:
    saved = json.loads((RESULTS / "2026-12-01-h200.json").read_text())
    point = saved["points"][0]
    point["config"] = config_json(point["shape"])
    point["config"]["num_hidden_layers"] = 16  # the engine served half the model
    document = replan(report.merge([saved]))
    halved, full = document["points"][0]["plan"], document["points"][0]["plan_at_run"]
    assert halved["kv_bytes_per_token"] * 2 == full["kv_bytes_per_token"]


def test_report_keeps_the_runs_of_an_already_merged_result() -> None:
    # 2026-12-04-h200.json holds three runs (a, b, c); re-planning it keeps all three.
    saved = json.loads((RESULTS / "2026-12-04-h200.json").read_text())
    document = report.merge([copy.deepcopy(saved)])
    assert document["runs"] == saved["runs"]
    markdown = report.render_markdown(replan(document))
    assert "- run c: 2026-12-04T00:47:47Z to 2026-12-04T00:50:13Z (146 s)" in markdown
