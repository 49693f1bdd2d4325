"""kvq.fallback: classify failure evidence and choose the next rung (pure).

Typical use by the reconcile loop:

    evidence = evidence_from_pod(pod, log_tail=previous_log_tail)
    if evidence is not None:
        verdict = classify_failure(evidence, kv_cache_dtype=rendered_dtype)
        if verdict.fallback:
            decision = next_rung(..., current=rung, because=verdict.reason)
            attempt = record_attempt(decision, current=rung, excerpt=verdict.excerpt, ...)
        # else: Degraded with verdict.kind as the condition reason, verdict.reason as message
"""

from kvq.fallback.classifier import Classification, FailureKind, classify_failure
from kvq.fallback.evidence import FailureEvidence, bound_excerpt, evidence_from_pod
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

__all__ = [
    "Attempt",
    "Classification",
    "FailureEvidence",
    "FailureKind",
    "LadderDecision",
    "Rung",
    "RungOption",
    "bound_excerpt",
    "classify_failure",
    "current_rung",
    "evidence_from_pod",
    "next_rung",
    "record_attempt",
    "start_rung",
]
