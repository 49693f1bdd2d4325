"""`kvq diagnose`: the classifier's verdict on a pasted crash, in words a person acts on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvq.fallback.classifier import Action, Classification
from kvq.fallback.evidence import FailureEvidence
from kvq.fallback.ladder import LadderPolicy

# A pasted log stands for a container that exited with an error.
_PASTED_EXIT_CODE = 1


@dataclass(frozen=True)
class Diagnosis:
    family: str
    decision: str
    """fallback, fallback-after-repeats, wait or fix."""
    what_kvq_does: str
    reason: str
    remedy: str
    evidence: str

    def to_json(self) -> dict[str, Any]:
        return {
            "family": self.family,
            "decision": self.decision,
            "whatKvqDoes": self.what_kvq_does,
            "reason": self.reason,
            "remedy": self.remedy,
            "evidence": self.evidence,
        }


def diagnose_text(
    text: str,
    *,
    kv_cache_dtype: str,
    classify: Callable[..., Classification],
    policy: LadderPolicy | None = None,
) -> Diagnosis:
    """Classify `text` (a termination message or a whole engine log) as kvq would."""
    policy = policy or LadderPolicy()
    evidence = FailureEvidence(
        pod="(pasted)", termination_message=text, exit_code=_PASTED_EXIT_CODE, restart_count=1
    )
    verdict = classify(evidence, kv_cache_dtype=kv_cache_dtype)
    return Diagnosis(
        family=str(verdict.kind),
        decision=str(verdict.action),
        what_kvq_does=_what_kvq_does(verdict, kv_cache_dtype, policy),
        reason=verdict.reason,
        remedy=verdict.remedy,
        evidence=verdict.excerpt,
    )


def _what_kvq_does(verdict: Classification, dtype: str, policy: LadderPolicy) -> str:
    hours = policy.retry_after.total_seconds() / 3600
    match verdict.action:
        case Action.FALLBACK:
            return (
                f"falls back from the {dtype} KV cache to the next rung of spec.fallback now, "
                "and never retries it for this spec"
            )
        case Action.FALLBACK_AFTER_REPEATS:
            return (
                f"keeps the {dtype} KV cache until the same crash has happened "
                f"{policy.suspect_repeats} times, then falls back and tries {dtype} again "
                f"after {hours:g} h"
            )
        case Action.WAIT:
            return "changes nothing: the kubelet or the scheduler retries on its own"
    return (
        "changes nothing: another KV-cache dtype cannot fix this; "
        "the service is Degraded and Stalled until someone acts"
    )
