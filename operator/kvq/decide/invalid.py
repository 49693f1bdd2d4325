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
    """The stored status with Ready=False and Stalled=True (InvalidSpec), Reconciling=False:
    a person must fix the spec (kstatus reads this as Failed)."""
    status = dict(body.get("status") or {})
    generation = (body.get("metadata") or {}).get("generation")
    message = "; ".join(str(v) for v in violations)[:MAX_MESSAGE]
    stored = list(status.get("conditions") or [])
    replaced = {"Ready": "False", "Stalled": "True", "Reconciling": "False"}
    conditions = [c for c in stored if c.get("type") not in replaced]
    for type_, value in replaced.items():
        previous: dict[str, Any] = next((c for c in stored if c.get("type") == type_), {})
        same = previous.get("status") == value
        conditions.append(
            {
                "type": type_,
                "status": value,
                "reason": REASON if type_ != "Reconciling" else "Stalled",
                "message": message if type_ != "Reconciling" else "The spec must be fixed.",
                "lastTransitionTime": (previous.get("lastTransitionTime") if same else None)
                or now.isoformat().replace("+00:00", "Z"),
                "observedGeneration": generation,
            }
        )
    status["conditions"] = sorted(conditions, key=lambda c: str(c.get("type")))
    status["observedGeneration"] = generation
    return status
