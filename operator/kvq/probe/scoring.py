"""Scores of single completions: needle retrieval, JSON validity, repetition, agreement.

No I/O: each function takes text (or tokens) the engine returned and says how good it is.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from jsonschema import Draft202012Validator

_NUMBER = re.compile(r"\d+")
_WORD = re.compile(r"\w+|[^\w\s]")
REPETITION_NGRAM = 4


def needle_retrieved(completion: str, value: str) -> bool:
    """Exact retrieval: the first number in the answer is the hidden value, digit for digit."""
    found = _NUMBER.search(completion)
    return found is not None and found.group() == value


@dataclass(frozen=True)
class JsonScore:
    parsed: bool
    valid: bool
    exact: bool
    error: str = ""


def first_json_object(text: str) -> Any:
    """The JSON value that starts at the first `{` (trailing text ignored); ValueError if none."""
    start = text.find("{")
    if start < 0:
        raise ValueError("no JSON object in the answer")
    value, _ = json.JSONDecoder().raw_decode(text[start:])
    return value


def score_json(text: str, schema: dict[str, Any], expected: dict[str, Any]) -> JsonScore:
    """Parses (first object), validates against `schema`, compares with `expected`."""
    try:
        value = first_json_object(text)
    except ValueError as error:
        return JsonScore(parsed=False, valid=False, exact=False, error=str(error))
    errors = sorted(Draft202012Validator(schema).iter_errors(value), key=lambda e: e.path)
    if errors:
        return JsonScore(parsed=True, valid=False, exact=False, error=errors[0].message)
    return JsonScore(parsed=True, valid=True, exact=value == expected)


@dataclass(frozen=True)
class RepetitionScore:
    words: int
    # Share of the text's n-grams that already occurred earlier in it.
    repeated_ngram_rate: float
    # The longest run of words that occurs at least twice (occurrences may overlap).
    longest_repeated_span: int


def words_of(text: str) -> list[str]:
    """Words and punctuation marks, lower case: what repetition is counted in."""
    return _WORD.findall(text.lower())


def score_repetition(text: str, n: int = REPETITION_NGRAM) -> RepetitionScore:
    words = words_of(text)
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    seen: set[tuple[str, ...]] = set()
    repeated = 0
    for gram in grams:
        repeated += gram in seen
        seen.add(gram)
    rate = repeated / len(grams) if grams else 0.0
    return RepetitionScore(len(words), rate, longest_repeated_span(words))


def longest_repeated_span(words: list[str]) -> int:
    """Longest common prefix of two different suffixes, by dynamic programming (O(n^2))."""
    best = 0
    # previous[j]: length of the common run ending at (i-1, j-1).
    previous = [0] * (len(words) + 1)
    for i in range(1, len(words) + 1):
        current = [0] * (len(words) + 1)
        for j in range(i + 1, len(words) + 1):
            if words[i - 1] == words[j - 1]:
                current[j] = previous[j - 1] + 1
                best = max(best, current[j])
        previous = current
    return best


@dataclass(frozen=True)
class Agreement:
    """One prompt answered greedily by the baseline and the candidate."""

    baseline_tokens: int
    candidate_tokens: int
    common_prefix: int
    # |logprob(candidate) - logprob(baseline)| of each token in the common prefix: the
    # same token after the same context, so the gap is the numerics, not the choice.
    logprob_gaps: tuple[float, ...]

    @property
    def token_agreement(self) -> float:
        longest = max(self.baseline_tokens, self.candidate_tokens)
        return self.common_prefix / longest if longest else 1.0

    @property
    def identical(self) -> bool:
        return self.common_prefix == self.baseline_tokens == self.candidate_tokens


def compare_greedy(
    baseline_tokens: list[str],
    baseline_logprobs: list[float],
    candidate_tokens: list[str],
    candidate_logprobs: list[float],
) -> Agreement:
    common = 0
    for ours, theirs in zip(candidate_tokens, baseline_tokens, strict=False):
        if ours != theirs:
            break
        common += 1
    gaps = tuple(
        abs(candidate_logprobs[i] - baseline_logprobs[i])
        for i in range(min(common, len(candidate_logprobs), len(baseline_logprobs)))
    )
    return Agreement(len(baseline_tokens), len(candidate_tokens), common, gaps)
