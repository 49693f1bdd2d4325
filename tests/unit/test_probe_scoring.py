"""The probe's scores of single answers, and the prompts they are computed on."""

from __future__ import annotations

import pytest

from kvq.probe import scoring, tasks
from kvq.probe.checks import (
    RequirementError,
    decide_verdict,
    evaluate_checks,
    parse_requirement,
)
from kvq.probe.report import Verdict


@pytest.mark.parametrize(
    ("answer", "value", "retrieved"),
    [
        (" 4821.", "4821", True),
        (" **4821**", "4821", True),
        (" The number is 4821", "4821", True),
        (" 48210", "4821", False),  # one digit too many is not the value
        (" 482", "4821", False),
        (" 1234 or 4821", "4821", False),  # the first number counts
        (" none", "4821", False),
    ],
)
def test_needle_retrieval_is_exact(answer: str, value: str, retrieved: bool) -> None:
    assert scoring.needle_retrieved(answer, value) is retrieved


PERSON_SCHEMA = tasks.json_schema({"name": "A", "age": 1, "city": "B"})
PERSON = {"name": "Alice", "age": 31, "city": "Paris"}


@pytest.mark.parametrize(
    ("answer", "parsed", "valid", "exact"),
    [
        (' {"name": "Alice", "age": 31, "city": "Paris"}', True, True, True),
        (' {"name": "Alice", "age": 31, "city": "Paris"} and more', True, True, True),
        (' {"name": "Alice", "age": 30, "city": "Paris"}', True, True, False),
        (' {"name": "Alice", "age": "31", "city": "Paris"}', True, False, False),
        (' {"name": "Alice", "age": 31}', True, False, False),
        (' {"name": "Alice", "age": 31, "city": "Paris", "x": 1}', True, False, False),
        (' {"name": "Alice", "age": 31, "city": Paris}', False, False, False),
        (" Alice, 31, Paris", False, False, False),
    ],
)
def test_json_parses_validates_and_matches(
    answer: str, parsed: bool, valid: bool, exact: bool
) -> None:
    score = scoring.score_json(answer, PERSON_SCHEMA, PERSON)
    assert (score.parsed, score.valid, score.exact) == (parsed, valid, exact)
    assert bool(score.error) is not valid


def test_every_generated_json_case_validates_its_own_answer() -> None:
    for seed in range(60):
        case = tasks.json_case(seed)
        score = scoring.score_json(tasks.json_answer(case), case.schema, case.expected)
        assert score.exact, (case.prompt, score.error)


def test_repetition_of_a_loop_and_of_fresh_text() -> None:
    loop = scoring.score_repetition("the old river rests. " * 10)
    fresh = scoring.score_repetition(" ".join(f"w{i}" for i in range(50)))

    # 5 words a period, 50 words: 47 4-grams, of which all but the first 5 are repeats.
    assert loop.repeated_ngram_rate == pytest.approx(42 / 47)
    assert loop.longest_repeated_span == 45  # the text minus its first period, overlapping
    assert fresh.repeated_ngram_rate == 0.0
    assert fresh.longest_repeated_span == 0


@pytest.mark.parametrize(
    ("text", "span"),
    [("a b c x a b c", 3), ("a a a a", 3), ("a b c d", 0), ("", 0), ("x a b y a b z", 2)],
)
def test_longest_repeated_span(text: str, span: int) -> None:
    assert scoring.longest_repeated_span(text.split()) == span


def test_agreement_counts_the_common_prefix_and_its_logprob_gaps() -> None:
    agreement = scoring.compare_greedy(
        ["a", "b", "c", "d"], [-1.0, -2.0, -3.0, -4.0], ["a", "b", "x"], [-1.5, -2.0, -0.1]
    )
    assert agreement.common_prefix == 2
    assert agreement.token_agreement == pytest.approx(2 / 4)
    assert agreement.logprob_gaps == pytest.approx((0.5, 0.0))
    assert not agreement.identical
    same = scoring.compare_greedy(["a"], [-1.0], ["a"], [-1.0])
    assert same.identical and same.token_agreement == 1.0


def test_needle_cases_are_deterministic_and_hide_the_fact_at_its_depth() -> None:
    for depth in tasks.NEEDLE_DEPTHS:
        case = tasks.needle_case(seed=7, filler_chars=5000, depth=depth)
        assert case == tasks.needle_case(seed=7, filler_chars=5000, depth=depth)
        fact = tasks.needle_fact(case.key, case.value)
        assert case.prompt.count(fact) == 1
        haystack = case.prompt[: case.prompt.index("\nQuestion:")]
        assert abs(len(haystack) - case.filler_chars - 4 * len(fact)) <= 4 * 5
        # The fact's place is its depth, give or take a sentence and the distractors.
        at = haystack.index(fact) / len(haystack)
        assert abs(at - depth) <= 0.05, (depth, at)
        # Distractors have other keys: the question has one right answer.
        assert case.prompt.count(f"number of the {case.key} is") == 2


@pytest.mark.parametrize(
    ("text", "score", "op", "number", "delta"),
    [
        ("needle.accuracy>=0.9", "needle.accuracy", ">=", 0.9, None),
        (" json.validRate > 0.5 ", "json.validRate", ">", 0.5, None),
        ("repetition.repeatedNgramRate<=0.3", "repetition.repeatedNgramRate", "<=", 0.3, None),
        ("needle.accuracy>=baseline-0.05", "needle.accuracy", ">=", None, -0.05),
        ("needle.accuracy>=baseline", "needle.accuracy", ">=", None, 0.0),
    ],
)
def test_requirements_parse(
    text: str, score: str, op: str, number: float | None, delta: float | None
) -> None:
    requirement = parse_requirement(text)
    assert (requirement.score, requirement.op) == (score, op)
    assert requirement.number == number
    assert requirement.baseline_delta == (pytest.approx(delta) if delta is not None else None)


@pytest.mark.parametrize("text", ["needle.accuracy", "needle.accuracy=0.9", ">=0.9", "x>=y"])
def test_bad_requirements_are_refused(text: str) -> None:
    with pytest.raises(RequirementError, match="expected SCORE OP THRESHOLD"):
        parse_requirement(text)


def test_verdict_fail_beats_unknown_beats_pass() -> None:
    requirements = [
        parse_requirement("needle.accuracy>=0.9"),
        parse_requirement("json.validRate>=baseline-0.1"),
    ]
    passing = evaluate_checks(requirements, {"needle.accuracy": 1.0, "json.validRate": 0.85}, {
        "json.validRate": 0.9
    })  # fmt: skip
    assert decide_verdict(passing, None)[0] is Verdict.PASS
    assert passing[1].threshold == pytest.approx(0.8)

    missing = evaluate_checks(requirements, {"needle.accuracy": 1.0}, {})
    verdict, reason = decide_verdict(missing, None)
    assert verdict is Verdict.UNKNOWN and "json.validRate" in reason

    failing = evaluate_checks(requirements, {"needle.accuracy": 0.5}, {})
    verdict, reason = decide_verdict(failing, "the engine stopped answering")
    assert verdict is Verdict.FAIL and "needle.accuracy = 0.5" in reason

    assert decide_verdict([], "unreachable")[0] is Verdict.UNKNOWN
