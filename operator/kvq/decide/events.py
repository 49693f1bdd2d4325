"""Events for what changed between the stored status and the new one; none at rest."""

from __future__ import annotations

from collections.abc import Sequence

from kvq.api.credentials import redact_text
from kvq.api.status import FallbackAttempt, InferenceServiceStatus
from kvq.decide.types import EventSpec
from kvq.fallback.ladder import NONE

# Event reason per ladder move: down on evidence, down on placement, back up.
_MOVE_REASONS = {
    "Refused": "FallbackRuntime",
    "Suspect": "FallbackRuntime",
    "QualityRegression": "FallbackRuntime",
    "Incompatible": "FallbackStatic",
    "Capacity": "FallbackStatic",
    "Retry": "FallbackRetry",
    "Recovered": "FallbackRecovered",
    "Cleared": "FallbackCleared",
}


def decision_events(
    previous: InferenceServiceStatus,
    status: InferenceServiceStatus,
    moves: Sequence[FallbackAttempt],
) -> tuple[EventSpec, ...]:
    events: list[EventSpec] = []
    for move in moves:
        if move.to == NONE:
            events.append(EventSpec("Warning", "FallbackExhausted", redact_text(move.reason)))
        else:
            reason = redact_text(move.reason)
            if move.cause in ("Retry", "Recovered"):
                events.append(EventSpec("Normal", _MOVE_REASONS[move.cause], reason))
            else:
                events.append(EventSpec("Warning", _MOVE_REASONS[move.cause], reason))
    before = {c.type: c for c in previous.conditions}
    for now in status.conditions:
        old = before.get(now.type)
        if old is not None and (old.status, old.reason) == (now.status, now.reason):
            continue
        message = redact_text(now.message)
        if now.type == "Placed" and now.status == "True":
            events.append(EventSpec("Normal", "Placed", message))
        elif now.type == "CapacityMismatch" and now.status == "True":
            events.append(EventSpec("Warning", "CapacityMismatch", message))
        elif (now.type == "Placed" and now.status == "False" and not moves) or (
            now.type == "Degraded" and now.status == "True" and not moves
        ):
            events.append(EventSpec("Warning", now.reason, message))
        elif now.type == "Ready" and now.status == "True":
            events.append(EventSpec("Normal", "Ready", message))
        elif now.type == "QualityVerified" and now.status == "True":
            events.append(EventSpec("Normal", "QualityPassed", message))
        elif now.type == "QualityVerified" and now.status == "False":
            events.append(EventSpec("Warning", "QualityRegression", message))
        elif now.type == "KnownAccuracyRisk" and now.status == "True":
            events.append(EventSpec("Warning", "KnownAccuracyRisk", message))
    old_ignored = previous.effective.ignored if previous.effective else []
    new_ignored = status.effective.ignored if status.effective else []
    for ignored in new_ignored:
        if ignored not in old_ignored:
            message = f"{ignored.field} is not rendered: {ignored.reason}"
            events.append(EventSpec("Normal", "SettingIgnored", message))
    return tuple(events)
