"""What the engine pods of the current rung say: healthy, failing, and why.

Pods are charged to what they run (ladder key, rung, pool: their template annotations), so
a pod of an older rung or another pool never counts against the current one. Unknown
crashes are tallied across restarts until the same one has repeated enough to act on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvq.api import keys
from kvq.api.status import FailureTally
from kvq.fallback.classifier import Action, Classification, FailureKind, classify_failure
from kvq.fallback.evidence import evidence_from_pod
from kvq.fallback.ladder import Rung
from kvq.fetch.failures import classify_fetch_failure, fetch_failure, fetch_termination_message

# Verdicts made without a single word from the engine: worth its log before acting.
_NEEDS_WORDS = frozenset({FailureKind.DTYPE_SUSPECT, FailureKind.UNKNOWN})
# The tally remembers at most this many terminations (status lives in etcd).
MAX_SEEN = 16


@dataclass(frozen=True)
class EngineFindings:
    """The verdict on the current rung's pods."""

    failure: Classification | None = None
    """The failure that matters most (a dtype refusal outranks everything else)."""
    terminations: tuple[str, ...] = ()
    """Terminations showing that failure (pod@finishedAt), for the tally."""
    unschedulable: str | None = None
    """The scheduler's message when a pod cannot be placed."""
    healthy: bool = False
    """Every current pod is running and ready (and there is at least one)."""
    need_log_tails: tuple[str, ...] = ()


def current_pods(
    pods: Sequence[Mapping[str, Any]], key: str, rung: Rung, pool: str | None
) -> list[Mapping[str, Any]]:
    """Pods running this ladder key's `rung` on `pool`, not being deleted."""
    wanted = {keys.ANNOTATION_LADDER_KEY: key, keys.ANNOTATION_RUNG: rung.value}
    if pool is not None:
        wanted[keys.ANNOTATION_POOL] = pool
    chosen = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        if meta.get("deletionTimestamp"):
            continue
        if all(annotations.get(k) == v for k, v in wanted.items()):
            chosen.append(pod)
    return chosen


def examine_pods(
    pods: Sequence[Mapping[str, Any]],
    *,
    kv_cache_dtype: str,
    log_tails: Mapping[str, str],
) -> EngineFindings:
    """Classify failing pods; the most actionable failure wins.

    A pod whose termination message is empty (no wrapper output, e.g. the engine was
    OOM-killed mid-line) asks for its previous log's tail before it is judged.
    """
    found: list[tuple[Classification, str]] = []
    wanted: list[str] = []
    unschedulable: str | None = None
    healthy = bool(pods)
    for pod in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("name"))):
        name = str((pod.get("metadata") or {}).get("name"))
        # A failed model download comes first: the engine never started (PodInitializing),
        # and no KV-cache dtype is to blame.
        download = fetch_termination_message(pod)
        if download is not None:
            healthy = False
            found.append((_download_failure(download), f"{name}@fetch"))
            continue
        evidence = evidence_from_pod(pod, log_tail=log_tails.get(name))
        if evidence is None:
            healthy = healthy and _ready(pod)
            continue
        healthy = False
        verdict = classify_failure(evidence, kv_cache_dtype=kv_cache_dtype)
        if verdict.kind in _NEEDS_WORDS and not evidence.text and name not in log_tails:
            wanted.append(name)
            continue
        if verdict.kind is FailureKind.UNSCHEDULABLE:
            unschedulable = evidence.unschedulable_message or "no node fits"
        stamp = evidence.finished_at.isoformat() if evidence.finished_at else "?"
        found.append((verdict, f"{name}@{stamp}"))
    if not found:
        return EngineFindings(
            unschedulable=unschedulable, healthy=healthy, need_log_tails=tuple(wanted)
        )
    worst = min(found, key=lambda f: _RANK[f[0].action])[0]
    same = tuple(stamp for verdict, stamp in found if verdict.signature == worst.signature)
    return EngineFindings(worst, same, unschedulable, False, tuple(wanted))


def tally_failures(
    previous: FailureTally | None,
    findings: EngineFindings,
    *,
    key: str,
    rung: Rung,
    pool: str | None,
) -> FailureTally | None:
    """Count unknown crashes of the current rung; any other outcome ends the count."""
    failure = findings.failure
    if failure is None or failure.action is not Action.FALLBACK_AFTER_REPEATS:
        # A healthy rung, or a failure of another kind: the unknown crash did not repeat.
        if findings.healthy or failure is not None:
            return None
        return previous if _same_place(previous, key, rung, pool) else None
    if (
        previous is not None
        and _same_place(previous, key, rung, pool)
        and (previous.signature == failure.signature)
    ):
        new = [t for t in findings.terminations if t not in previous.seen]
        seen = [*previous.seen, *new][-MAX_SEEN:]
        return previous.model_copy(update={"count": previous.count + len(new), "seen": seen})
    return FailureTally(
        key=key,
        rung=rung.value,
        pool=pool,
        signature=failure.signature,
        count=len(findings.terminations),
        seen=list(findings.terminations[-MAX_SEEN:]),
    )


def _download_failure(message: str) -> Classification:
    failure, line = fetch_failure(message)
    _, reason = classify_fetch_failure(message)
    return Classification(
        FailureKind.MODEL_UNAVAILABLE,
        reason[:1].upper() + reason[1:] + ("" if reason.endswith(".") else "."),
        line,
        signature=f"fetch:{failure.kind}",
        transient=failure.transient,
    )


_RANK = {
    Action.FALLBACK: 0,
    Action.FALLBACK_AFTER_REPEATS: 1,
    Action.FIX: 2,
    Action.WAIT: 3,
}


def _same_place(tally: FailureTally | None, key: str, rung: Rung, pool: str | None) -> bool:
    return tally is not None and (tally.key, tally.rung, tally.pool) == (key, rung.value, pool)


def _ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
