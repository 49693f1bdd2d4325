"""The fallback ladder: climb() on its own, table-driven, plus a randomised run."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

import pytest

from kvq.api.status import FallbackAttempt
from kvq.fallback.ladder import (
    LadderInput,
    LadderPolicy,
    Rung,
    RungState,
    RuntimeVerdict,
    climb,
    retry_after,
)

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
R, A, W = Rung.REQUESTED, Rung.AUTO, Rung.AWQ


def ok(rung: Rung, pool: str = "h100") -> RungState:
    return RungState(rung, pool, compatible=True, runnable=True)


def busy(rung: Rung, pool: str = "h100", why: str = "pool h100: room for 0 of 1") -> RungState:
    return RungState(rung, pool, compatible=True, runnable=False, why=why)


def nowhere(rung: Rung, why: str = "no pool fits: t4 (T4): fp8 needs 8.9") -> RungState:
    return RungState(rung, None, compatible=False, runnable=False, why=why)


def ladder(
    states: Mapping[Rung, RungState] | None = None,
    *,
    current: Rung | None = R,
    history: list[FallbackAttempt] | None = None,
    verdict: RuntimeVerdict | None = None,
    waiting_since: datetime | None = None,
    now: datetime = T0,
    rungs: tuple[str, ...] = ("auto",),
    enabled: bool = True,
    key: str = "k1",
    reset_at: datetime | None = None,
    by_hand: bool = False,
) -> LadderInput:
    return LadderInput(
        requested_dtype="fp8",
        rungs=rungs,
        enabled=enabled,
        key=key,
        generation=1,
        now=now,
        states=states or {R: ok(R), A: ok(A)},
        history=history or [],
        current=current,
        waiting_since=waiting_since,
        reset_at=reset_at,
        verdict=verdict,
        by_hand=by_hand,
    )


REFUSED = RuntimeVerdict("Refused", "The CPU attention backend refused the fp8 KV cache.", "x")
SUSPECT = RuntimeVerdict("Suspect", "The engine crashed during start-up (the same crash 3 times).")


@dataclass(frozen=True)
class Case:
    name: str
    given: LadderInput
    rung: Rung | None
    causes: tuple[str, ...] = ()
    waiting: bool = False
    words: tuple[str, ...] = field(default_factory=tuple)


CASES = [
    Case("runs as requested", ladder(), R),
    Case("first decision, nothing ran yet", ladder(current=None), R),
    Case("a refusal moves down at once", ladder(verdict=REFUSED), A, ("Refused",),
         words=("refused the fp8", "falling back to the auto KV cache")),
    Case("a suspect crash moves down and says when it is retried", ladder(verdict=SUSPECT), A,
         ("Suspect",), words=("tries it again after 2026-12-01T13:00:00Z",)),
    Case("no pool can run fp8: down at once (static)",
         ladder({R: nowhere(R), A: ok(A, "t4")}, current=None), A, ("Incompatible",),
         words=("no pool fits",)),
    Case("requested cannot run now: wait within the grace period",
         ladder({R: busy(R), A: ok(A, "l4")}, waiting_since=T0 - timedelta(minutes=2)), R,
         waiting=True, words=("room for 0 of 1",)),
    Case("requested cannot run now, grace over: capacity fallback",
         ladder({R: busy(R), A: ok(A, "l4")}, waiting_since=T0 - timedelta(minutes=6)), A,
         ("Capacity",), words=("grace period (5 min)",)),
    Case("grace over but nothing can run now: keep waiting, no move",
         ladder({R: busy(R), A: busy(A)}, waiting_since=T0 - timedelta(minutes=6)), R,
         waiting=True),
    Case("on a capacity fallback, requested still busy: stay",
         ladder({R: busy(R), A: ok(A, "l4")}, current=A), A),
    Case("on a capacity fallback, requested can run again: back up",
         ladder({R: ok(R), A: ok(A, "l4")}, current=A), R, ("Recovered",),
         words=("can run again",)),
    Case("nothing compatible at all: exhausted",
         ladder({R: nowhere(R), A: nowhere(A, "no pool fits: the model does not fit")},
                current=None), None, ("Incompatible",), words=("No rung",)),
    Case("fallback disabled: the requested rung whatever happens",
         ladder(verdict=REFUSED, enabled=False), R),
    Case("auto is what was requested: nothing below it",
         replace(ladder(verdict=REFUSED), requested_dtype="auto"), None, ("Refused",)),
    Case("awq before auto when the spec says so",
         ladder({R: ok(R), A: ok(A), W: ok(W)}, verdict=REFUSED, rungs=("awq", "auto")), W,
         ("Refused",), words=("AWQ model",)),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_climb(case: Case) -> None:
    position = climb(case.given)
    assert position.rung == case.rung, position.reason
    assert tuple(m.cause for m in position.moves) == case.causes
    assert position.waiting is case.waiting
    text = " ".join([position.reason, *(m.reason for m in position.moves)])
    for word in case.words:
        assert word in text, (word, text)
    for move in position.moves:
        assert move.key == "k1"
        assert move.time == "2026-12-01T12:00:00Z"


def test_a_refusal_binds_its_key_and_pool_only() -> None:
    refused = climb(ladder(verdict=REFUSED)).moves
    # Same key, same pool: stays down, nothing recorded twice.
    again = climb(ladder(history=list(refused), current=A))
    assert (again.rung, again.moves) == (A, ())
    # Another key (the spec changed what the engine decides on): requested again.
    other_key = climb(ladder(history=list(refused), current=None, key="k2"))
    assert (other_key.rung, other_key.moves) == (R, ())
    # Same key, requested placed on another pool (the old one is gone): tried there.
    moved = climb(ladder({R: ok(R, "h200"), A: ok(A, "h200")}, history=list(refused), current=A))
    assert moved.rung == R and [m.cause for m in moved.moves] == ["Recovered"]


def test_a_spec_changed_back_picks_up_where_its_key_was() -> None:
    refused = climb(ladder(verdict=REFUSED)).moves
    back = climb(ladder(history=list(refused), current=None))
    assert (back.rung, back.moves) == (A, ())


def test_a_suspect_rung_is_retried_after_its_back_off_then_given_up() -> None:
    policy = LadderPolicy(max_retries=2)
    history: list[FallbackAttempt] = []
    now = T0
    retries_seen = []
    for round_ in range(4):
        down = climb(replace(ladder(history=history, verdict=SUSPECT, now=now), policy=policy))
        assert down.rung == A, round_
        history += down.moves
        # Before the back-off ends nothing moves.
        early = climb(replace(ladder(history=history, current=A, now=now), policy=policy))
        assert (early.rung, early.moves) == (A, ())
        now += retry_after(policy, round_ + 1) + timedelta(seconds=1)
        up = climb(replace(ladder(history=history, current=A, now=now), policy=policy))
        if up.rung == R:
            assert [m.cause for m in up.moves] == ["Retry"]
            retries_seen.append(now)
            history += up.moves
        else:
            break
    assert len(retries_seen) == 2  # max_retries, then it stays down
    assert "no longer retries" in history[-1].reason


def test_the_back_off_doubles_and_is_capped() -> None:
    policy = LadderPolicy(retry_after=timedelta(hours=1), retry_after_max=timedelta(hours=5))
    assert [retry_after(policy, n) for n in (1, 2, 3, 4)] == [
        timedelta(hours=1),
        timedelta(hours=2),
        timedelta(hours=4),
        timedelta(hours=5),
    ]


def test_a_retry_by_hand_forgets_the_moves_before_it() -> None:
    refused = climb(ladder(verdict=REFUSED)).moves
    retried = climb(
        ladder(history=list(refused), current=A, reset_at=T0 + timedelta(seconds=1),
               now=T0 + timedelta(seconds=1), by_hand=True)
    )  # fmt: skip
    assert retried.rung == R
    assert [m.cause for m in retried.moves] == ["Retry"]
    assert "by hand" in retried.moves[0].reason


def test_exhaustion_is_recorded_once() -> None:
    states = {R: nowhere(R), A: nowhere(A)}
    first = climb(ladder(states, current=None))
    assert [m.to for m in first.moves] == ["none"]
    second = climb(ladder(states, current=None, history=list(first.moves)))
    assert (second.rung, second.moves) == (None, ())


@pytest.mark.parametrize("seed", range(40))
def test_random_evidence_never_reenters_a_refused_rung_and_terminates(seed: int) -> None:
    """Whatever the engines say, each rung is refused at most once and the ladder ends."""
    rng = random.Random(seed)
    rungs = tuple(rng.sample(["auto", "awq"], k=rng.randint(1, 2)))
    states = {R: ok(R), A: ok(A), W: ok(W)}
    history: list[FallbackAttempt] = []
    current: Rung | None = R
    for _ in range(12):
        verdict = REFUSED if rng.random() < 0.5 else None
        position = climb(ladder(states, current=current, history=history, verdict=verdict,
                                rungs=rungs))  # fmt: skip
        history += position.moves
        current = position.rung
        if current is None:
            break
    refused_from = [(m.from_, m.pool) for m in history if m.cause == "Refused"]
    assert len(refused_from) == len(set(refused_from))
    entered = [m.to for m in history if m.to != "none"]
    assert len(entered) == len(set(entered))


def test_a_suspect_crash_that_repeats_under_auto_clears_the_dtype_once() -> None:
    """The real old-wrapper text of a model that cannot be built (hidden_act gelu): under fp8
    it is DtypeSuspect, repeats, and moves the ladder to auto; the same crash under auto
    proves the dtype innocent: back to fp8, recorded once, never a Suspect move again."""
    from pathlib import Path

    from kvq.fallback.classifier import classify_failure
    from kvq.fallback.evidence import FailureEvidence
    from kvq.fallback.ladder import UnexplainedCrash, cleared_crash

    name = "cpu-v0.32.0-tiny-llama-gelu-fp8-config-error.old-wrapper.termination-message.txt"
    text = (Path(__file__).parents[1] / "fixtures" / "vllm" / name).read_text()
    crash = FailureEvidence(pod="p", exit_code=1, termination_message=text)
    under_fp8 = classify_failure(crash, kv_cache_dtype="fp8")
    under_auto = classify_failure(crash, kv_cache_dtype="auto")
    assert (str(under_fp8.kind), str(under_auto.kind)) == ("DtypeSuspect", "Unknown")
    suspect = RuntimeVerdict(
        "Suspect", under_fp8.reason, under_fp8.excerpt, signature=under_fp8.signature
    )
    down = climb(ladder(verdict=suspect))
    assert down.rung == A and down.moves[0].signature == under_fp8.signature

    again = UnexplainedCrash(under_auto.reason, under_auto.signature, under_auto.excerpt)
    later = T0 + timedelta(minutes=3)
    back = climb(replace(ladder(current=A, history=list(down.moves), now=later), unexplained=again))
    assert back.rung == R
    (move,) = back.moves
    assert (move.cause, move.from_, move.to) == ("Cleared", "auto", "requested")
    assert "not the cause" in move.reason and "gelu" in move.reason
    history = [*down.moves, *back.moves]
    assert cleared_crash(history, key="k1", rung=R, signature=under_fp8.signature) == move
    assert cleared_crash(history, key="k2", rung=R, signature=under_fp8.signature) is None

    # Back on fp8 the crash repeats: no Suspect move, no retry loop, nothing recorded twice.
    stay = climb(ladder(current=R, history=history, verdict=suspect, now=later))
    assert (stay.rung, stay.moves) == (R, ())
    # A different crash still counts as before.
    other = replace(suspect, signature="RuntimeError: something else")
    assert climb(ladder(current=R, history=history, verdict=other, now=later)).rung == A
    # Decided again from the stored status (now on fp8): nothing recorded twice.
    twice = climb(replace(ladder(current=R, history=history, now=later), unexplained=again))
    assert (twice.rung, twice.moves) == (R, ())
    # A retry by hand forgets the clearance, like every earlier move.
    assert cleared_crash(history, key="k1", rung=R, signature=under_fp8.signature,
                         reset_at=later + timedelta(seconds=1)) is None  # fmt: skip
