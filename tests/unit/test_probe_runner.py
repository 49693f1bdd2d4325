"""`kvq probe` against a real HTTP server that answers like a model the test scripts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvq.cli import app
from kvq.probe.checks import parse_requirement
from kvq.probe.report import (
    SCHEMA_VERSION,
    TERMINATION_MESSAGE_LIMIT,
    ProbeReport,
    Verdict,
    summary_json,
)
from kvq.probe.runner import ProbeOptions, run_probe
from tests.unit.probe_fake_server import (
    FakeServer,
    closed_port_url,
    needle_answer,
    needle_depth,
    perfect_json,
    perfect_model,
    serving,
)

cli = CliRunner()
FAST = {"needle_trials": 1, "json_cases": 6, "repetition_cases": 3}


def probe(url: str, **options: object) -> ProbeReport:
    return run_probe(ProbeOptions(url=url, **{**FAST, **options}))  # type: ignore[arg-type]


def test_a_perfect_model_scores_full_marks_and_the_report_names_its_cache() -> None:
    with serving(FakeServer(perfect_model, max_model_len=2048, cache_dtype="fp8")) as fake:
        report = probe(fake.url, requirements=(parse_requirement("needle.accuracy>=0.99"),))

    assert report.verdict is Verdict.PASS
    assert report.complete
    assert report.engine.model == "fake-model"
    assert report.engine.max_model_len == 2048
    assert report.engine.cache_config is not None
    assert report.engine.cache_config.cache_dtype == "fp8"
    assert report.engine.cache_config.block_size == 16
    assert report.scores["needle.accuracy"] == 1.0
    assert report.scores["json.validRate"] == 1.0
    assert report.scores["json.exactRate"] == 1.0
    assert report.scores["repetition.repeatedNgramRate"] == 0.0
    needle = report.suites.needle
    assert needle is not None
    assert needle.depths == [0.1, 0.3, 0.5, 0.7, 0.9]
    # Lengths are shares of max_model_len, and the prompts really have about that length.
    assert needle.lengths == [255, 510, 1020, 1836]
    for cell in needle.cells:
        assert abs(cell.prompt_tokens - cell.target_tokens) <= 0.05 * cell.target_tokens + 15


def test_the_requests_are_greedy_and_seeded() -> None:
    with serving(FakeServer(perfect_model)) as fake:
        probe(fake.url, suites=("json",), seed=99)
    assert fake.requests
    assert {(r["temperature"], r["seed"]) for r in fake.requests} == {(0.0, 99)}
    assert {r["model"] for r in fake.requests} == {"fake-model"}


def test_the_same_seed_asks_the_same_prompts() -> None:
    with serving(FakeServer(perfect_model)) as fake:
        probe(fake.url, seed=5)
        probe(fake.url, seed=5)
        probe(fake.url, seed=6)
    prompts = [r["prompt"] for r in fake.requests]
    third = len(prompts) // 3
    assert prompts[:third] == prompts[third : 2 * third]
    assert prompts[:third] != prompts[2 * third :]


def forgets_the_first_half(prompt: str) -> tuple[str, list[float]]:
    """Finds a needle only in the second half of the context (a 'lost in the middle')."""
    value = needle_answer(prompt)
    if value is not None:
        return (f" {value}." if needle_depth(prompt) >= 0.42 else " 1111."), [-0.1, -0.1]
    return perfect_model(prompt)


def test_needles_lost_early_in_the_context_fail_the_threshold(tmp_path: Path) -> None:
    termination_log = tmp_path / "termination-log"
    with serving(FakeServer(forgets_the_first_half)) as fake:
        result = cli.invoke(
            app,
            ["probe", "--url", fake.url, "--suite", "needle", "--needle-trials", "1",
             "--require", "needle.accuracy>=0.9", "-o", "json",
             "--termination-log", str(termination_log)],
        )  # fmt: skip

    assert result.exit_code == 1, result.output
    report = ProbeReport.model_validate_json(result.stdout)
    assert report.verdict is Verdict.FAIL
    needle = report.suites.needle
    assert needle is not None
    assert len(needle.cells) == 5 * 4
    for cell in needle.cells:
        assert cell.accuracy == (0.0 if cell.depth < 0.5 else 1.0), cell
    assert report.scores["needle.accuracy"] == pytest.approx(0.6)
    assert report.scores["needle.minCellAccuracy"] == 0.0
    # What a probe Job hands the operator: one line, small, versioned, with the verdict.
    summary = json.loads(termination_log.read_text())
    assert len(termination_log.read_bytes()) <= TERMINATION_MESSAGE_LIMIT
    assert summary["schemaVersion"] == SCHEMA_VERSION
    assert summary["kind"] == "ProbeReport"
    assert summary["verdict"] == "Fail"
    assert summary["scores"]["needle.accuracy"] == pytest.approx(0.6)
    assert summary["engine"]["cacheConfig"]["cacheDtype"] == "fp8"
    assert "suites" not in summary
    assert summary["checks"][0] == {
        "requirement": "needle.accuracy>=0.9",
        "score": "needle.accuracy",
        "passed": False,
        "value": 0.6,
        "threshold": 0.9,
    }


def sloppy_json(prompt: str) -> tuple[str, list[float]]:
    """Even records as strings where the schema wants numbers; odd ones unquoted."""
    if not prompt.endswith("JSON:"):
        return perfect_model(prompt)
    text = perfect_json(prompt)
    if len(prompt) % 2:
        return " " + re.sub(r'"(\w+)": "', r"\1: ", text), [-1.0]
    return " " + re.sub(r": (\d+)", r': "\1"', text), [-1.0]


def test_json_distinguishes_unparsable_from_invalid() -> None:
    with serving(FakeServer(sloppy_json)) as fake:
        report = probe(fake.url, suites=("json",), json_cases=12)

    result = report.suites.json_
    assert result is not None
    assert result.cases == 12
    assert 0.0 < result.parse_rate < 1.0
    # Every record has a number or boolean field except those without digits: none is valid
    # unless it parsed, and a quoted number never validates.
    assert result.valid_rate < result.parse_rate
    assert result.exact_rate <= result.valid_rate
    assert result.errors


def looping(prompt: str) -> tuple[str, list[float]]:
    if prompt.startswith("Continue the text."):
        return " the old river rests." * 20, [-0.2] * 100
    return perfect_model(prompt)


def test_repetition_sees_a_loop() -> None:
    with serving(FakeServer(looping)) as fake:
        report = probe(
            fake.url,
            suites=("repetition",),
            requirements=(parse_requirement("repetition.repeatedNgramRate<=0.3"),),
        )
    assert report.verdict is Verdict.FAIL
    assert report.scores["repetition.repeatedNgramRate"] > 0.8
    assert report.scores["repetition.longestRepeatedSpan"] >= 90


def drifts_after_three_words(prompt: str) -> tuple[str, list[float]]:
    """The baseline's answer for three words, then other words; logprobs off by 0.25."""
    text, logprobs = perfect_model(prompt)
    words = text.split()
    drifted = words[:3] + [f"other{i}" for i in range(len(words) - 3)]
    return " " + " ".join(drifted), [lp - 0.25 for lp in logprobs]


def test_agreement_against_a_baseline() -> None:
    with (
        serving(FakeServer(perfect_model, cache_dtype="auto")) as base,
        serving(FakeServer(drifts_after_three_words)) as candidate,
    ):
        report = probe(
            candidate.url,
            suites=("json", "repetition", "agreement"),
            baseline_url=base.url,
            requirements=(parse_requirement("json.exactRate>=baseline-0.5"),),
        )

    agreement = report.suites.agreement
    assert agreement is not None
    assert agreement.prompts == 9
    assert agreement.mean_abs_logprob_diff == pytest.approx(0.25)
    assert agreement.compared_tokens == 9 * 3
    assert 0.0 < agreement.token_agreement < 1.0
    assert agreement.exact_match_rate == 0.0
    # The baseline answered the same prompts: its scores come for free.
    assert report.baseline_scores["json.exactRate"] == 1.0
    assert report.scores["json.exactRate"] == 0.0
    assert report.verdict is Verdict.FAIL
    assert report.baseline is not None
    assert report.baseline.cache_config is not None
    assert report.baseline.cache_config.cache_dtype == "auto"
    # Every prompt went to both servers, the same way.
    assert [r["prompt"] for r in base.requests] == [
        r["prompt"] for r in candidate.requests if r["max_tokens"] > 1
    ]


def test_an_unreachable_engine_is_unknown_not_a_failure(tmp_path: Path) -> None:
    termination_log = tmp_path / "termination-log"
    result = cli.invoke(
        app,
        ["probe", "--url", closed_port_url(), "--require", "needle.accuracy>=0.9",
         "--termination-log", str(termination_log)],
    )  # fmt: skip

    assert result.exit_code == 3, result.output
    summary = json.loads(termination_log.read_text())
    assert summary["verdict"] == "Unknown"
    assert summary["reason"].startswith("the engine could not be probed")
    assert summary["checks"][0]["passed"] is None


def test_the_time_budget_bounds_the_run() -> None:
    with serving(FakeServer(perfect_model)) as fake:
        report = probe(fake.url, budget_s=0.001)
    assert not report.complete
    assert report.verdict is Verdict.UNKNOWN
    assert "time budget" in report.reason


def test_prompts_longer_than_the_server_takes_are_errors_not_misses() -> None:
    with serving(FakeServer(perfect_model, max_model_len=1000)) as fake:
        report = probe(fake.url, suites=("needle",), needle_lengths=(200, 1500))

    needle = report.suites.needle
    assert needle is not None
    assert needle.lengths == [200]  # the 1,500-token cells have no answer to score
    assert report.scores["needle.accuracy"] == 1.0
    assert report.errors and "HTTP 400" in report.errors[0]


def test_png_draws_the_needle_heat_map(tmp_path: Path) -> None:
    picture = tmp_path / "needle.png"
    with serving(FakeServer(forgets_the_first_half, max_model_len=1024)) as fake:
        result = cli.invoke(
            app,
            ["probe", "--url", fake.url, "--suite", "needle", "--needle-trials", "1",
             "-o", "png", "--png-file", str(picture)],
        )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "needle: exact retrieval" in result.stdout


def test_summary_stays_within_a_termination_message() -> None:
    with serving(FakeServer(perfect_model)) as fake:
        report = probe(fake.url)
    bloated = report.model_copy(update={"errors": ["x" * 2000] * 10, "reason": "y" * 5000})
    assert len(summary_json(bloated).encode()) <= TERMINATION_MESSAGE_LIMIT
    assert json.loads(summary_json(bloated))["verdict"] == "Pass"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--suite", "needle,bogus"], "--suite takes"),
        (["--suite", "agreement"], "needs --baseline-url"),
        (["-o", "yaml"], "--output must be"),
        (["--require", "needle.accuracy=1"], "cannot read requirement"),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = cli.invoke(app, ["probe", "--url", "http://127.0.0.1:1", *args])
    assert result.exit_code == 2
    assert message in result.output
