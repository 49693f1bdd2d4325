"""The quality gate: after a quantized KV cache rolls out, probe the answers (a Job), record
the verdict, and fall back when the spec says a failure should.

A probe that cannot reach the engine, runs out of time or cannot start is Unknown, never a
failure: kvq blames the cache only on answers it has seen. A failure on the `auto` cache
moves nothing (there is nothing left to blame on the cache). Each rendering is probed once
(again every periodHours when asked), and the Job that probed it goes once its verdict is
in status.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from kvq.api import keys
from kvq.api.resource import InferenceService
from kvq.api.status import InferenceServiceStatus, QualityStatus
from kvq.decide.conditions import ConditionUpdate
from kvq.decide.types import Manifest, Snapshot
from kvq.fallback.ladder import RuntimeVerdict, rfc3339
from kvq.render.probe_job import COMPONENT_PROBE, PROBE_CONTAINER, render_probe_job

# What a probe Job's pod may say that is not a verdict (no summary could be read).
_NO_SUMMARY = "the probe left no verdict (its pod ended without a readable summary)"


@dataclass(frozen=True)
class QualityGate:
    status: QualityStatus | None
    condition: ConditionUpdate | None
    verdict: RuntimeVerdict | None = None
    """A ladder move the probe forces (QualityRegression)."""
    newly_recorded: bool = False
    """A verdict is recorded now: write it before the Job that produced it is pruned."""


def read_probe(snap: Snapshot, previous: InferenceServiceStatus) -> QualityGate:
    """The verdict of the probe of what runs now, if its Job has finished."""
    quality = snap.isvc.spec.quality
    if quality is None:
        return QualityGate(None, None)
    stored = previous.quality
    probed = previous.effective.args_hash if previous.effective else None
    dtype = previous.effective.kv_cache_dtype if previous.effective else None
    finished = _finished_probe(snap.pods, probed) if probed else None
    if finished is None:
        return QualityGate(stored, _condition(stored, probed, dtype))
    job, summary = finished
    if stored is not None and stored.job == job:
        return QualityGate(stored, _condition(stored, probed, dtype))  # already on record
    status = _status(summary, probed or "", job, snap.now)
    verdict = None
    if (
        status.verdict == "Fail"
        and quality.on_failure == "fallback"
        and dtype not in (None, "auto")
    ):
        verdict = RuntimeVerdict(
            "QualityRegression",
            f"The quality probe failed: {status.reason}",
            "\n".join(status.checks),
        )
    return QualityGate(status, _condition(status, probed, dtype), verdict, newly_recorded=True)


def probe_job(
    isvc: InferenceService,
    gate: QualityGate,
    *,
    probed_hash: str,
    kv_cache_dtype: str,
    rolled_out: bool,
    image: str,
    now: datetime,
) -> Manifest | None:
    """The Job to run (or keep running) for the rendering `probed_hash`, if one is due."""
    quality = isvc.spec.quality
    if quality is None or kv_cache_dtype == "auto" or not rolled_out:
        return None
    stored = gate.status
    run = 0
    if stored is not None and stored.probed_hash == probed_hash:
        if quality.period_hours is None or stored.time is None:
            return None  # this rendering has its verdict
        since = now - datetime.fromisoformat(stored.time.replace("Z", "+00:00"))
        if since < timedelta(hours=quality.period_hours):
            return None
        run = int(now.timestamp() // (quality.period_hours * 3600))
    return render_probe_job(isvc, image=image, probed_hash=probed_hash, run=run)


def _finished_probe(
    pods: Sequence[Mapping[str, Any]], probed_hash: str
) -> tuple[str, dict[str, Any] | None] | None:
    """(Job name, summary) of a finished probe pod of this rendering; summary None when it
    ended without one."""
    for pod in pods:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if labels.get(keys.LABEL_COMPONENT) != COMPONENT_PROBE:
            continue
        if labels.get(keys.LABEL_PROBED_HASH) != probed_hash[:16]:
            continue
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            if status.get("name") != PROBE_CONTAINER:
                continue
            terminated = (status.get("state") or {}).get("terminated")
            if not terminated:
                continue
            return str(labels.get("job-name", "")), _summary(terminated.get("message") or "")
    return None


def _summary(message: str) -> dict[str, Any] | None:
    try:
        found = json.loads(message)
    except json.JSONDecodeError:
        return None
    return found if isinstance(found, dict) and found.get("kind") == "ProbeReport" else None


def _status(
    summary: dict[str, Any] | None, probed_hash: str, job: str, now: datetime
) -> QualityStatus:
    if summary is None:
        return QualityStatus(
            probed_hash=probed_hash,
            verdict="Unknown",
            reason=_NO_SUMMARY,
            time=rfc3339(now),
            job=job,
        )
    verdict = summary.get("verdict")
    engine = (summary.get("engine") or {}).get("cacheConfig") or {}
    checks = [
        f"{c.get('requirement')}: {_number(c.get('value'))} "
        f"({'pass' if c.get('passed') else 'fail' if c.get('passed') is False else 'unknown'})"
        for c in summary.get("checks") or []
    ]
    scores = {
        str(k): round(float(v), 4)
        for k, v in (summary.get("scores") or {}).items()
        if isinstance(v, int | float)
    }
    return QualityStatus(
        probed_hash=probed_hash,
        kv_cache_dtype=engine.get("cacheDtype"),
        verdict=verdict if verdict in ("Pass", "Fail", "Unknown") else "Unknown",
        reason=str(summary.get("reason") or "")[:1024],
        scores=scores,
        checks=checks,
        time=rfc3339(now),
        job=job,
    )


def _condition(
    status: QualityStatus | None, probed: str | None, dtype: str | None
) -> ConditionUpdate:
    if dtype == "auto" and (status is None or status.probed_hash != probed):
        if status is not None and status.verdict == "Fail":
            # The fallback the failure caused: keep saying why the cache is auto.
            return ConditionUpdate(
                "QualityVerified",
                "False",
                "QualityRegression",
                f"{status.reason} (the service fell back to the auto cache).",
            )
        return ConditionUpdate(
            "QualityVerified",
            "True",
            "NotQuantized",
            "The KV cache is not quantized (auto): the gate has nothing to check.",
        )
    if status is None or status.probed_hash != probed:
        return ConditionUpdate(
            "QualityVerified",
            "Unknown",
            "Pending",
            "The rollout is probed once it is ready (kvq probe in a Job).",
        )
    if status.verdict == "Pass":
        return ConditionUpdate("QualityVerified", "True", "Passed", status.reason or "Passed.")
    if status.verdict == "Fail":
        return ConditionUpdate("QualityVerified", "False", "QualityRegression", status.reason)
    return ConditionUpdate(
        "QualityVerified",
        "Unknown",
        "ProbeUnknown",
        f"{status.reason} (an unanswered probe is never counted as a failure).",
    )


def _number(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, int | float) else "n/a"
