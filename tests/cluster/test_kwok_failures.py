"""Each KWOK failure stage gives a pod the container status a real kubelet would report."""

from __future__ import annotations

from typing import Any

import pytest
from e2e.devcluster.clients import Kube
from e2e.devcluster.waits import (
    container_status,
    is_running_and_ready,
    wait_for_pod,
    waiting_reason,
)

from tests.cluster.manifests import container, pod

pytestmark = pytest.mark.cluster

ENGINE_ERROR = (
    "ValueError: Model architecture not supported for kv_cache_dtype='fp8'\n"
    "RuntimeError: Engine core initialization failed."
)


def _failing(mode: str, **extra: str) -> dict[str, str]:
    return {"kvq.dev/kwok-failure": mode, **{f"kvq.dev/kwok-{k}": v for k, v in extra.items()}}


def _last_terminated(p: Any) -> Any:
    status = container_status(p)
    return status.last_state.terminated if status and status.last_state else None


def test_crash_loop_keeps_exit_code_reason_and_message(kube: Kube, namespace: str) -> None:
    annotations = _failing("crash-loop", **{"exit-code": "3", "reason": "Error"})
    annotations["kvq.dev/kwok-message"] = ENGINE_ERROR
    kube.core.create_namespaced_pod(namespace, pod("engine", annotations=annotations))

    crashed = wait_for_pod(
        kube.core,
        namespace,
        lambda p: waiting_reason(p) == "CrashLoopBackOff",
        what="CrashLoopBackOff",
    )

    status = container_status(crashed)
    terminated = _last_terminated(crashed)
    assert (terminated.exit_code, terminated.reason) == (3, "Error")
    assert terminated.message == ENGINE_ERROR
    assert status.restart_count > 0
    assert status.ready is False
    assert crashed.status.phase == "Running"


def test_crash_loop_restarts_keep_counting(kube: Kube, namespace: str) -> None:
    annotations = _failing("crash-loop", backoff="1s", message=ENGINE_ERROR)
    kube.core.create_namespaced_pod(namespace, pod("engine", annotations=annotations))

    looping = wait_for_pod(
        kube.core,
        namespace,
        lambda p: container_status(p) is not None and container_status(p).restart_count >= 3,
        what="three restarts",
    )

    assert waiting_reason(looping) == "CrashLoopBackOff"
    assert _last_terminated(looping).message == ENGINE_ERROR


def test_oom_killed_reports_137(kube: Kube, namespace: str) -> None:
    kube.core.create_namespaced_pod(namespace, pod("engine", annotations=_failing("oom-killed")))

    crashed = wait_for_pod(
        kube.core,
        namespace,
        lambda p: waiting_reason(p) == "CrashLoopBackOff",
        what="OOMKilled then CrashLoopBackOff",
    )

    terminated = _last_terminated(crashed)
    assert (terminated.exit_code, terminated.reason) == (137, "OOMKilled")


def test_image_pull_backoff(kube: Kube, namespace: str) -> None:
    kube.core.create_namespaced_pod(namespace, pod("engine", annotations=_failing("image-pull")))

    stuck = wait_for_pod(
        kube.core,
        namespace,
        lambda p: waiting_reason(p) == "ImagePullBackOff",
        what="ImagePullBackOff",
    )

    assert stuck.status.phase == "Pending"
    assert "registry.invalid/kvq/fake:1" in container_status(stuck).state.waiting.message


def test_terminated_without_restart(kube: Kube, namespace: str) -> None:
    annotations = _failing("terminated", **{"exit-code": "2", "message": "bad flag --swap-space"})
    kube.core.create_namespaced_pod(
        namespace, pod("once", annotations=annotations, restart_policy="Never")
    )

    failed = wait_for_pod(
        kube.core, namespace, lambda p: p.status.phase == "Failed", what="phase Failed"
    )

    terminated = container_status(failed).state.terminated
    assert (terminated.exit_code, terminated.message) == (2, "bad flag --swap-space")


def test_only_the_named_container_fails(kube: Kube, namespace: str) -> None:
    annotations = _failing("crash-loop", container="engine", message="boom")
    containers = [container("engine", gpus=1), container("sidecar")]
    kube.core.create_namespaced_pod(
        namespace, pod("two", annotations=annotations, containers=containers)
    )

    crashed = wait_for_pod(
        kube.core,
        namespace,
        lambda p: waiting_reason(p, "engine") == "CrashLoopBackOff",
        what="the engine container in CrashLoopBackOff",
    )

    sidecar = container_status(crashed, "sidecar")
    assert sidecar.ready is True
    assert sidecar.state.running is not None


def test_crash_after_ready(kube: Kube, namespace: str) -> None:
    annotations = _failing("crash-after-ready", delay="3s", message=ENGINE_ERROR)
    kube.core.create_namespaced_pod(namespace, pod("engine", annotations=annotations))

    wait_for_pod(kube.core, namespace, is_running_and_ready, what="Ready before the crash")
    crashed = wait_for_pod(
        kube.core,
        namespace,
        lambda p: waiting_reason(p) == "CrashLoopBackOff",
        what="CrashLoopBackOff after having been Ready",
    )

    assert _last_terminated(crashed).message == ENGINE_ERROR
    ready = next(c for c in crashed.status.conditions if c.type == "Ready")
    assert ready.status == "False"
