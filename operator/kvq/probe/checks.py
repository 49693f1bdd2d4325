"""Thresholds on scores (`--require 'needle.accuracy>=0.9'`) and the verdict they give.

A requirement is `SCORE OP THRESHOLD` with OP one of >=, <=, >, <, and THRESHOLD a
number or `baseline`, `baseline-0.05`, `baseline+2` (the same score measured on the
baseline server's answers to the same prompts, when `--baseline-url` is given).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kvq.probe.report import Check, Verdict

_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
}
_REQUIREMENT = re.compile(
    r"^\s*(?P<score>[A-Za-z][\w.]*)\s*(?P<op>>=|<=|>|<)\s*"
    r"(?:(?P<baseline>baseline)\s*(?P<delta>[+-]\s*\d+(?:\.\d+)?)?|(?P<number>-?\d+(?:\.\d+)?))\s*$"
)


class RequirementError(ValueError):
    """A requirement that does not parse."""


@dataclass(frozen=True)
class Requirement:
    text: str
    score: str
    op: str
    number: float | None
    # With `baseline`: the threshold is the baseline's score plus this.
    baseline_delta: float | None

    def threshold(self, baseline_scores: Mapping[str, float]) -> float | None:
        if self.number is not None:
            return self.number
        base = baseline_scores.get(self.score)
        return None if base is None else base + (self.baseline_delta or 0.0)


def parse_requirement(text: str) -> Requirement:
    match = _REQUIREMENT.match(text)
    if match is None:
        raise RequirementError(
            f"cannot read requirement {text!r}: expected SCORE OP THRESHOLD, "
            "e.g. needle.accuracy>=0.9 or agreement.tokenAgreement>=baseline-0.1"
        )
    number = match.group("number")
    delta = match.group("delta")
    return Requirement(
        text=text.strip(),
        score=match.group("score"),
        op=match.group("op"),
        number=float(number) if number is not None else None,
        baseline_delta=(float(delta.replace(" ", "")) if delta else 0.0)
        if match.group("baseline")
        else None,
    )


def evaluate_checks(
    requirements: list[Requirement],
    scores: Mapping[str, float],
    baseline_scores: Mapping[str, float],
) -> list[Check]:
    """Each requirement against the scores; `passed` is None where a number is missing."""
    checks = []
    for requirement in requirements:
        value = scores.get(requirement.score)
        threshold = requirement.threshold(baseline_scores)
        passed = (
            None if value is None or threshold is None else _OPS[requirement.op](value, threshold)
        )
        checks.append(
            Check(
                requirement=requirement.text,
                score=requirement.score,
                passed=passed,
                value=value,
                threshold=threshold,
            )
        )
    return checks


def decide_verdict(checks: list[Check], problem: str | None) -> tuple[Verdict, str]:
    """Fail beats Unknown beats Pass: a measured failure stands even if others are missing."""
    failed = [c for c in checks if c.passed is False]
    missing = [c for c in checks if c.passed is None]
    if failed:
        described = "; ".join(
            f"{c.score} = {c.value:.4g} (required {c.requirement})" for c in failed
        )
        return Verdict.FAIL, f"{len(failed)} of {len(checks)} checks failed: {described}"
    if problem is not None:
        return Verdict.UNKNOWN, problem
    if missing:
        names = ", ".join(c.score for c in missing)
        return Verdict.UNKNOWN, f"no measurement for {names}"
    if not checks:
        return Verdict.PASS, "measured; no thresholds were given"
    return Verdict.PASS, f"all {len(checks)} checks passed"
