"""The fallback ladder: which rung to run next when the current one cannot run.

Rungs: `requested` (the spec's model and KV dtype), `auto` (same model, unquantized
KV cache) and `awq` (the spec's AWQ model, auto KV cache). The ladder is bounded per
spec generation: a rung is entered at most once, a failed rung is never re-entered,
and a new generation (a spec change) starts afresh because attempts of other
generations are ignored. Every move is an `Attempt` the caller stores in status.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from kvq.fallback.evidence import bound_excerpt


class Rung(StrEnum):
    REQUESTED = "requested"
    AUTO = "auto"
    AWQ = "awq"


@dataclass(frozen=True)
class Attempt:
    """One move on the ladder; `to_rung` is None when nothing was left to move to."""

    from_rung: Rung
    to_rung: Rung | None
    reason: str
    excerpt: str
    at: datetime
    generation: int
    static: bool = False
    """Decided before deploying, from the static verdicts, not from a failed pod."""


@dataclass(frozen=True)
class RungOption:
    """The caller's verdict on a rung: can it run at all, and does it keep the capacity?

    `keeps_capacity`: the planner says this rung still reaches
    `spec.capacity.minConcurrentSequences` at `maxModelLen` on the chosen pool.
    """

    rung: Rung
    keeps_capacity: bool
    available: bool = True
    why_unavailable: str | None = None
    capacity_required: bool = True
    """False when the spec asks for no concurrency: then there is nothing to keep."""


@dataclass(frozen=True)
class LadderDecision:
    next: Rung | None
    reason: str
    exhausted: bool


def next_rung(
    *,
    requested_dtype: str,
    current: Rung | str,
    rungs: Sequence[str],
    enabled: bool,
    attempts: Sequence[Attempt],
    generation: int,
    options: Mapping[str, RungOption],
    because: str | None = None,
) -> LadderDecision:
    """Choose the rung to run after `current` failed, or say why there is none.

    `rungs` are the spec's fallback rungs in its order. Among the rungs not yet tried
    in this generation and available, one that keeps capacity wins; ties keep spec
    order. `because` (the failure or static verdict) starts the reason.
    """
    current = Rung(current)
    failed = f"{_capital(_label(current, requested_dtype))} cannot run" + (
        f": {_sentence_part(because)}" if because else ""
    )
    if not enabled:
        return LadderDecision(
            None,
            f"{_clause(failed)}; fallback is disabled for this service, so kvq does not "
            "change the KV cache or the model.",
            exhausted=False,
        )

    tried = tried_rungs(current, attempts, generation)
    skipped: list[str] = []
    candidates: list[RungOption] = []
    for name in dict.fromkeys(rungs):
        rung = _known_rung(name)
        if rung is None or rung is Rung.REQUESTED:
            skipped.append(f"{name} is not a fallback rung")
        elif rung in tried:
            continue
        elif rung is Rung.AUTO and requested_dtype == "auto":
            skipped.append("auto is what was requested")
        elif (option := options.get(rung.value)) is None:
            skipped.append(f"{rung} has no verdict from the planner")
        elif not option.available:
            skipped.append(f"{rung} is unavailable ({option.why_unavailable or 'no reason given'})")
        else:
            candidates.append(option)

    if not candidates:
        tried_text = ", ".join(_label(rung, requested_dtype) for rung in tried)
        skipped_text = f"; skipped: {'; '.join(skipped)}" if skipped else ""
        return LadderDecision(
            None,
            f"{_clause(failed)}; no fallback rung is left (tried in generation "
            f"{generation}: {tried_text}{skipped_text}).",
            exhausted=True,
        )

    # Stable: the first rung that keeps capacity, else the first in spec order.
    chosen = next((option for option in candidates if option.keeps_capacity), candidates[0])
    capacity = ""
    if chosen.capacity_required:
        capacity = (
            " (it keeps the requested concurrency)"
            if chosen.keeps_capacity
            else " (no available rung keeps the requested concurrency)"
        )
    return LadderDecision(
        chosen.rung,
        f"{_clause(failed)}; falling back to {_label(chosen.rung, requested_dtype)}{capacity}.",
        exhausted=False,
    )


def start_rung(
    *,
    requested_dtype: str,
    requested: RungOption,
    rungs: Sequence[str],
    enabled: bool,
    attempts: Sequence[Attempt],
    generation: int,
    options: Mapping[str, RungOption],
) -> LadderDecision:
    """The rung to deploy, given the static verdicts, before any pod has run.

    Idempotent for a level-triggered reconcile: once this generation has attempts,
    the ladder has already moved and the answer is where it stands.
    """
    position = current_rung(attempts, generation)
    if position is None:
        last = [attempt for attempt in attempts if attempt.generation == generation][-1]
        return LadderDecision(None, last.reason, exhausted=True)
    if position is not Rung.REQUESTED:
        label = _label(position, requested_dtype)
        return LadderDecision(position, f"Staying on {label}.", exhausted=False)
    if requested.available:
        label = _label(Rung.REQUESTED, requested_dtype)
        return LadderDecision(Rung.REQUESTED, f"{_capital(label)} can run.", exhausted=False)
    return next_rung(
        requested_dtype=requested_dtype,
        current=Rung.REQUESTED,
        rungs=rungs,
        enabled=enabled,
        attempts=attempts,
        generation=generation,
        options=options,
        because=requested.why_unavailable,
    )


def current_rung(attempts: Sequence[Attempt], generation: int) -> Rung | None:
    """Where the ladder stands in `generation`: None once it ran out of rungs."""
    mine = [attempt for attempt in attempts if attempt.generation == generation]
    return mine[-1].to_rung if mine else Rung.REQUESTED


def tried_rungs(current: Rung, attempts: Sequence[Attempt], generation: int) -> list[Rung]:
    """Rungs entered in `generation`, in order; `requested` always counts as tried."""
    seen: dict[Rung, None] = {Rung.REQUESTED: None}
    for attempt in attempts:
        if attempt.generation != generation:
            continue
        seen[attempt.from_rung] = None
        if attempt.to_rung is not None:
            seen[attempt.to_rung] = None
    seen[current] = None
    return list(seen)


def record_attempt(
    decision: LadderDecision,
    *,
    current: Rung | str,
    excerpt: str,
    at: datetime,
    generation: int,
    static: bool = False,
) -> Attempt:
    """The status record of a ladder move, with the evidence bounded to 1 KiB."""
    return Attempt(
        from_rung=Rung(current),
        to_rung=decision.next,
        reason=decision.reason,
        excerpt=bound_excerpt(excerpt),
        at=at,
        generation=generation,
        static=static,
    )


def _label(rung: Rung, requested_dtype: str) -> str:
    if rung is Rung.REQUESTED:
        return f"the requested {requested_dtype} KV cache"
    if rung is Rung.AUTO:
        return "the auto KV cache"
    return "the AWQ model with the auto KV cache"


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]


def _sentence_part(text: str) -> str:
    """A sentence continued after a colon: "The engine ..." -> "the engine ..."."""
    if text[:1].isupper() and text[1:2].islower():
        text = text[0].lower() + text[1:]
    return _clause(text)


def _clause(text: str) -> str:
    return text.rstrip(" .")


def _known_rung(name: str) -> Rung | None:
    try:
        return Rung(name)
    except ValueError:
        return None
