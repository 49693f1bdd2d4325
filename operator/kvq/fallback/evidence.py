"""Failure evidence read from a Pod object as the API server returns it.

Pure: the caller fetches the Pod (and, if it wants, a bounded tail of the previous
container's log) and passes plain dicts in; nothing here talks to the cluster.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

# Waiting reasons that are part of a normal start, not a failure.
_STARTING_REASONS = frozenset({"ContainerCreating", "PodInitializing"})

# Status excerpts stay small: attempts live in the object's status, which etcd stores.
EXCERPT_LIMIT_BYTES = 1024


@dataclass(frozen=True)
class FailureEvidence:
    """What a failing engine pod shows, flattened from its status.

    `termination_message` is the `message` of the engine container's last
    termination: what our failure-evidence wrapper wrote to /dev/termination-log or,
    with FallbackToLogsOnError, the kubelet's tail of the log. `log_tail` is an
    optional bounded tail of the previous container's log fetched by the caller.
    """

    pod: str
    phase: str | None = None
    pod_reason: str | None = None
    pod_message: str = ""
    unschedulable_message: str | None = None
    waiting_reason: str | None = None
    waiting_message: str = ""
    terminated_reason: str | None = None
    exit_code: int | None = None
    termination_message: str = ""
    started_at: datetime | None = None
    finished_at: datetime | None = None
    restart_count: int = 0
    ready: bool = False
    was_ready: bool = False
    log_tail: str = ""

    @property
    def unschedulable(self) -> bool:
        return self.unschedulable_message is not None

    @property
    def crashed(self) -> bool:
        """The engine process ended (or keeps ending) on its own."""
        return self.exit_code is not None or self.waiting_reason == "CrashLoopBackOff"

    @property
    def text(self) -> str:
        """Every piece of free text, most specific first."""
        parts = (self.termination_message, self.log_tail, self.waiting_message, self.pod_message)
        return "\n".join(part for part in parts if part)


def evidence_from_pod(
    pod: Mapping[str, Any],
    *,
    container: str = "vllm",
    log_tail: str | None = None,
) -> FailureEvidence | None:
    """Collect the failure evidence of `pod`'s engine container, or None if it is not failing.

    Not failing means: still being created or started, or running and ready now.

    Crash after ready: the failed run was ready if the moment the pod last turned Ready
    (its Ready condition's lastTransitionTime, while True) falls inside that run, i.e.
    `startedAt <= t <= finishedAt` of the termination. `containerStatuses[].started` is
    not used: it describes only the current run, never the run that ended. The wrapper's
    own note ("the engine had started serving") covers runs this rule cannot see.
    """
    metadata = _mapping(pod.get("metadata"))
    status = _mapping(pod.get("status"))
    name = str(metadata.get("name", ""))
    unschedulable = _unschedulable_message(status)
    engine = _container_status(status, container)

    state = _mapping(engine.get("state"))
    waiting = _mapping(state.get("waiting"))
    running = state.get("running")
    terminated = _mapping(state.get("terminated")) or _mapping(
        _mapping(engine.get("lastState")).get("terminated")
    )
    ready = bool(engine.get("ready", False))
    waiting_reason = _text_or_none(waiting.get("reason"))
    pod_reason = _text_or_none(status.get("reason"))

    failing = (
        unschedulable is not None
        or pod_reason == "Evicted"
        or (waiting_reason is not None and waiting_reason not in _STARTING_REASONS)
        or bool(terminated)
    )
    if not failing or (running is not None and ready):
        return None

    started_at = _timestamp(terminated.get("startedAt"))
    finished_at = _timestamp(terminated.get("finishedAt"))
    was_ready = started_at is not None and any(
        started_at <= moment and (finished_at is None or moment <= finished_at)
        for moment in _ready_since(status)
    )
    exit_code = terminated.get("exitCode")
    return FailureEvidence(
        pod=name,
        phase=_text_or_none(status.get("phase")),
        pod_reason=pod_reason,
        pod_message=str(status.get("message") or ""),
        unschedulable_message=unschedulable,
        waiting_reason=waiting_reason,
        waiting_message=str(waiting.get("message") or ""),
        terminated_reason=_text_or_none(terminated.get("reason")),
        exit_code=exit_code if isinstance(exit_code, int) else None,
        termination_message=str(terminated.get("message") or ""),
        started_at=started_at,
        finished_at=finished_at,
        restart_count=int(engine.get("restartCount") or 0),
        ready=ready,
        was_ready=was_ready,
        log_tail=log_tail or "",
    )


def bound_excerpt(text: str, limit_bytes: int = EXCERPT_LIMIT_BYTES) -> str:
    """`text` cut to at most `limit_bytes` UTF-8 bytes, never inside a character."""
    encoded = text.encode()
    if len(encoded) <= limit_bytes:
        return text
    marker = " [...]"
    cut = encoded[: limit_bytes - len(marker)].decode(errors="ignore")
    return cut + marker


def _unschedulable_message(status: Mapping[str, Any]) -> str | None:
    for condition in _sequence(status.get("conditions")):
        cond = _mapping(condition)
        if (
            cond.get("type") == "PodScheduled"
            and cond.get("status") == "False"
            and cond.get("reason") == "Unschedulable"
        ):
            return str(cond.get("message") or "")
    return None


def _ready_since(status: Mapping[str, Any]) -> list[datetime]:
    for condition in _sequence(status.get("conditions")):
        cond = _mapping(condition)
        if cond.get("type") == "Ready" and cond.get("status") == "True":
            moment = _timestamp(cond.get("lastTransitionTime"))
            return [moment] if moment is not None else []
    return []


def _container_status(status: Mapping[str, Any], container: str) -> Mapping[str, Any]:
    for entry in _sequence(status.get("containerStatuses")):
        item = _mapping(entry)
        if item.get("name") == container:
            return item
    return {}


def _timestamp(value: object) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str) or not value:
        return None
    try:
        # The API server writes RFC 3339 with a trailing Z.
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _sequence(value: object) -> Sequence[object]:
    return value if isinstance(value, list | tuple) else ()


def _text_or_none(value: object) -> str | None:
    return str(value) if value else None
