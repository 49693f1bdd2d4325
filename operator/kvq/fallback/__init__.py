"""kvq.fallback: classify failure evidence and move the fallback ladder (pure).

Typical use by decide():

    evidence = evidence_from_pod(pod, log_tail=previous_log_tail)
    if evidence is not None:
        verdict = classify_failure(evidence, kv_cache_dtype=rendered_dtype)
        # verdict.action: fallback, fallback-after-repeats, wait or fix
    position = climb(LadderInput(..., verdict=RuntimeVerdict(...)))
    # position.rung runs; position.moves are recorded in status.fallback.attempts
"""

from kvq.fallback.classifier import Action, Classification, FailureKind, classify_failure
from kvq.fallback.evidence import FailureEvidence, bound_excerpt, evidence_from_pod
from kvq.fallback.ladder import (
    LadderInput,
    LadderPolicy,
    LadderPosition,
    Rung,
    RungState,
    RuntimeVerdict,
    climb,
)

__all__ = [
    "Action",
    "Classification",
    "FailureEvidence",
    "FailureKind",
    "LadderInput",
    "LadderPolicy",
    "LadderPosition",
    "Rung",
    "RungState",
    "RuntimeVerdict",
    "bound_excerpt",
    "classify_failure",
    "climb",
    "evidence_from_pod",
]
