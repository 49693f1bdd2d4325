"""The planner against what vLLM 0.26.0 reported on a real H200 through kvq's rendered
command (`make test-gpu`, e2e/gpu/results/2026-12-01-h200.md), and `kvq plan` with the
settings that reproduce such a run."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tests.unit.gpu_tier_support import FIXTURES

from gputier.compare import CapacityCheck  # isort: skip
from gputier.vllm_output import parse_startup  # isort: skip

from kvq.catalog.gpus import load_gpu_catalog
from kvq.catalog.models import load_model_catalog
from kvq.cli import app
from kvq.planner import plan_capacity

runner = CliRunner()


@pytest.mark.parametrize(
    ("log", "shape", "dtype"),
    [
        ("h200-v0.26.0-serve-llama3-8b-auto-ok.log", "llama-3-8b", "auto"),
        ("h200-v0.26.0-serve-llama3-8b-int8-ok.log", "llama-3-8b", "int8"),
        ("h200-v0.26.0-serve-qwen2.5-7b-auto-ok.log", "qwen2.5-7b", "auto"),
        ("h200-v0.26.0-serve-phi-3-mini-4k-fp8-ok.log", "phi-3-mini-4k", "fp8"),
    ],
)
def test_the_plan_is_within_two_percent_of_the_real_h200_serve_runs(
    log: str, shape: str, dtype: str
) -> None:
    figures = parse_startup((FIXTURES / log).read_text())
    assert figures.kv_tokens is not None and figures.max_num_batched_tokens == 8192
    catalog = load_model_catalog().lookup(shape)
    gpu = load_gpu_catalog().lookup("NVIDIA H200", 143771)
    assert catalog is not None and gpu is not None
    plan = plan_capacity(
        catalog.architecture, gpu, dtype, gpu_memory_utilization=0.90, max_model_len=4096
    )
    # serve's defaults on a >= 70 GiB GPU, as vLLM logged them
    assert plan.max_num_batched_tokens == figures.max_num_batched_tokens
    check = CapacityCheck(figures.kv_tokens, plan.kv_tokens)
    assert check.within_tolerance, f"{shape}/{dtype}: plan off by {check.error:+.2%}"
    # the known bias: vLLM's cold-start activation peak is higher than modelled
    assert 0 < check.error < 0.005


def test_plan_takes_the_batch_settings_that_reproduce_a_run() -> None:
    args = [
        "plan",
        "--model",
        "llama-3-8b",
        "--gpu",
        "H200",
        "--kv-cache-dtype",
        "auto",
        "--max-model-len",
        "4096",
        "-o",
        "json",
    ]
    default = json.loads(runner.invoke(app, args).stdout)["dtypes"]["auto"]
    small = runner.invoke(app, [*args, "--max-num-seqs", "256", "--max-num-batched-tokens", "2048"])
    assert small.exit_code == 0, small.output
    row = json.loads(small.stdout)["dtypes"]["auto"]
    assert (default["maxNumBatchedTokens"], default["maxNumSeqs"]) == (8192, 1024)
    assert (row["maxNumBatchedTokens"], row["maxNumSeqs"]) == (2048, 256)
    # a smaller batch budget leaves more memory for the KV cache
    assert row["kvTokens"] > default["kvTokens"]


def test_plan_warns_where_int8_is_measured_slow_and_says_by_how_much() -> None:
    args = ["plan", "--model", "llama-3-8b", "--gpu", "H200", "--engine-version", "0.26.0"]
    table = runner.invoke(app, args)
    assert table.exit_code == 0, table.output
    assert "int8 warning: int8_per_token_head is slow here" in table.stdout
    assert "2.00x" in table.stdout and "prefer fp8" in table.stdout
    document = json.loads(runner.invoke(app, [*args, "-o", "json"]).stdout)
    assert "warning" in document["dtypes"]["int8"]["engine"]
    assert "warning" not in document["dtypes"]["fp8"]["engine"]


def test_no_slow_warning_off_hopper() -> None:
    args = ["plan", "--model", "llama-3-8b", "--gpu", "L4", "--engine-version", "0.26.0"]
    result = runner.invoke(app, [*args, "-o", "json"])
    assert "warning" not in json.loads(result.stdout)["dtypes"]["int8"]["engine"]
