"""The GPU tier's tensor- and pipeline-parallel points (issue 25): `SHAPE:tp=N:pp=N`, the
InferenceService a user writes for them, the command kvq renders, the plan per GPU and per
stage, and a clear refusal for a point wider than the machine."""

from __future__ import annotations

import copy
import json

import pytest

from kvq.planner import plan_capacity
from tests.unit.gpu_tier_support import REPO

from gputier import report  # isort: skip
from gputier.gpu import GpuInfo, pool_for  # isort: skip
from gputier.points import (  # isort: skip
    Point,
    PointError,
    ShapeSpec,
    architecture,
    parse_shape,
    render_point,
)
from gputier.shapes import config_json  # isort: skip
from gputier.tier import TierConfig, dry_run  # isort: skip

H200_X8 = GpuInfo("NVIDIA H200", 143771, "580.159.04", 8)
H200 = GpuInfo("NVIDIA H200", 143771, "580.159.04", 1)
RESULTS = REPO / "e2e" / "gpu" / "results"


def _flag(command: list[str] | tuple[str, ...], flag: str) -> str | None:
    return command[command.index(flag) + 1] if flag in command else None


def test_a_shape_spec_names_its_tensor_and_pipeline_sizes() -> None:
    assert parse_shape("llama-3.1-70b:tp=4", 4096, None) == ShapeSpec("llama-3.1-70b", tensor=4)
    assert parse_shape("llama-3.1-70b:tp=2:pp=2:len=8192", 4096, None) == ShapeSpec(
        "llama-3.1-70b", 8192, None, tensor=2, pipeline=2
    )
    for bad in ("llama-3.1-70b:tp=0", "llama-3.1-70b:tp=four", "llama-3.1-70b:ep=2"):
        with pytest.raises(ValueError, match=r"SHAPE\[:len=N\]\[:layers=N\]\[:tp=N\]\[:pp=N\]"):
            parse_shape(bad, 4096, None)


def test_a_tensor_parallel_point_runs_kvqs_command_for_that_layout() -> None:
    point = Point("llama-3.1-70b", "fp8", tensor=4)
    rendered = render_point(point, pool_for(H200_X8))
    assert point.name == "llama-3-1-70b-tp4-fp8"
    placement = rendered.isvc.spec.placement
    assert placement.parallelism is not None
    assert (placement.parallelism.tensor, placement.parallelism.pipeline) == (4, 1)
    assert placement.gpus_per_replica == 4
    assert _flag(rendered.command, "--tensor-parallel-size") == "4"
    assert "--pipeline-parallel-size" not in rendered.command
    assert rendered.command[:3] == ("python3", "/opt/kvq/evidence_wrapper.py", "--")
    assert rendered.substitution is None


def test_a_pipeline_point_renders_both_sizes_and_plans_each_stage() -> None:
    config = TierConfig(shapes=("llama-3.1-70b:tp=2:pp=2",), dtypes=("auto",))
    lines = dry_run(H200_X8, config)
    assert lines[0] == "# GPU NVIDIA H200 (143771 MiB) x8 -> pool h200"
    assert lines[1].startswith(
        "# llama-3-1-70b-tp2-pp2-auto (llama-3.1-70b, TP 2 x PP 2, max len 4,096): predicted runs"
    )
    command = next(line for line in lines if "evidence_wrapper.py" in line).split()
    assert _flag(command, "--tensor-parallel-size") == "2"
    assert _flag(command, "--pipeline-parallel-size") == "2"
    plan = plan_capacity(
        architecture(config_json("llama-3.1-70b")),
        pool_for(H200_X8).gpu,
        "auto",
        tensor_parallel=2,
        pipeline_parallel=2,
        max_model_len=4096,
    )
    assert f"plan {plan.kv_tokens:,} KV tokens" in lines[1]
    stages = [line for line in lines if line.startswith("#   stage ")]
    assert [s.split(",")[0] for s in stages] == [
        "#   stage 0: layers 0-39",
        "#   stage 1: layers 40-79",
    ]
    assert any(f"{plan.stages[1].num_blocks:,} blocks per GPU" in s for s in stages)
    assert lines[-1] == (
        "#   plan: kvq plan --model llama-3.1-70b --gpu H200 --parallelism 2x2 --gpus-per-node 8 "
        "--kv-cache-dtype auto --gpu-memory-utilization 0.9 --max-model-len 4096 "
        "--engine-version 0.26.0 -o json"
    )


def test_the_dry_run_prints_the_plan_per_gpu_with_replicated_kv_heads() -> None:
    # Qwen3-30B-A3B has 4 KV heads: at TP 8 each is held by two GPUs, so a GPU's KV bytes
    # per token stay those of TP 4 (one head), and the plan says so.
    config = TierConfig(shapes=("qwen3-30b-a3b:tp=4", "qwen3-30b-a3b:tp=8"), dtypes=("fp8",))
    lines = dry_run(H200_X8, config)
    per_gpu = [line for line in lines if line.startswith("#   per GPU")]
    assert len(per_gpu) == 2
    assert per_gpu[0].startswith("#   per GPU (4 GPUs: TP 4 x PP 1): weights ")
    for line in per_gpu:
        assert "KV bytes per token 12,288 on a GPU (49,152 the whole model)" in line
    assert "--gpus 8 --kv-cache-dtype fp8" in lines[-1]


def test_a_point_wider_than_the_machine_is_refused_before_anything_starts() -> None:
    config = TierConfig(shapes=("llama-3.1-70b:tp=4",), dtypes=("auto",))
    with pytest.raises(PointError) as refused:
        dry_run(H200, config)
    assert str(refused.value) == (
        "llama-3-1-70b-tp4-auto: TP 4 x PP 1 = 4 GPUs is wider than this machine's 1 "
        "NVIDIA H200 GPU(s); run it on a machine with 4 or more (--gpu-count with --dry-run)"
    )


def test_a_layout_vllm_refuses_is_refused_naming_the_valid_sizes() -> None:
    config = TierConfig(shapes=("qwen2.5-72b:tp=3",), dtypes=("auto",))
    valid = r"64 attention heads do not divide by it \(valid: 1, 2, 4, 8\)"
    with pytest.raises(PointError, match=valid):
        dry_run(H200_X8, config)


def test_layouts_are_separate_points_and_old_results_are_one_gpu() -> None:
    one, four = Point("llama-3.1-70b", "auto"), Point("llama-3.1-70b", "auto", tensor=4)
    assert one.key != four.key
    saved = json.loads((RESULTS / "2026-12-01-h200.json").read_text())
    old = saved["points"][0]
    assert report.point_key(old)[-2:] == (1, 1)
    wide = {**copy.deepcopy(old), "tensor_parallel": 4, "inference_service": "x-tp4"}
    merged = report.merge([{**saved, "points": [old, wide]}])
    assert len(merged["points"]) == 2
    table = report.render_markdown(merged)
    assert "| shape | layers | TP x PP | max len |" in table
    assert f"| {old['shape']} | all | 4 x 1 |" in table
    assert f"| {old['shape']} | all | 1 x 1 |" in table


def test_run_py_says_why_it_refuses_a_point_and_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import run  # e2e/gpu/run.py, beside gputier

    argv = ["--dry-run", "--gpu-name", "NVIDIA H200", "--gpu-memory-mib", "143771"]
    with pytest.raises(SystemExit) as exited:
        run.main([*argv, "--shapes", "llama-3.1-70b:tp=4", "--dtypes", "auto"])
    assert exited.value.code == 2
    assert "llama-3-1-70b-tp4-auto: TP 4 x PP 1 = 4 GPUs is wider than this machine's 1" in (
        capsys.readouterr().err
    )
    assert run.main([*argv, "--gpu-count", "8", "--shapes", "llama-3.1-70b:tp=4"]) == 0
    assert "--tensor-parallel-size 4" in capsys.readouterr().out
