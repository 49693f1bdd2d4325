"""The status of an InferenceService the operator cannot read: Ready=False with the reasons.

The CRD stops almost every bad document at `kubectl apply`; what slips through (an older
CRD, a rule only the operator checks) must show up in status and an Event, not crash-loop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from kvq.api.validation import Violation

REASON = "InvalidSpec"
MAX_MESSAGE = 4096


def invalid_status(
    body: Mapping[str, Any], violations: Sequence[Violation], now: datetime
) -> dict[str, Any]:
    """The stored status with its Ready condition replaced by Ready=False/InvalidSpec."""
    status = dict(body.get("status") or {})
    generation = (body.get("metadata") or {}).get("generation")
    message = "; ".join(str(v) for v in violations)[:MAX_MESSAGE]
    stored = list(status.get("conditions") or [])
    conditions = [c for c in stored if c.get("type") != "Ready"]
    previous: dict[str, Any] = next((c for c in stored if c.get("type") == "Ready"), {})
    since = previous.get("lastTransitionTime") if previous.get("status") == "False" else None
    ready = {
        "type": "Ready",
        "status": "False",
        "reason": REASON,
        "message": message,
        "lastTransitionTime": since or now.isoformat().replace("+00:00", "Z"),
        "observedGeneration": generation,
    }
    status["conditions"] = sorted([*conditions, ready], key=lambda c: str(c.get("type")))
    status["observedGeneration"] = generation
    return status
