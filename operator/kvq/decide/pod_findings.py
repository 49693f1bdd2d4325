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
from kvq.render.leaderworkerset import GROUP_INDEX_LABEL, SET_NAME_LABEL, WORKER_INDEX_LABEL
from kvq.render.manifests import CONTAINER_NAME as ENGINE_CONTAINER

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
    source: str = ""
    """The rank and pod of a multi-node group whose evidence is the failure ("worker 1 (pod
    llama-group-0-1)", "leader (pod llama-group-0)"); "" for a single-node replica's pod,
    whose name the evidence already carries."""


def current_pods(
    pods: Sequence[Mapping[str, Any]], key: str, rung: Rung, pool: str | None
) -> list[Mapping[str, Any]]:
    """Pods running this ladder key's `rung` on `pool`, not being deleted; and a pod of a
    multi-node group being deleted after its engine restarted, as that crashed run."""
    wanted = {keys.ANNOTATION_LADDER_KEY: key, keys.ANNOTATION_RUNG: rung.value}
    if pool is not None:
        wanted[keys.ANNOTATION_POOL] = pool
    chosen = []
    for found in pods:
        meta = found.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        pod = _crashed_run(found) if meta.get("deletionTimestamp") else found
        if pod is not None and all(annotations.get(k) == v for k, v in wanted.items()):
            chosen.append(pod)
    return chosen


def _crashed_run(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """A group pod deleted because its engine restarted, seen as the run that crashed.

    LeaderWorkerSet recreates the whole group when any of its pods' containers restarts
    (RecreateGroupOnPodRestart): it deletes the group's pods at once, so the crash's
    evidence is on pods being deleted. Only the previous run (lastState) counts: the run
    the deletion itself stops is no failure. None for any other pod being deleted."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if GROUP_INDEX_LABEL not in labels:
        return None
    status = pod.get("status") or {}
    engines = status.get("containerStatuses") or []
    engine: Mapping[str, Any] = next((c for c in engines if c.get("name") == ENGINE_CONTAINER), {})
    crashed = (engine.get("lastState") or {}).get("terminated")
    if not crashed:
        return None
    run = {**engine, "state": {"terminated": crashed}, "lastState": {}, "ready": False}
    others = [c for c in engines if c.get("name") != ENGINE_CONTAINER]
    return {**pod, "status": {**status, "containerStatuses": [run, *others]}}


def _group_of(pod: Mapping[str, Any]) -> str:
    """The failure unit a pod belongs to: its multi-node group (every rank of it fails
    together, and is recreated together), else the pod itself."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    if GROUP_INDEX_LABEL in labels:
        return f"{labels.get(SET_NAME_LABEL, '')}/{labels[GROUP_INDEX_LABEL]}"
    return str(meta.get("name"))


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
    found: list[_Found] = []
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
            found.append(_Found(_download_failure(download), _group_of(pod), "fetch", _rank(pod)))
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
        found.append(_Found(verdict, _group_of(pod), stamp, _rank(pod)))
    if not found:
        return EngineFindings(
            unschedulable=unschedulable, healthy=healthy, need_log_tails=tuple(wanted)
        )
    groups = _per_group(found)
    worst = min(groups, key=lambda f: _RANK[f.verdict.action])
    same = tuple(f.stamp for f in groups if f.verdict.signature == worst.verdict.signature)
    return EngineFindings(worst.verdict, same, unschedulable, False, tuple(wanted), worst.source)


@dataclass(frozen=True)
class _Found:
    """One pod's verdict: its failure unit, its termination's time and its rank."""

    verdict: Classification
    unit: str
    stamp: str
    source: str


def _per_group(found: Sequence[_Found]) -> list[_Found]:
    """One verdict and one termination per failure unit: a group's ranks fail together (a
    worker's refusal takes the leader down with a lost connection), so the group's most
    actionable verdict speaks for it (with the rank that gave it), and its failure counts
    once, at its first termination (`group@finishedAt`; a single pod's is `pod@finishedAt`)."""
    units: dict[str, list[_Found]] = {}
    for one in found:
        units.setdefault(one.unit, []).append(one)
    out = []
    for unit, seen in units.items():
        speaks = min(seen, key=lambda f: _RANK[f.verdict.action])
        first = min(f.stamp for f in seen)
        out.append(_Found(speaks.verdict, unit, f"{unit}@{first}", speaks.source))
    return out


def _rank(pod: Mapping[str, Any]) -> str:
    """`worker 1 (pod NAME)` or `leader (pod NAME)` for a pod of a multi-node group (LWS's
    worker-index label: 0 is the leader); "" for any other pod."""
    meta = pod.get("metadata") or {}
    index = (meta.get("labels") or {}).get(WORKER_INDEX_LABEL)
    if index is None:
        return ""
    rank = "leader" if str(index) == "0" else f"worker {index}"
    return f"{rank} (pod {meta.get('name')})"


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
