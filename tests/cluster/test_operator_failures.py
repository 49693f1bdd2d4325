"""Failures that are not the KV cache's fault: kvq reports them and does not fall back.

Each engine is made to fail by the KWOK stages (env KVQ_SIM_FAILURE, read only by the
simulated kubelet), under an fp8 KV cache, where an unknown start-up crash WOULD be
dtype-suspect: OOMKilled, ImagePullBackOff, and a crash after the engine was Ready.
An Unschedulable replica comes from asking for more GPUs than the pool has.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e.devcluster.clients import Kube
from e2e.devcluster.waits import wait_until

from tests.cluster.operator_support import (
    OperatorProcess,
    create_isvc,
    inference_service,
    install_kvq_crd,
    operator_running,
    read_isvc,
)

pytestmark = pytest.mark.cluster


@pytest.fixture
def operator(kube: Kube, namespace: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    install_kvq_crd(kube)
    with operator_running(kube, namespace, tmp_path / "operator.log") as process:
        yield process


def condition(kube: Kube, namespace: str, name: str, type_: str) -> dict[str, Any]:
    status = read_isvc(kube, namespace, name).get("status") or {}
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), {})


@pytest.mark.parametrize(
    ("failure", "reason", "words"),
    [
        ("oom-killed", "OOMKilled", "OOMKilled"),
        ("image-pull", "ImagePull", "image"),
        ("crash-after-ready", "CrashAfterReady", "after it had started serving"),
    ],
)
def test_non_kv_failures_degrade_without_fallback(
    kube: Kube, namespace: str, operator: OperatorProcess, failure: str, reason: str, words: str
) -> None:
    name = f"sim-{failure}"
    env = [{"name": "KVQ_SIM_FAILURE", "value": failure}]
    if failure == "crash-after-ready":
        env.append(
            {
                "name": "KVQ_SIM_TERMINATION_MESSAGE",
                "value": "engine exited with code 1\nthe engine had started serving "
                "(Application startup complete) before it failed\nerror lines, most "
                "specific first:\nRuntimeError: Unsupported CPU attention configuration: "
                "head_dim=16",
            }
        )
    create_isvc(kube, namespace, inference_service(name, engine={"env": env}))

    def degraded() -> bool:
        return condition(kube, namespace, name, "Degraded").get("reason") == reason

    wait_until(degraded, what=f"Degraded={reason}", timeout=120, describe=operator.log_tail)
    status = read_isvc(kube, namespace, name)["status"]
    assert words.lower() in condition(kube, namespace, name, "Degraded")["message"].lower()
    assert status["fallback"]["attempts"] == []
    assert status["effective"]["kvCacheDtype"] == "fp8"
    assert condition(kube, namespace, name, "FallbackActive")["status"] == "False"


def test_more_replicas_than_gpus_is_unschedulable_not_a_dtype_problem(
    kube: Kube, namespace: str, operator: OperatorProcess
) -> None:
    # The H100 pool has one node with 8 GPUs: a third replica of 4 GPUs cannot be placed.
    name = "too-many"
    body = inference_service(
        name, replicas=3, placement={"gpusPerReplica": 4, "pools": ["gpu-h100"]}
    )
    create_isvc(kube, namespace, body)

    def unschedulable() -> bool:
        # Two replicas run; the third waits for GPUs the pool does not have.
        status = read_isvc(kube, namespace, name).get("status") or {}
        return (
            condition(kube, namespace, name, "Degraded").get("reason") == "Unschedulable"
            and status.get("readyReplicas") == 2
        )

    wait_until(
        unschedulable, what="Degraded=Unschedulable", timeout=120, describe=operator.log_tail
    )
    status = read_isvc(kube, namespace, name)["status"]
    assert status["fallback"]["attempts"] == []
    assert status["effective"]["kvCacheDtype"] == "fp8"
