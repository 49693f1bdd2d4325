"""The GPU tier's probe points (e2e/gpu/gputier/probe_quality.py), here on the CPU: the
commands kvq renders for the trained probe model on an H200 pool, and the results page."""

from __future__ import annotations

from tests.unit.gpu_tier_support import REPO  # noqa: F401  (puts e2e/gpu on sys.path)

from gputier.gpu import GpuInfo, pool_for  # isort: skip
from gputier.probe_quality import (  # isort: skip
    BASELINE_PORT,
    CANDIDATE_PORT,
    ProbeConfig,
    describe,
    dry_run_lines,
    markdown,
)

H200 = pool_for(GpuInfo("NVIDIA H200", 143771, "580.159.04", 1))


def test_the_probe_serves_real_weights_with_kvqs_command_beside_the_auto_baseline() -> None:
    auto = describe("auto", H200, "python3", BASELINE_PORT)
    fp8 = describe("fp8", H200, "python3", CANDIDATE_PORT)
    for record in (auto, fp8):
        command = record["command"]
        # The trained weights and their tokenizer: nothing of the dummy-weight points.
        assert "--load-format" not in command and "--skip-tokenizer-init" not in command
        assert command[command.index("--model") + 1] == "/models/gpu-tier/kvq-probe-llama"
        # Both fit the GPU at once.
        assert command[command.index("--gpu-memory-utilization") + 1] == "0.3"
    assert auto["command"][auto["command"].index("--port") + 1] == str(BASELINE_PORT)
    assert fp8["command"][fp8["command"].index("--port") + 1] == str(CANDIDATE_PORT)
    assert fp8["command"][fp8["command"].index("--kv-cache-dtype") + 1] == "fp8"
    # Quantized thresholds are relative to auto's scores on the same prompts.
    assert "agreement.tokenAgreement>=0.65" in fp8["requirements"]
    assert all("baseline" not in r for r in auto["requirements"])


def test_a_dtype_kvq_refuses_on_hopper_is_recorded_as_kvqs_refusal_not_run() -> None:
    record = describe("fp8_e5m2", H200, "python3", CANDIDATE_PORT)
    assert record["outcome"] == "refused by kvq"
    assert "e4m3" in record["refusal"] and "command" not in record
    lines = dry_run_lines(H200, ProbeConfig(dtypes=("fp8", "fp8_e5m2")))
    assert sum(line.startswith("python3 /opt/kvq/evidence_wrapper.py") for line in lines) == 2
    assert any(line.startswith("# fp8_e5m2: ") for line in lines)


def test_the_page_shows_each_score_beside_autos_and_the_failed_checks() -> None:
    doc = {
        "model": "kvq-probe-llama",
        "suites": ["needle", "json", "repetition"],
        "needle_distractors": 0,
        "seed": 1234,
        "utilization": 0.3,
        "points": [
            {
                "dtype": "auto",
                "outcome": "served",
                "verdict": "Pass",
                "report": {
                    "scores": {"needle.accuracy": 0.675, "json.validRate": 1.0},
                    "checks": [{"requirement": "needle.accuracy>=0.4", "passed": True}],
                    "engine": {"cacheConfig": {"cacheDtype": "auto"}},
                },
            },
            {
                "dtype": "int8",
                "outcome": "served",
                "verdict": "Fail",
                "report": {
                    "scores": {"needle.accuracy": 0.3, "agreement.tokenAgreement": 0.41},
                    "baselineScores": {"needle.accuracy": 0.675},
                    "checks": [
                        {"requirement": "needle.accuracy>=baseline-0.15", "passed": False},
                        {"requirement": "agreement.tokenAgreement>=0.65", "passed": False},
                    ],
                    "engine": {"cacheConfig": {"cacheDtype": "int8_per_token_head"}},
                },
            },
        ],
    }
    rows = [line for line in markdown(doc, "NVIDIA H200", {}) if line.startswith("| int8")]
    assert rows == [
        "| int8 | served | Fail | 0.300 (0.675) | - | - | 0.410 | int8_per_token_head "
        "| needle.accuracy>=baseline-0.15, agreement.tokenAgreement>=0.65 |"
    ]
