"""Runs the probe's suites against one server (and a baseline) and builds the report.

Order of work: read what the server serves (model, max_model_len, KV-cache config),
plan every request up front (so progress has a total and the time budget is known to
cover a fixed list), send them one at a time (greedy, fixed seed: the same prompts give
the same answers, and batching never mixes them), score, judge.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvq.probe import scoring, tasks
from kvq.probe.checks import Requirement, decide_verdict, evaluate_checks
from kvq.probe.client import (
    DEFAULT_SEED,
    Completion,
    EngineClient,
    EngineUnreachableError,
    RequestRejectedError,
)
from kvq.probe.report import (
    AgreementResult,
    CacheConfig,
    EngineInfo,
    JsonResult,
    NeedleCell,
    NeedleResult,
    ProbeReport,
    RepetitionResult,
    Suites,
    Verdict,
)

SUITES = ("needle", "json", "repetition", "agreement")
DEFAULT_SUITES = ("needle", "json", "repetition")
# Context lengths probed, as shares of what the server accepts.
NEEDLE_LENGTH_SHARES = (0.125, 0.25, 0.5, 0.9)
NEEDLE_MAX_TOKENS = 8
JSON_MAX_TOKENS = 96
# Used when the server does not say its max_model_len and --max-context is not given.
FALLBACK_MAX_CONTEXT = 4096
# Calibration haystacks (filler characters): tokens = base + per_char x characters.
CALIBRATION_CHARS = (100, 1000)
# Seeds of the suites' cases, offsets from the run's seed.
_NEEDLE_SEED, _JSON_SEED, _REPETITION_SEED = 1_000_000, 2_000_000, 3_000_000


@dataclass(frozen=True)
class ProbeOptions:
    url: str
    model: str | None = None
    suites: tuple[str, ...] = DEFAULT_SUITES
    baseline_url: str | None = None
    seed: int = DEFAULT_SEED
    needle_depths: tuple[float, ...] = tasks.NEEDLE_DEPTHS
    needle_lengths: tuple[int, ...] = ()  # tokens; default: shares of max_model_len
    needle_trials: int = 2
    needle_distractors: int = tasks.NEEDLE_DISTRACTORS
    max_context: int | None = None
    json_cases: int = 12
    repetition_cases: int = 6
    repetition_tokens: int = 128
    budget_s: float = 900.0
    request_timeout_s: float = 120.0
    requirements: tuple[Requirement, ...] = ()


@dataclass(frozen=True)
class Item:
    """One request of a suite, and what its answer is checked against."""

    suite: str
    prompt: str
    max_tokens: int
    needle: tasks.NeedleCase | None = None
    target_tokens: int = 0
    json_case: tasks.JsonCase | None = None


@dataclass
class Answers:
    """Completions by item index; a string is the error the server gave instead."""

    by_item: dict[int, Completion | str] = field(default_factory=dict)

    def completion(self, index: int) -> Completion | None:
        answer = self.by_item.get(index)
        return answer if isinstance(answer, Completion) else None


class ProgressSink:
    """What the runner tells a progress display; the default shows nothing."""

    def start(self, total: int) -> None:
        """`total` requests are planned."""

    def advance(self, description: str) -> None:
        """One request is done."""


@dataclass(frozen=True)
class Calibration:
    """Prompt tokens as a line in prompt characters, for this server's tokenizer."""

    base_tokens: float
    tokens_per_char: float
    # Characters of a haystack that are not filler: the facts and the question.
    other_chars: float

    def filler_chars_for(self, tokens: int) -> int:
        """Filler characters that make a prompt of about `tokens` tokens."""
        prompt_chars = (tokens - self.base_tokens) / self.tokens_per_char
        return max(1, math.floor(prompt_chars - self.other_chars))


def run_probe(options: ProbeOptions, progress: ProgressSink | None = None) -> ProbeReport:
    """The whole probe; never raises for what the server does (that is in the report)."""
    progress = progress or ProgressSink()
    started = time.monotonic()
    deadline = started + options.budget_s
    candidate = EngineClient(options.url, options.model, options.request_timeout_s, options.seed)
    baseline = (
        EngineClient(options.baseline_url, options.model, options.request_timeout_s, options.seed)
        if options.baseline_url and "agreement" in options.suites
        else None
    )
    try:
        return _run(options, candidate, baseline, progress, started, deadline)
    finally:
        candidate.close()
        if baseline is not None:
            baseline.close()


def _run(
    options: ProbeOptions,
    candidate: EngineClient,
    baseline: EngineClient | None,
    progress: ProgressSink,
    started: float,
    deadline: float,
) -> ProbeReport:
    errors: list[str] = []
    try:
        engine = describe_engine(candidate)
        baseline_info = describe_engine(baseline) if baseline is not None else None
        max_context = options.max_context or engine.max_model_len or FALLBACK_MAX_CONTEXT
        items = plan_items(options, candidate, max_context)
    except (EngineUnreachableError, RequestRejectedError) as error:
        return _unanswered(options, candidate.url, str(error), time.monotonic() - started)

    progress.start(len(items) * (2 if baseline is not None else 1))
    answers, base_answers = Answers(), Answers()
    logprobs = baseline is not None
    problem: str | None = None
    for index, item in enumerate(items):
        if time.monotonic() > deadline:
            problem = f"time budget of {options.budget_s:.0f} s spent after {index} of {len(items)}"
            break
        try:
            for client, store in ((candidate, answers), (baseline, base_answers)):
                if client is None:
                    continue
                try:
                    store.by_item[index] = client.complete(
                        item.prompt, item.max_tokens, logprobs=logprobs
                    )
                except RequestRejectedError as error:
                    store.by_item[index] = str(error)
                    errors.append(f"{item.suite}: {error}")
                progress.advance(item.suite)
        except EngineUnreachableError as error:
            problem = f"the engine stopped answering: {error}"
            break

    suites = score_suites(options.suites, items, answers, base_answers if baseline else None)
    scores = flat_scores(suites)
    baseline_scores = (
        flat_scores(score_suites(options.suites, items, base_answers, None))
        if baseline is not None
        else {}
    )
    checks = evaluate_checks(list(options.requirements), scores, baseline_scores)
    verdict, reason = decide_verdict(checks, problem)
    return ProbeReport(
        verdict=verdict,
        reason=reason,
        engine=engine,
        baseline=baseline_info,
        suites_run=list(options.suites),
        complete=problem is None,
        duration_s=round(time.monotonic() - started, 2),
        seed=options.seed,
        scores=scores,
        baseline_scores=baseline_scores,
        checks=checks,
        suites=suites,
        errors=_first(errors, 20),
    )


def _unanswered(options: ProbeOptions, url: str, problem: str, elapsed: float) -> ProbeReport:
    checks = evaluate_checks(list(options.requirements), {}, {})
    return ProbeReport(
        verdict=Verdict.UNKNOWN,
        reason=f"the engine could not be probed: {problem}",
        engine=EngineInfo(url=url),
        suites_run=list(options.suites),
        complete=False,
        duration_s=round(elapsed, 2),
        seed=options.seed,
        scores={},
        checks=checks,
        errors=[problem],
    )


def describe_engine(client: EngineClient) -> EngineInfo:
    served = client.served_model()
    labels = client.cache_config()
    cache = (
        CacheConfig(
            cache_dtype=labels.get("cache_dtype"),
            block_size=_int_label(labels, "block_size"),
            num_gpu_blocks=_int_label(labels, "num_gpu_blocks"),
            kv_cache_size_tokens=_int_label(labels, "kv_cache_size_tokens"),
            labels=labels,
        )
        if labels
        else None
    )
    return EngineInfo(
        url=client.url, model=served.name, max_model_len=served.max_model_len, cache_config=cache
    )


def _int_label(labels: dict[str, str], name: str) -> int | None:
    try:
        return int(labels[name])
    except (KeyError, ValueError):
        return None


# --- planning ------------------------------------------------------------------------------


def needle_lengths(options: ProbeOptions, max_context: int) -> list[int]:
    if options.needle_lengths:
        return sorted(set(options.needle_lengths))
    usable = max_context - NEEDLE_MAX_TOKENS
    return sorted({max(32, round(share * usable)) for share in NEEDLE_LENGTH_SHARES})


def calibrate(client: EngineClient, seed: int, distractors: int) -> Calibration:
    """Tokens per filler character, measured with this server's tokenizer (usage counts)."""
    cases = [tasks.needle_case(seed, n, 0.5, distractors) for n in CALIBRATION_CHARS]
    counts = [client.complete(c.prompt, 1, logprobs=False).prompt_tokens for c in cases]
    chars = [len(c.prompt) for c in cases]
    per_char = max(1e-3, (counts[1] - counts[0]) / (chars[1] - chars[0]))
    other = statistics.fmean(len(c.prompt) - c.filler_chars for c in cases)
    return Calibration(counts[0] - per_char * chars[0], per_char, other)


def plan_items(options: ProbeOptions, client: EngineClient, max_context: int) -> list[Item]:
    items: list[Item] = []
    wanted = set(options.suites)
    if "needle" in wanted:
        calibration = calibrate(client, options.seed + _NEEDLE_SEED, options.needle_distractors)
        for length in needle_lengths(options, max_context):
            chars = calibration.filler_chars_for(length)
            for depth_index, depth in enumerate(options.needle_depths):
                for trial in range(options.needle_trials):
                    seed = options.seed + _NEEDLE_SEED + length * 1000 + depth_index * 10 + trial
                    case = tasks.needle_case(seed, chars, depth, options.needle_distractors)
                    items.append(Item("needle", case.prompt, NEEDLE_MAX_TOKENS, case, length))
    if "json" in wanted:
        for i in range(options.json_cases):
            case_json = tasks.json_case(options.seed + _JSON_SEED + i)
            items.append(Item("json", case_json.prompt, JSON_MAX_TOKENS, json_case=case_json))
    # Agreement alone compares free continuations: the repetition suite's prompts.
    if "repetition" in wanted or wanted == {"agreement"}:
        for i in range(options.repetition_cases):
            prompt = tasks.continuation_prompt(options.seed + _REPETITION_SEED + i)
            items.append(Item("repetition", prompt, options.repetition_tokens))
    return items


# --- scoring -------------------------------------------------------------------------------


def score_suites(
    suites: Sequence[str], items: list[Item], answers: Answers, baseline: Answers | None
) -> Suites:
    by_suite: dict[str, list[int]] = defaultdict(list)
    for index, item in enumerate(items):
        by_suite[item.suite].append(index)
    return Suites(
        needle=_score_needle(items, by_suite["needle"], answers) if "needle" in suites else None,
        json_=_score_json(items, by_suite["json"], answers) if "json" in suites else None,
        repetition=(
            _score_repetition(by_suite["repetition"], answers) if "repetition" in suites else None
        ),
        agreement=(
            _score_agreement(len(items), answers, baseline)
            if "agreement" in suites and baseline is not None
            else None
        ),
    )


def _score_needle(items: list[Item], indexes: list[int], answers: Answers) -> NeedleResult | None:
    cells: dict[tuple[float, int], list[int]] = defaultdict(list)
    for index in indexes:
        needle = items[index].needle
        assert needle is not None
        cells[(needle.depth, items[index].target_tokens)].append(index)
    out: list[NeedleCell] = []
    hits = answered = 0
    for (depth, length), members in sorted(cells.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        completions = [(i, answers.completion(i)) for i in members]
        done = [(i, c) for i, c in completions if c is not None]
        cell_hits = sum(scoring.needle_retrieved(c.text, _needle(items[i]).value) for i, c in done)
        errors = sum(1 for i in members if isinstance(answers.by_item.get(i), str))
        if not done:
            continue
        hits += cell_hits
        answered += len(done)
        out.append(
            NeedleCell(
                depth=depth,
                target_tokens=length,
                prompt_tokens=round(statistics.fmean(c.prompt_tokens for _, c in done), 1),
                trials=len(done),
                retrieved=cell_hits,
                accuracy=round(cell_hits / len(done), 4),
                errors=errors,
            )
        )
    if not answered:
        return None
    return NeedleResult(
        depths=sorted({c.depth for c in out}),
        lengths=sorted({c.target_tokens for c in out}),
        cells=out,
        accuracy=round(hits / answered, 4),
        min_cell_accuracy=min(c.accuracy for c in out),
    )


def _needle(item: Item) -> tasks.NeedleCase:
    assert item.needle is not None
    return item.needle


def _score_json(items: list[Item], indexes: list[int], answers: Answers) -> JsonResult | None:
    scored: list[scoring.JsonScore] = []
    for index in indexes:
        completion = answers.completion(index)
        case = items[index].json_case
        if completion is None or case is None:
            continue
        scored.append(scoring.score_json(completion.text, case.schema, case.expected))
    if not scored:
        return None
    n = len(scored)
    return JsonResult(
        cases=n,
        parse_rate=round(sum(s.parsed for s in scored) / n, 4),
        valid_rate=round(sum(s.valid for s in scored) / n, 4),
        exact_rate=round(sum(s.exact for s in scored) / n, 4),
        errors=_first(sorted({s.error for s in scored if s.error}), 5),
    )


def _score_repetition(indexes: list[int], answers: Answers) -> RepetitionResult | None:
    scored = [
        scoring.score_repetition(c.text)
        for c in (answers.completion(i) for i in indexes)
        if c is not None
    ]
    if not scored:
        return None
    return RepetitionResult(
        cases=len(scored),
        ngram=scoring.REPETITION_NGRAM,
        repeated_ngram_rate=round(statistics.fmean(s.repeated_ngram_rate for s in scored), 4),
        longest_repeated_span=max(s.longest_repeated_span for s in scored),
        mean_longest_repeated_span=round(
            statistics.fmean(s.longest_repeated_span for s in scored), 2
        ),
    )


def _score_agreement(count: int, answers: Answers, baseline: Answers) -> AgreementResult | None:
    compared: list[scoring.Agreement] = []
    for index in range(count):
        ours, theirs = answers.completion(index), baseline.completion(index)
        if ours is None or theirs is None:
            continue
        compared.append(
            scoring.compare_greedy(
                list(theirs.tokens),
                list(theirs.token_logprobs),
                list(ours.tokens),
                list(ours.token_logprobs),
            )
        )
    if not compared:
        return None
    gaps = [gap for a in compared for gap in a.logprob_gaps]
    return AgreementResult(
        prompts=len(compared),
        token_agreement=round(statistics.fmean(a.token_agreement for a in compared), 4),
        exact_match_rate=round(sum(a.identical for a in compared) / len(compared), 4),
        mean_abs_logprob_diff=round(statistics.fmean(gaps), 6) if gaps else None,
        compared_tokens=len(gaps),
    )


def flat_scores(suites: Suites) -> dict[str, float]:
    """Every number a threshold may name, as `suite.field` (the report's spelling)."""
    scores: dict[str, float] = {}
    if suites.needle:
        scores["needle.accuracy"] = suites.needle.accuracy
        scores["needle.minCellAccuracy"] = suites.needle.min_cell_accuracy
    if suites.json_:
        scores["json.parseRate"] = suites.json_.parse_rate
        scores["json.validRate"] = suites.json_.valid_rate
        scores["json.exactRate"] = suites.json_.exact_rate
    if suites.repetition:
        scores["repetition.repeatedNgramRate"] = suites.repetition.repeated_ngram_rate
        scores["repetition.longestRepeatedSpan"] = float(suites.repetition.longest_repeated_span)
        scores["repetition.meanLongestRepeatedSpan"] = suites.repetition.mean_longest_repeated_span
    if suites.agreement:
        scores["agreement.tokenAgreement"] = suites.agreement.token_agreement
        scores["agreement.exactMatchRate"] = suites.agreement.exact_match_rate
        if suites.agreement.mean_abs_logprob_diff is not None:
            scores["agreement.meanAbsLogprobDiff"] = suites.agreement.mean_abs_logprob_diff
    return scores


def _first(values: Sequence[str], n: int) -> list[str]:
    return list(values[:n])
