"""What the engine pods of the current rendering say: healthy, failing, and why."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvq.api import keys
from kvq.fallback.classifier import Classification, FailureKind, classify_failure
from kvq.fallback.evidence import evidence_from_pod

# Verdicts made without a single word from the engine: worth its log before acting.
_NEEDS_WORDS = frozenset({FailureKind.DTYPE_SUSPECT, FailureKind.UNKNOWN})


@dataclass(frozen=True)
class PodFindings:
    """The verdict on the current pods: the first failure that decides, if any."""

    failure: Classification | None
    pod: str | None
    need_log_tails: tuple[str, ...] = ()


def current_pods(pods: Sequence[Mapping[str, Any]], pod_hash: str) -> list[Mapping[str, Any]]:
    """Pods of the rendering with this spec hash; older pods are being replaced anyway."""
    return [
        pod
        for pod in pods
        if ((pod.get("metadata") or {}).get("annotations") or {}).get(keys.ANNOTATION_SPEC_HASH)
        == pod_hash
        and not (pod.get("metadata") or {}).get("deletionTimestamp")
    ]


def examine_pods(
    pods: Sequence[Mapping[str, Any]],
    *,
    kv_cache_dtype: str,
    log_tails: Mapping[str, str],
) -> PodFindings:
    """Classify failing pods; a dtype verdict (fallback) outranks any other failure.

    A pod whose termination message is empty (no wrapper output, e.g. the engine was
    OOM-killed mid-line) asks for its previous log's tail before it is judged.
    """
    findings: list[tuple[Classification, str]] = []
    wanted: list[str] = []
    for pod in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("name"))):
        name = str((pod.get("metadata") or {}).get("name"))
        evidence = evidence_from_pod(pod, log_tail=log_tails.get(name))
        if evidence is None:
            continue
        verdict = classify_failure(evidence, kv_cache_dtype=kv_cache_dtype)
        if verdict.kind in _NEEDS_WORDS and not evidence.text and name not in log_tails:
            wanted.append(name)
            continue
        findings.append((verdict, name))
    if wanted and not findings:
        return PodFindings(None, None, tuple(wanted))
    if not findings:
        return PodFindings(None, None)
    classification, failing_pod = min(findings, key=lambda f: not f[0].fallback)
    return PodFindings(classification, failing_pod)
