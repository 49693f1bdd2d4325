"""Waiting on a condition with a deadline: poll often, give up loudly, never sleep blind.

Reusable by any integration test (the operator's included): `wait_until` for any probe,
and small helpers for the pod states tests ask about.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

DEFAULT_TIMEOUT = 60.0
DEFAULT_INTERVAL = 0.1


class WaitTimeoutError(AssertionError):
    """The condition did not hold before the deadline (an assertion: tests fail, not error)."""


def wait_until(
    probe: Callable[[], T | None],
    *,
    what: str,
    timeout: float = DEFAULT_TIMEOUT,
    interval: float = DEFAULT_INTERVAL,
    retry_on: tuple[type[BaseException], ...] = (),
    describe: Callable[[], str] | None = None,
) -> T:
    """Call `probe` until it returns something truthy, and return that.

    Exceptions in `retry_on` count as "not yet". On timeout the message names `what`, the
    last error, and `describe()` (e.g. the object's current status) to make failures readable.
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            value = probe()
        except retry_on as error:
            last_error, value = error, None
        if value:
            return value
        if time.monotonic() >= deadline:
            detail = f"; last error: {last_error!r}" if last_error else ""
            state = f"\n{describe()}" if describe else ""
            raise WaitTimeoutError(
                f"timed out after {timeout:.0f}s waiting for {what}{detail}{state}"
            )
        time.sleep(interval)


def is_not_found(error: BaseException) -> bool:
    return getattr(error, "status", None) == 404


def wait_for_pod(
    core: Any,
    namespace: str,
    predicate: Callable[[Any], bool],
    *,
    what: str,
    label_selector: str = "",
    timeout: float = DEFAULT_TIMEOUT,
) -> Any:
    """The first pod (matching `label_selector`) for which `predicate` holds."""

    def probe() -> Any:
        pods = core.list_namespaced_pod(namespace, label_selector=label_selector).items
        return next((p for p in pods if predicate(p)), None)

    def describe() -> str:
        pods = core.list_namespaced_pod(namespace, label_selector=label_selector).items
        return "\n".join(f"{p.metadata.name}: {p.spec.node_name} {p.status}" for p in pods)

    return wait_until(probe, what=what, timeout=timeout, describe=describe)


def wait_for_deletion(
    read: Callable[[], Any], *, what: str, timeout: float = DEFAULT_TIMEOUT
) -> None:
    """Until `read()` answers 404."""
    # Imported here: the harness's start-up path uses this module and the client is slow to import.
    from kubernetes.client.exceptions import ApiException

    def gone() -> bool:
        try:
            read()
        except ApiException as error:
            if error.status == 404:
                return True
            raise
        return False

    wait_until(gone, what=what, timeout=timeout)


def is_running_and_ready(pod: Any) -> bool:
    conditions = pod.status.conditions or []
    ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
    return bool(pod.status.phase == "Running" and ready)


def waiting_reason(pod: Any, container: str | None = None) -> str | None:
    """The waiting reason of `container` (default: the first), e.g. CrashLoopBackOff."""
    status = container_status(pod, container)
    if status is None or status.state is None or status.state.waiting is None:
        return None
    return str(status.state.waiting.reason)


def container_status(pod: Any, container: str | None = None) -> Any:
    statuses = pod.status.container_statuses or []
    for status in statuses:
        if container is None or status.name == container:
            return status
    return None


def condition(obj: Any, kind: str) -> Any:
    """The status condition of type `kind` of an API object (model or dict), or None."""
    status = obj.get("status") if isinstance(obj, dict) else obj.status
    if not status:
        return None
    conditions = status.get("conditions") if isinstance(status, dict) else status.conditions
    for item in conditions or []:
        item_type = item.get("type") if isinstance(item, dict) else item.type
        if item_type == kind:
            return item
    return None


def has_condition(obj: Any, kind: str, status: str = "True") -> bool:
    """True when `obj` has condition `kind` with `status` (works for CRs read as dicts)."""
    found = condition(obj, kind)
    if found is None:
        return False
    value = found.get("status") if isinstance(found, dict) else found.status
    return bool(value == status)
