"""The fallback history in status <-> the ladder's attempts."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from kvq.api.status import FallbackAttempt
from kvq.fallback.ladder import Attempt, Rung

# Status lives in etcd: keep the newest attempts only (a few generations' worth).
MAX_ATTEMPTS = 20
NONE = "none"


def to_ladder(attempts: Sequence[FallbackAttempt]) -> list[Attempt]:
    return [
        Attempt(
            from_rung=Rung(a.from_),
            to_rung=None if a.to == NONE else Rung(a.to),
            reason=a.reason,
            excerpt=a.evidence,
            at=datetime.fromisoformat(a.time),
            generation=a.generation,
        )
        for a in attempts
    ]


def to_status(attempt: Attempt, *, static: bool) -> FallbackAttempt:
    return FallbackAttempt.model_validate(
        {
            "from": attempt.from_rung.value,
            "to": attempt.to_rung.value if attempt.to_rung else NONE,
            "reason": attempt.reason,
            "evidence": attempt.excerpt,
            "time": rfc3339(attempt.at),
            "generation": attempt.generation,
            "static": static,
        }
    )


def rfc3339(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
