"""What the GPU did against what kvq said: capacity error, failure class, catalog verdict.

Pure. A refusal or crash is classified from the wrapper's termination message alone (and
the exit code), exactly what the operator reads from a pod's status.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvq.fallback import Classification, FailureEvidence, classify_failure

# Issue 21: the plan holds within 1 % of vLLM's KV tokens and concurrency on every family.
TOLERANCE = 0.01


@dataclass(frozen=True)
class CapacityCheck:
    measured_tokens: int
    planned_tokens: int

    @property
    def error(self) -> float:
        """(plan - measured) / measured: positive when the plan promises too much."""
        return (self.planned_tokens - self.measured_tokens) / self.measured_tokens

    @property
    def within_tolerance(self) -> bool:
        return abs(self.error) <= TOLERANCE


def capacity_record(
    measured_tokens: int, measured_concurrency: float | None, plan: dict[str, Any]
) -> dict[str, Any]:
    """vLLM's two figures ("GPU KV cache size: N tokens", "Maximum concurrency for L tokens
    per request: Xx") against the plan's, as a point keeps them."""
    tokens = CapacityCheck(measured_tokens, plan["kv_tokens"])
    record: dict[str, Any] = {
        "measured_kv_tokens": measured_tokens,
        "planned_kv_tokens": tokens.planned_tokens,
        "error": round(tokens.error, 5),
        "measured_concurrency": measured_concurrency,
        "planned_concurrency": plan.get("max_concurrency"),
        "concurrency_error": None,
        "tolerance": TOLERANCE,
    }
    within = tokens.within_tolerance
    if measured_concurrency and plan.get("max_concurrency") is not None:
        error = (plan["max_concurrency"] - measured_concurrency) / measured_concurrency
        record["concurrency_error"] = round(error, 5)
        within = within and abs(error) <= TOLERANCE
    record["within_tolerance"] = within
    return record


def classify(termination_message: str, exit_code: int, kv_cache_dtype: str) -> Classification:
    """kvq's verdict from what a pod's status would hold: exit code + termination message."""
    evidence = FailureEvidence(
        pod="gpu-tier", exit_code=exit_code, termination_message=termination_message
    )
    return classify_failure(evidence, kv_cache_dtype=kv_cache_dtype)


def judge(predicted_runs: bool, served: bool, fallback: bool | None) -> str:
    """Whether the catalog's prediction held, in the words the report uses.

    - served as predicted / refused as predicted (with a class that falls back): agree;
    - the catalog says it runs and it crashed: a catalog bug to fix;
    - the catalog refuses it and it served: the catalog is too strict (a missed capability);
    - refused as predicted but the class would not fall back: the classifier misses it.
    """
    if served:
        return "as predicted" if predicted_runs else "catalog too strict: it serves"
    if predicted_runs:
        return "catalog bug: predicted to run, crashed"
    if fallback:
        return "as predicted (refused, kvq falls back)"
    return "refused as predicted, but the classifier would not fall back"
