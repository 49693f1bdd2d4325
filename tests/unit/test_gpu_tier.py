"""The GPU tier's runner, here on the CPU: parsing of real H200 output, the verdicts, the
report, and one whole run against a stand-in engine through kvq's real wrapper."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.unit.gpu_tier_support import FIXTURES, REPO, write_fake_vllm

from gputier import report  # isort: skip
from gputier.compare import CapacityCheck, classify, judge  # isort: skip
from gputier.gpu import GpuInfo, parse_nvidia_smi, pool_for  # isort: skip
from gputier.load import LoadSpec, percentile, prompts  # isort: skip
from gputier.points import Point, plan_point, render_point, settings_for  # isort: skip
from gputier.shapes import config_json  # isort: skip
from gputier.tier import TierConfig, dry_run, run_tier, write_json  # isort: skip
from gputier.vllm_output import parse_startup  # isort: skip

from kvq.catalog.models import architecture_from_hf_config, load_model_catalog
from kvq.render import container_command

H200 = GpuInfo("NVIDIA H200", 143771, "580.159.04", 1)


def test_startup_figures_are_read_from_the_real_h200_logs() -> None:
    auto = parse_startup((FIXTURES / "h200-v0.26.0-llama3-8b-auto-ok.log").read_text())
    fp8 = parse_startup((FIXTURES / "h200-v0.26.0-llama3-8b-fp8-ok.log").read_text())
    assert (auto.kv_tokens, fp8.kv_tokens) == (891_712, 1_783_440)
    assert (auto.available_kv_gib, auto.max_model_len, auto.max_concurrency) == (
        108.85,
        3648,
        244.44,
    )
    assert (auto.weights_gib, auto.peak_activation_gib, auto.non_torch_gib) == (14.97, 1.78, 0.22)
    assert (auto.cuda_total_gib, auto.requested_gib, auto.max_num_batched_tokens) == (
        139.8,
        125.82,
        16384,
    )
    assert (auto.attention_backend, auto.flash_attention_version) == ("FLASH_ATTN", 3)


def test_a_crash_log_has_no_capacity_and_names_the_backend_it_fell_to() -> None:
    crash = parse_startup((FIXTURES / "h200-v0.26.0-llama3-8b-fp8_e5m2-crash.log").read_text())
    assert crash.kv_tokens is None
    assert crash.attention_backend == "TRITON_ATTN"
    assert not crash.serving


def test_nvidia_smi_maps_to_kvqs_h200_pool() -> None:
    info = parse_nvidia_smi("NVIDIA H200, 143771, 580.159.04\n")
    assert info == H200
    pool = pool_for(info)
    assert (pool.gpu.product, pool.gpu.compute_capability, pool.gpus_per_node) == (
        "H200",
        (9, 0),
        1,
    )


def test_mixed_gpus_are_refused() -> None:
    with pytest.raises(LookupError, match="mixed GPUs"):
        parse_nvidia_smi("NVIDIA H200, 143771, 580\nNVIDIA L4, 23034, 580\n")


def test_the_e5m2_termination_message_alone_is_a_dtype_refusal_that_falls_back() -> None:
    message = (FIXTURES / "h200-v0.26.0-serve-fp8_e5m2-termination-message.txt").read_text()
    verdict = classify(message, 1, "fp8_e5m2")
    assert verdict.fallback
    assert str(verdict.kind) in ("DtypeRejected", "DtypeSuspect")
    assert judge(False, False, verdict.fallback) == "as predicted (refused, kvq falls back)"


@pytest.mark.parametrize(
    ("predicted", "served", "fallback", "verdict"),
    [
        (True, True, None, "as predicted"),
        (True, False, True, "catalog bug: predicted to run, crashed"),
        (False, True, None, "catalog too strict: it serves"),
        (False, False, False, "refused as predicted, but the classifier would not fall back"),
    ],
)
def test_verdicts(predicted: bool, served: bool, fallback: bool | None, verdict: str) -> None:
    assert judge(predicted, served, fallback) == verdict


def test_capacity_error_is_positive_when_the_plan_promises_too_much() -> None:
    check = CapacityCheck(measured_tokens=891_712, planned_tokens=894_592)
    assert check.error == pytest.approx(0.00323, abs=1e-5)
    assert check.within_tolerance
    assert not CapacityCheck(100, 103).within_tolerance


def test_percentiles() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 95) == pytest.approx(3.85)


def test_every_dtype_gets_the_same_prompts() -> None:
    spec = LoadSpec(requests=3, prompt_tokens=5)
    assert prompts(spec) == prompts(spec)
    assert len({tuple(p) for p in prompts(spec)}) == 3


@pytest.mark.parametrize("shape", [model.name for model in load_model_catalog().all()])
def test_the_engine_builds_the_shape_the_planner_plans(shape: str) -> None:
    config = config_json(shape)
    assert config["architectures"]
    catalog = load_model_catalog().lookup(shape)
    assert catalog is not None
    # The tier serves dummy bf16 weights: a published weight quantization is dropped.
    bf16 = catalog.architecture.model_copy(update={"weight_quantization": None})
    assert architecture_from_hf_config(config) == bf16


def test_a_supported_dtype_runs_exactly_kvqs_container_command() -> None:
    pool = pool_for(H200)
    rendered = render_point(Point("llama-3-8b", "fp8"), pool)
    settings = settings_for(rendered.isvc, pool)
    assert list(rendered.command) == container_command(rendered.isvc, pool, settings)
    assert rendered.substitution is None
    assert rendered.command[:4] == ("python3", "/opt/kvq/evidence_wrapper.py", "--", "python3")


def test_a_refused_dtype_runs_the_auto_command_with_only_the_dtype_swapped() -> None:
    pool = pool_for(H200)
    refused = render_point(Point("llama-3-8b", "fp8_e5m2"), pool)
    auto = render_point(Point("llama-3-8b", "auto"), pool)
    assert refused.rendered_for == "auto"
    assert refused.substitution is not None and "refuses to render fp8_e5m2" in refused.substitution
    changed = [(a, b) for a, b in zip(auto.command, refused.command, strict=True) if a != b]
    assert changed == [("llama-3-8b-auto", "llama-3-8b-fp8-e5m2"), ("auto", "fp8_e5m2")]


def test_int8_is_rendered_as_per_token_head_and_planned_with_its_scales() -> None:
    pool = pool_for(H200)
    rendered = render_point(Point("llama-3-8b", "int8"), pool)
    assert "int8_per_token_head" in rendered.command
    auto, int8 = (plan_point(Point("llama-3-8b", d), pool) for d in ("auto", "int8"))
    # 2 x 128 one-byte values + two float32 scales per KV head, against 512 bytes for bf16
    assert int8.kv_tokens / auto.kv_tokens == pytest.approx(512 / 264, rel=1e-3)


def test_dry_run_prints_the_commands_without_a_gpu() -> None:
    lines = dry_run(H200, TierConfig(shapes=("llama-3-8b",), dtypes=("auto", "int8")))
    commands = [line for line in lines if not line.startswith("#")]
    assert len(commands) == 2
    assert commands[0].startswith("VLLM_USE_FLASHINFER_SAMPLER=0 KVQ_TERMINATION_LOG=")
    assert "--kv-cache-dtype auto" in commands[0] and "--load-format dummy" in commands[0]
    warnings = [line for line in lines if line.startswith("#   catalog warning:")]
    assert len(warnings) == 1 and "int8_per_token_head is slow here" in warnings[0]


def test_a_whole_run_against_a_stand_in_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kvq's real wrapper around a stand-in vLLM: served, crashed, classified, loaded, reported."""
    fake = write_fake_vllm(tmp_path / "fake")
    monkeypatch.setenv("FAKE_VLLM_FIXTURES", str(FIXTURES))
    monkeypatch.setenv("PYTHONPATH", f"{fake}{os.pathsep}{REPO / 'operator'}")
    sys.path.insert(0, str(REPO / "e2e" / "engine"))
    import server

    config = TierConfig(
        shapes=("llama-3-8b",),
        dtypes=("auto", "fp8_e5m2"),
        load_points=frozenset({("llama-3-8b", "auto")}),
        load=LoadSpec(requests=4, prompt_tokens=10, max_tokens=3),
        python=sys.executable,
        port=server.free_port(),
        pod_root=tmp_path / "pod",
    )
    document = run_tier(
        H200, config, tmp_path / "logs", write_json(tmp_path / "run.json"), gpu_idle=lambda: True
    )
    auto, e5m2 = document["points"]
    assert auto["outcome"] == "served"
    assert auto["capacity"]["measured_kv_tokens"] == 891_712
    # both of vLLM's figures, and what `run.py report` needs to plan the point again
    assert auto["capacity"]["measured_concurrency"] == 244.44
    assert auto["capacity"]["planned_concurrency"] == auto["plan"]["max_concurrency"]
    assert auto["config"]["num_hidden_layers"] == 32
    assert auto["settings"]["max_model_len"] == 4096
    assert auto["cache_config_info"]["num_gpu_blocks"] == 55_732
    assert auto["load"]["ok"] == 4 and auto["load"]["completion_tokens"] == 12
    assert auto["load"]["peak_kv_usage"] > 0  # the load was seen running
    assert e5m2["outcome"] == "crashed"
    assert e5m2["failure"]["exit_code"] == 1
    assert "kv_cache_dtype" in e5m2["failure"]["termination_message"]
    assert e5m2["failure"]["fallback"] is True
    assert e5m2["verdict"] == "as predicted (refused, kvq falls back)"
    markdown = report.render_markdown(report.merge([document]))
    assert "dummy" in markdown and "| llama-3-8b | fp8_e5m2 | refused | crashed | 1 |" in markdown
    assert report.file_stem(document).endswith("-h200")


def test_a_second_run_of_the_same_label_keeps_the_first_runs_results(tmp_path: Path) -> None:
    import run  # e2e/gpu/run.py, beside gputier

    assert run.free_stem(tmp_path, "2026-12-04-h200-f") == "2026-12-04-h200-f"
    (tmp_path / "2026-12-04-h200-f.json").write_text("{}")
    assert run.free_stem(tmp_path, "2026-12-04-h200-f") == "2026-12-04-h200-f-2"
    (tmp_path / "2026-12-04-h200-f-2.json").write_text("{}")
    assert run.free_stem(tmp_path, "2026-12-04-h200-f") == "2026-12-04-h200-f-3"
