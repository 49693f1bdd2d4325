"""The fallback ladder: which rung next, bounded per spec generation."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial

import pytest

from kvq.fallback.ladder import (
    Attempt,
    LadderDecision,
    Rung,
    RungOption,
    current_rung,
    next_rung,
    record_attempt,
    start_rung,
)

T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
GEN = 3

AUTO_KEEPS = RungOption(Rung.AUTO, keeps_capacity=True)
AUTO_SHORT = RungOption(Rung.AUTO, keeps_capacity=False)
AWQ_KEEPS = RungOption(Rung.AWQ, keeps_capacity=True)
AWQ_SHORT = RungOption(Rung.AWQ, keeps_capacity=False)
AWQ_MISSING = RungOption(
    Rung.AWQ, keeps_capacity=True, available=False, why_unavailable="spec.model.awq.uri is not set"
)
BOTH_KEEP = {"auto": AUTO_KEEPS, "awq": AWQ_KEEPS}


def moved(from_rung: Rung, to_rung: Rung | None, generation: int = GEN) -> Attempt:
    return Attempt(from_rung, to_rung, "failed", "ValueError: x", T0, generation)


@dataclass(frozen=True)
class Case:
    name: str
    expected: Rung | None
    exhausted: bool
    says: tuple[str, ...]  # words the reason must contain
    requested_dtype: str = "fp8"
    current: Rung = Rung.REQUESTED
    rungs: tuple[str, ...] = ("auto", "awq")
    enabled: bool = True
    attempts: tuple[Attempt, ...] = ()
    options: Mapping[str, RungOption] = field(default_factory=lambda: BOTH_KEEP)
    because: str | None = None


CASES = [
    Case("first rung in spec order", Rung.AUTO, False, ("fp8", "auto KV cache", "keeps")),
    Case("spec order decides between equals", Rung.AWQ, False, ("AWQ",),
         rungs=("awq", "auto")),
    Case("the rung that keeps capacity wins", Rung.AWQ, False, ("AWQ", "keeps"),
         options={"auto": AUTO_SHORT, "awq": AWQ_KEEPS}),
    Case("nothing keeps capacity: spec order, and say so", Rung.AUTO, False,
         ("no available rung keeps",), options={"auto": AUTO_SHORT, "awq": AWQ_SHORT}),
    Case("the failure starts the reason", Rung.AUTO, False,
         ("fp8 KV cache cannot run: head size not divisible by 32",),
         because="head size not divisible by 32"),
    Case("after auto failed, awq", Rung.AWQ, False, ("auto KV cache cannot run", "AWQ"),
         current=Rung.AUTO, attempts=(moved(Rung.REQUESTED, Rung.AUTO),)),
    Case("awq first, then auto", Rung.AUTO, False, ("AWQ model", "cannot run"),
         rungs=("awq", "auto"), current=Rung.AWQ, attempts=(moved(Rung.REQUESTED, Rung.AWQ),)),
    Case("every rung failed", None, True, ("no fallback rung is left", "fp8", "auto", "AWQ"),
         current=Rung.AWQ,
         attempts=(moved(Rung.REQUESTED, Rung.AUTO), moved(Rung.AUTO, Rung.AWQ))),
    Case("unavailable rung is skipped with its reason", Rung.AUTO, False, ("auto",),
         options={"auto": AUTO_SHORT, "awq": AWQ_MISSING}),
    Case("unavailable last rung exhausts, naming why", None, True,
         ("spec.model.awq.uri is not set",), current=Rung.AUTO,
         attempts=(moved(Rung.REQUESTED, Rung.AUTO),),
         options={"auto": AUTO_KEEPS, "awq": AWQ_MISSING}),
    Case("a rung without a verdict is not deployed", Rung.AWQ, False, ("AWQ",),
         options={"awq": AWQ_KEEPS}),
    Case("auto requested: the auto rung is meaningless", Rung.AWQ, False, ("AWQ",),
         requested_dtype="auto"),
    Case("auto requested, only auto rung: exhausted", None, True,
         ("auto is what was requested",), requested_dtype="auto", rungs=("auto",)),
    Case("fallback disabled: no move", None, False, ("disabled",), enabled=False),
    Case("no rungs configured: exhausted", None, True, ("no fallback rung is left",), rungs=()),
    Case("attempts of older generations are ignored", Rung.AUTO, False, ("auto",),
         attempts=(moved(Rung.REQUESTED, Rung.AUTO, generation=GEN - 1),
                   moved(Rung.AUTO, Rung.AWQ, generation=GEN - 1))),
    Case("unknown and requested names in rungs are not rungs", Rung.AWQ, False, ("AWQ",),
         rungs=("none", "requested", "awq")),
    Case("duplicates in rungs count once", None, True, ("no fallback rung is left",),
         rungs=("auto", "auto"), current=Rung.AUTO,
         attempts=(moved(Rung.REQUESTED, Rung.AUTO),)),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_next_rung(case: Case) -> None:
    decision = next_rung(
        requested_dtype=case.requested_dtype,
        current=case.current,
        rungs=case.rungs,
        enabled=case.enabled,
        attempts=case.attempts,
        generation=GEN,
        options=case.options,
        because=case.because,
    )
    assert (decision.next, decision.exhausted) == (case.expected, case.exhausted), decision
    for word in case.says:
        assert word in decision.reason, (word, decision.reason)
    assert decision.reason.endswith(".")


def test_static_fallback_moves_before_deploying_and_says_why() -> None:
    start = partial(
        start_rung, requested_dtype="fp8", rungs=("auto", "awq"), enabled=True, options=BOTH_KEEP
    )
    can_run = RungOption(Rung.REQUESTED, keeps_capacity=True)
    assert start(requested=can_run, attempts=(), generation=GEN).next is Rung.REQUESTED

    why = "no allowed pool runs fp8 with vLLM 0.11 (Triton needs compute capability 8.9)"
    cannot = RungOption(Rung.REQUESTED, keeps_capacity=True, available=False, why_unavailable=why)
    decision = start(requested=cannot, attempts=(), generation=GEN)
    assert decision.next is Rung.AUTO
    assert why in decision.reason

    # Level-triggered: once the move is recorded, the next reconcile stays put.
    attempt = record_attempt(
        decision, current=Rung.REQUESTED, excerpt=why, at=T0, generation=GEN, static=True
    )
    assert attempt.static
    assert start(requested=cannot, attempts=(attempt,), generation=GEN).next is Rung.AUTO

    # Exhausted stays exhausted within the generation; a new one starts afresh.
    done = (attempt, moved(Rung.AUTO, Rung.AWQ), moved(Rung.AWQ, None))
    assert start(requested=cannot, attempts=done, generation=GEN) == LadderDecision(
        None, "failed", exhausted=True
    )
    assert start(requested=can_run, attempts=done, generation=GEN + 1).next is Rung.REQUESTED


def test_current_rung_follows_the_attempts_of_one_generation() -> None:
    attempts = [moved(Rung.REQUESTED, Rung.AUTO, generation=1), moved(Rung.REQUESTED, Rung.AWQ)]
    assert current_rung(attempts, 1) is Rung.AUTO
    assert current_rung(attempts, GEN) is Rung.AWQ
    assert current_rung(attempts, GEN + 1) is Rung.REQUESTED
    assert current_rung([*attempts, moved(Rung.AWQ, None)], GEN) is None


def test_record_attempt_bounds_the_evidence() -> None:
    decision = LadderDecision(Rung.AUTO, "moved", exhausted=False)
    attempt = record_attempt(decision, current="requested", excerpt="x" * 5000, at=T0, generation=7)
    assert attempt == Attempt(Rung.REQUESTED, Rung.AUTO, "moved", attempt.excerpt, T0, 7)
    assert len(attempt.excerpt.encode()) <= 1024


# --- property: bounded, never repeats, prefers capacity -------------------------------


DTYPES = ("auto", "fp8", "fp8_e5m2", "int8_per_token_head")


def _random_options(rng: random.Random) -> dict[str, RungOption]:
    options = {}
    for rung in (Rung.AUTO, Rung.AWQ):
        if rng.random() < 0.1:
            continue  # the planner gave no verdict
        available = rng.random() < 0.8
        options[rung.value] = RungOption(
            rung, rng.random() < 0.5, available, None if available else "not here"
        )
    return options


def _climb(
    rng: random.Random,
    *,
    rungs: Sequence[str],
    options: Mapping[str, RungOption],
    generation: int,
    requested_dtype: str,
    history: Sequence[Attempt] = (),
) -> tuple[list[Rung], list[LadderDecision], list[Attempt]]:
    """Fail every rung until the ladder stops; return the rungs visited and the decisions."""
    enabled = rng.random() < 0.9
    # Noise from other generations must change nothing.
    attempts = [*history] + [
        moved(rng.choice(list(Rung)), rng.choice([*Rung, None]), generation=generation - 1)
        for _ in range(rng.randrange(4))
    ]
    visited = [Rung.REQUESTED]
    decisions = []
    for _ in range(len(rungs) + 1):
        decision = next_rung(
            requested_dtype=requested_dtype,
            current=visited[-1],
            rungs=rungs,
            enabled=enabled,
            attempts=attempts,
            generation=generation,
            options=options,
        )
        decisions.append(decision)
        attempts.append(
            record_attempt(
                decision,
                current=visited[-1],
                excerpt="boom",
                at=T0 + timedelta(minutes=len(attempts)),
                generation=generation,
            )
        )
        if decision.next is None:
            assert decision.exhausted is enabled
            break
        visited.append(decision.next)
    return visited, decisions, attempts


@pytest.mark.parametrize("seed", range(20))
def test_ladder_terminates_and_never_repeats_a_rung(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(100):
        rungs = [rng.choice(["auto", "awq", "requested", "none"]) for _ in range(rng.randrange(5))]
        options = _random_options(rng)
        dtype = rng.choice(DTYPES)
        visited, decisions, _ = _climb(
            rng, rungs=rungs, options=options, generation=GEN, requested_dtype=dtype
        )

        assert decisions[-1].next is None, "did not stop within len(rungs) + 1 decisions"
        assert len(visited) == len(set(visited)), visited
        for earlier, rung in enumerate(visited[1:]):
            option = options[rung.value]
            assert option.available
            # Capacity first: a rung that loses capacity only when no untried one keeps it.
            untried = {
                name
                for name in rungs
                if name in options
                and Rung(name) not in visited[: earlier + 1]
                and not (name == "auto" and dtype == "auto")
            }
            if any(options[name].available and options[name].keeps_capacity for name in untried):
                assert option.keeps_capacity, (rungs, options, visited)


@pytest.mark.parametrize("seed", range(5))
def test_a_new_generation_climbs_the_same_way_again(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(50):
        rungs = [rng.choice(["auto", "awq"]) for _ in range(rng.randrange(1, 4))]
        options = _random_options(rng)
        dtype = rng.choice(DTYPES)
        state = rng.getstate()
        first, _, attempts = _climb(
            rng, rungs=rungs, options=options, generation=GEN, requested_dtype=dtype
        )
        rng.setstate(state)
        second, _, _ = _climb(
            rng,
            rungs=rungs,
            options=options,
            generation=GEN + 1,
            requested_dtype=dtype,
            history=attempts,
        )
        assert first == second
