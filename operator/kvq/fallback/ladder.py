"""The fallback ladder: which rung runs, moving down on evidence and back up when it can.

Rungs, in order: `requested` (the spec's model and KV dtype), then the spec's fallback
rungs, `auto` (same model, unquantized KV cache) and `awq` (the AWQ model, auto KV cache).
One function, `climb`, makes every move, static or runtime:

- down on evidence: the engine refused the dtype (`Refused`, binding for the ladder key and
  pool), or an unknown crash repeated (`Suspect`, tried again after a back-off that doubles,
  a bounded number of times);
- down when no pool can run a rung at all (`Incompatible`), or cannot run it now and the
  grace period has passed (`Capacity`);
- back up when a higher rung can run again (`Recovered`) or a suspect rung's back-off is
  over (`Retry`);
- back up when the crash that caused a `Suspect` move happens again on the rung it fell
  back to (`Cleared`): the same crash under `auto` proves the dtype was not its cause, so
  the ladder returns to the dtype it left, and that crash (its signature, kept in the
  attempt) never moves the ladder again for the key: no retry loop, and the service stays
  `Degraded` (DtypeCleared) until a person fixes the cause.

Moves are keyed to the ladder key (what decides whether the engine accepts the dtype), not
to the spec's generation: replicas, labels and annotations never reset the ladder. Every
move is a FallbackAttempt the caller stores in status, so the same inputs decided twice
give the same rung, and nothing is recorded twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from kvq.api import keys
from kvq.api.status import FallbackAttempt, FallbackCause
from kvq.fallback.evidence import bound_excerpt

NONE = "none"


class Rung(StrEnum):
    REQUESTED = "requested"
    AUTO = "auto"
    AWQ = "awq"


@dataclass(frozen=True)
class RungState:
    """What placement says about one rung right now."""

    rung: Rung
    pool: str | None
    """The pool the rung would run on; None when no pool is compatible."""
    compatible: bool
    """Some pool can run the rung at all (engine, GPU, model size, taints, selectors)."""
    runnable: bool
    """...and can run it now (ready nodes, free GPUs, replicas schedulable)."""
    why: str = ""
    """Why it cannot run (at all, or now)."""


@dataclass(frozen=True)
class LadderPolicy:
    """How patient the ladder is (operator settings: `kvq run` flags, chart values)."""

    suspect_repeats: int = 3
    """Unknown crashes with the same signature before a Suspect move."""
    retry_after: timedelta = timedelta(hours=1)
    """First back-off before a suspect rung is tried again; doubles each time."""
    retry_after_max: timedelta = timedelta(hours=24)
    """The back-off never grows beyond this."""
    max_retries: int = 3
    """Suspect moves of one rung before it is given up for the ladder key."""
    grace: timedelta = timedelta(minutes=5)
    """How long a rung that cannot run *now* is waited for before moving."""


@dataclass(frozen=True)
class RuntimeVerdict:
    """The current rung's engines, judged: a move down the ladder, if the evidence says so."""

    cause: FallbackCause
    """Refused or Suspect (QualityRegression from the quality gate)."""
    reason: str
    evidence: str = ""
    signature: str = ""
    """Suspect: the crash's signature (normalised root-cause line)."""
    source: str = ""
    """The rank and pod of a multi-node group whose evidence it is ("worker 1 (pod
    NAME)"); "" for a single-node replica."""


@dataclass(frozen=True)
class UnexplainedCrash:
    """A crash of the current rung's engines that names no known cause and moves nothing by
    itself (under auto, a crash kvq does not recognise)."""

    reason: str
    signature: str
    evidence: str = ""


@dataclass(frozen=True)
class LadderInput:
    requested_dtype: str
    rungs: Sequence[str]
    """spec.fallback.rungs, in the spec's order."""
    enabled: bool
    key: str
    generation: int
    now: datetime
    states: Mapping[Rung, RungState]
    history: Sequence[FallbackAttempt]
    """Every stored attempt (any key), oldest first."""
    current: Rung | None
    """Where the ladder stood for this key (None: first decision for it)."""
    waiting_since: datetime | None = None
    """Since when the service waits for a rung that cannot run now (Placed=False)."""
    reset_at: datetime | None = None
    """Attempts before this moment do not bind (a retry by hand)."""
    verdict: RuntimeVerdict | None = None
    """Evidence against the current rung, from its engines."""
    policy: LadderPolicy = field(default_factory=LadderPolicy)
    by_hand: bool = False
    """A person asked to try the requested dtype again (`reset_at` is now)."""
    unexplained: UnexplainedCrash | None = None
    """An unknown crash of the current rung: if it is the crash a Suspect move fell back
    from, the dtype was not the cause (a `Cleared` move back)."""


@dataclass(frozen=True)
class LadderPosition:
    rung: Rung | None
    """The rung to run; None when no rung is left (exhausted)."""
    moves: tuple[FallbackAttempt, ...]
    """Attempts to record now (empty when nothing moved)."""
    waiting: bool = False
    """The rung cannot run now and kvq waits (grace period, or nowhere better to go)."""
    reason: str = ""
    """One sentence: why this rung."""


def ladder_order(
    requested_dtype: str, rungs: Sequence[str], states: Mapping[Rung, object]
) -> list[Rung]:
    """`requested`, then the spec's fallback rungs that mean something for this spec."""
    order = [Rung.REQUESTED]
    for name in dict.fromkeys(rungs):
        rung = Rung(name)
        if rung is Rung.AUTO and requested_dtype == "auto":
            continue  # auto is what was requested
        if rung in states and rung not in order:
            order.append(rung)
    return order


def climb(inp: LadderInput) -> LadderPosition:
    """The rung to run now, and the moves that got there."""
    order = ladder_order(inp.requested_dtype, inp.rungs, inp.states)
    if not inp.enabled:
        return LadderPosition(Rung.REQUESTED, (), reason="Fallback is disabled for this service.")
    binding = _binding(inp)
    # Where the ladder stood for this key: the status says, or the key's last move does
    # (a spec changed back to an earlier key picks up where that key was).
    current = inp.current or next((Rung(a.to) for a in reversed(binding) if a.to != NONE), None)
    runtime = None
    if inp.verdict is not None and current is not None:
        runtime = _runtime_move(inp, current, inp.verdict, binding)
    elif inp.unexplained is not None and current is not None:
        runtime = _cleared_move(inp, current, inp.unexplained, binding)
    considered = [*binding, *([runtime] if runtime else [])]
    blocked = {rung: a for rung in order if (a := _blocking(inp, rung, considered))}

    def eligible(rung: Rung) -> bool:
        return rung not in blocked and inp.states[rung].compatible

    target = next((r for r in order if eligible(r)), None)
    if target is None:
        return _exhausted(inp, order, current, blocked, runtime, considered)
    best = next((r for r in order if eligible(r) and inp.states[r].runnable), None)
    here = current if current is not None and eligible(current) else None
    waiting = False
    if best == target:
        position = target
    elif here is not None and best == here:
        position = here  # a capacity fallback in force; revisited when `target` can run
    elif best is not None and here is not None and order.index(best) < order.index(here):
        position = best  # a higher rung can run again
    else:
        anchor = here or target
        expired = inp.waiting_since is not None and inp.now - inp.waiting_since >= inp.policy.grace
        if best is not None and expired:
            position = best
        else:
            position, waiting = anchor, True
    moves = _moves(inp, order, current, position, blocked, runtime)
    return LadderPosition(position, tuple(moves), waiting, _why(inp, position, waiting))


def label(rung: Rung, requested_dtype: str) -> str:
    if rung is Rung.REQUESTED:
        return f"the requested {requested_dtype} KV cache"
    if rung is Rung.AUTO:
        return "the auto KV cache"
    return "the AWQ model with the auto KV cache"


def cleared_crash(
    history: Sequence[FallbackAttempt],
    *,
    key: str,
    rung: Rung,
    signature: str,
    reset_at: datetime | None = None,
) -> FallbackAttempt | None:
    """The `Cleared` move that proved a crash with `signature` on `rung` is not the dtype's
    (None: that crash still counts toward a Suspect fallback)."""
    for attempt in reversed(history):
        binds = attempt.key == key and (reset_at is None or _when(attempt.time) >= reset_at)
        if (
            binds
            and attempt.cause == "Cleared"
            and attempt.signature == signature
            and _cleared_rung(attempt) == rung.value
        ):
            return attempt
    return None


def retry_after(policy: LadderPolicy, suspect_moves: int) -> timedelta:
    """The back-off before the `suspect_moves`-th retry (1-based), doubling, capped."""
    backoff: timedelta = policy.retry_after * (2 ** max(suspect_moves - 1, 0))
    return min(backoff, policy.retry_after_max)


def _binding(inp: LadderInput) -> list[FallbackAttempt]:
    """Stored attempts that bind this key (after any retry by hand)."""
    return [
        a
        for a in inp.history
        if a.key == inp.key and (inp.reset_at is None or _when(a.time) >= inp.reset_at)
    ]


def _blocking(
    inp: LadderInput, rung: Rung, considered: Sequence[FallbackAttempt]
) -> FallbackAttempt | None:
    """The attempt whose evidence keeps `rung` down now on its pool, if any."""
    pool = inp.states[rung].pool
    against = [a for a in considered if a.from_ == rung.value and a.pool == pool]
    refused = [a for a in against if a.cause in ("Refused", "QualityRegression")]
    if refused:
        return refused[-1]
    # A Suspect move whose crash was cleared (seen again under auto) binds nothing.
    cleared = {(_cleared_rung(a), a.signature) for a in considered if a.cause == "Cleared"}
    suspects = [
        a for a in against if a.cause == "Suspect" and (a.from_, a.signature) not in cleared
    ]
    if not suspects:
        return None
    last = suspects[-1]
    if len(suspects) > inp.policy.max_retries:
        return last
    if last.retry_after is not None and inp.now < _when(last.retry_after):
        return last
    return None


def _runtime_move(
    inp: LadderInput,
    current: Rung,
    verdict: RuntimeVerdict,
    binding: Sequence[FallbackAttempt],
) -> FallbackAttempt | None:
    """The move the engines' evidence forces; its destination is filled in by `_moves`."""
    if verdict.cause == "Suspect" and any(
        a.cause == "Cleared"
        and a.signature == verdict.signature
        and _cleared_rung(a) == current.value
        for a in binding
    ):
        return None  # this crash was proven not the dtype's: it never moves the ladder
    pool = inp.states[current].pool
    earlier = [
        a for a in binding if a.from_ == current.value and a.cause == "Suspect" and a.pool == pool
    ]
    due = None
    if verdict.cause == "Suspect":
        if len(earlier) + 1 > inp.policy.max_retries:
            note = f" It crashed like this {len(earlier) + 1} times; kvq no longer retries it."
        else:
            due = inp.now + retry_after(inp.policy, len(earlier) + 1)
            note = f" kvq tries it again after {rfc3339(due)}."
        reason = f"{verdict.reason.rstrip(' .')}.{note}"
    else:
        reason = verdict.reason
    text = f"{_cap(label(current, inp.requested_dtype))} cannot run: {_lower(reason)}"
    return _attempt(
        inp,
        current,
        None,
        verdict.cause,
        text,
        evidence=verdict.evidence,
        due=due,
        signature=verdict.signature if verdict.cause == "Suspect" else None,
        evidence_from=verdict.source or None,
    )


def _cleared_move(
    inp: LadderInput,
    current: Rung,
    crash: UnexplainedCrash,
    binding: Sequence[FallbackAttempt],
) -> FallbackAttempt | None:
    """Back from a Suspect fallback whose crash happened again here, once."""
    fled = next(
        (
            a
            for a in reversed(binding)
            if a.cause == "Suspect" and a.to == current.value and a.signature == crash.signature
        ),
        None,
    )
    if fled is None or any(
        a.cause == "Cleared" and a.signature == crash.signature and _cleared_rung(a) == fled.from_
        for a in binding
    ):
        return None
    back = Rung(fled.from_)
    reason = (
        f"{_cap(label(current, inp.requested_dtype))} crashed the same way as "
        f"{label(back, inp.requested_dtype)} did ({_lower(crash.reason).rstrip(' .')}), "
        "so the KV-cache dtype is not the cause"
    )
    return _attempt(
        inp, current, back, "Cleared", reason, evidence=crash.evidence, signature=crash.signature
    )


def _cleared_rung(attempt: FallbackAttempt) -> str:
    """The rung a Cleared move cleared: where it went back to (it is recorded only then)."""
    return attempt.to


def _moves(
    inp: LadderInput,
    order: Sequence[Rung],
    current: Rung | None,
    position: Rung,
    blocked: Mapping[Rung, FallbackAttempt],
    runtime: FallbackAttempt | None,
) -> list[FallbackAttempt]:
    """The move from where the ladder stood to `position`, recorded once."""
    start = current or Rung.REQUESTED
    if runtime is not None and runtime.cause == "Cleared":
        if position.value != runtime.to:
            return []  # the cleared rung cannot run now: recorded once it can
        reason = (
            f"{runtime.reason.rstrip(' .')}; back to {label(position, inp.requested_dtype)}, "
            "and this crash never moves the ladder again."
        )
        return [runtime.model_copy(update={"to": position.value, "reason": reason})]
    if runtime is not None:
        return [_destined(inp, runtime, position)]
    if position == start:
        return []
    if order.index(position) < order.index(start):
        was_suspect = position in blocked or any(
            a.cause == "Suspect" and a.from_ == position.value for a in _binding(inp)
        )
        what = _cap(label(position, inp.requested_dtype))
        if inp.by_hand:
            reason = (
                f"Retry requested by hand ({keys.ANNOTATION_RETRY}): {_lower(what)} is tried again."
            )
            return [_attempt(inp, start, position, "Retry", reason)]
        if was_suspect:
            return [
                _attempt(
                    inp, start, position, "Retry", f"{what} is tried again after its back-off."
                )
            ]
        return [_attempt(inp, start, position, "Recovered", f"{what} can run again.")]
    state = inp.states[start]
    cause: FallbackCause
    if start in blocked:
        cause, why = blocked[start].cause, blocked[start].reason
    elif not state.compatible:
        cause, why = "Incompatible", state.why or "no pool can run it"
    else:
        cause = "Capacity"
        why = (
            f"{(state.why or 'no pool can run it now').rstrip('. ')} for longer than the grace "
            f"period ({_duration(inp.policy.grace)})"
        )
    what = label(start, inp.requested_dtype)
    reason = f"{_cap(what)} cannot run: {_lower(why).rstrip('. ')}"
    return [_destined(inp, _attempt(inp, start, None, cause, reason), position)]


def _exhausted(
    inp: LadderInput,
    order: Sequence[Rung],
    current: Rung | None,
    blocked: Mapping[Rung, FallbackAttempt],
    runtime: FallbackAttempt | None,
    considered: Sequence[FallbackAttempt],
) -> LadderPosition:
    parts = []
    for rung in order:
        why = blocked[rung].reason if rung in blocked else inp.states[rung].why
        parts.append(
            f"{label(rung, inp.requested_dtype)}: {_lower(why or 'it cannot run').rstrip('. ')}"
        )
    reason = "No rung of the fallback ladder can run (" + "; ".join(parts) + ")."
    if runtime is not None and runtime.cause != "Cleared":
        return LadderPosition(None, (_destined(inp, runtime, None),), reason=reason)
    if considered and considered[-1].to == NONE:
        return LadderPosition(None, (), reason=reason)  # already recorded
    start = current or Rung.REQUESTED
    cause: FallbackCause = "Incompatible" if not inp.states[start].compatible else "Capacity"
    return LadderPosition(None, (_attempt(inp, start, None, cause, reason),), reason=reason)


def _why(inp: LadderInput, position: Rung, waiting: bool) -> str:
    text = _cap(label(position, inp.requested_dtype))
    if waiting:
        why = inp.states[position].why or "it cannot run now"
        return f"{text} cannot run now ({_lower(why).rstrip('.')}); waiting for it."
    return f"{text} runs."


def _attempt(
    inp: LadderInput,
    from_rung: Rung,
    to_rung: Rung | None,
    cause: FallbackCause,
    reason: str,
    *,
    evidence: str = "",
    due: datetime | None = None,
    signature: str | None = None,
    evidence_from: str | None = None,
) -> FallbackAttempt:
    return FallbackAttempt.model_validate(
        {
            "from": from_rung.value,
            "to": to_rung.value if to_rung else NONE,
            "cause": cause,
            "reason": reason,
            "evidence": bound_excerpt(evidence),
            "time": rfc3339(inp.now),
            "generation": inp.generation,
            "key": inp.key,
            "pool": inp.states[from_rung].pool,
            "retryAfter": rfc3339(due) if due else None,
            "signature": signature,
            "evidenceFrom": evidence_from,
        }
    )


def _destined(inp: LadderInput, attempt: FallbackAttempt, to_rung: Rung | None) -> FallbackAttempt:
    """`attempt` moving to `to_rung`, its reason ending with where it went."""
    reason = attempt.reason.rstrip(" .")
    if to_rung is None:
        reason = f"{reason}; no fallback rung is left."
    else:
        reason = f"{reason}; falling back to {label(to_rung, inp.requested_dtype)}."
    return attempt.model_copy(update={"to": to_rung.value if to_rung else NONE, "reason": reason})


def rfc3339(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _when(value: str | None) -> datetime:
    assert value is not None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _duration(span: timedelta) -> str:
    seconds = int(span.total_seconds())
    if seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    if seconds % 60 == 0:
        return f"{seconds // 60} min"
    return f"{seconds} s"


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _lower(text: str) -> str:
    """A sentence continued after a colon: "The engine ..." -> "the engine ..."."""
    if text[:1].isupper() and text[1:2].islower():
        return text[0].lower() + text[1:]
    return text
