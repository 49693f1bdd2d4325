"""The quality gate on the local control plane: the probe Job kvq starts after a quantized
rollout, its verdict read back from the Job's pod, the fallback a failure causes.

The probe's pod runs in KWOK, which runs no container: its fate (exit 0 or 1) and the
termination message `kvq probe` would have written come from the spec's quality.env, the
same way the engine's simulated failures do (e2e/kwok/stages.yaml). `kvq probe` itself
runs against real vLLM in tests/engine/test_probe_quality.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e.devcluster.clients import Kube
from e2e.devcluster.waits import wait_until
from kubernetes import client as k8s

from tests.cluster.operator_support import (
    OperatorProcess,
    create_isvc,
    inference_service,
    install_kvq_crd,
    operator_running,
    read_isvc,
)

pytestmark = pytest.mark.cluster

PROBE_LABELS = "app.kubernetes.io/component=quality-probe"


@pytest.fixture
def operator(kube: Kube, namespace: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    install_kvq_crd(kube)
    with operator_running(kube, namespace, tmp_path / "operator.log") as process:
        yield process


def report(verdict: str, accuracy: float) -> str:
    """A ProbeReport summary as `kvq probe --termination-log` writes it."""
    return json.dumps(
        {
            "apiVersion": "kvq.dev/v1alpha1",
            "kind": "ProbeReport",
            "schemaVersion": 1,
            "verdict": verdict,
            "reason": f"needle.accuracy={accuracy} against needle.accuracy>=0.9",
            "engine": {"cacheConfig": {"cacheDtype": "fp8"}},
            "scores": {"needle.accuracy": accuracy},
            "checks": [
                {
                    "requirement": "needle.accuracy>=0.9",
                    "score": "needle.accuracy",
                    "passed": verdict == "Pass",
                    "value": accuracy,
                    "threshold": 0.9,
                }
            ],
        }
    )


def gated(name: str, fate: str, message: str, on_failure: str = "fallback") -> dict[str, Any]:
    return inference_service(
        name,
        placement={"pools": ["gpu-h100"]},
        quality={
            "require": ["needle.accuracy>=0.9"],
            "onFailure": on_failure,
            "tolerations": [{"operator": "Exists"}],
            "env": [
                {"name": "KVQ_SIM_FAILURE", "value": fate},
                {"name": "KVQ_SIM_TERMINATION_MESSAGE", "value": message},
            ],
        },
    )


def status_of(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = read_isvc(kube, namespace, name).get("status") or {}
    return found


def condition(kube: Kube, namespace: str, name: str, kind: str) -> tuple[str, str]:
    for c in status_of(kube, namespace, name).get("conditions") or []:
        if c["type"] == kind:
            return c["status"], c.get("reason", "")
    return "", ""


def probe_jobs(kube: Kube, namespace: str) -> list[str]:
    found = (
        k8s.BatchV1Api(kube.api).list_namespaced_job(namespace, label_selector=PROBE_LABELS).items
    )
    return [j.metadata.name for j in found if not j.metadata.deletion_timestamp]


def reasons(kube: Kube, namespace: str, name: str) -> set[str]:
    selector = f"involvedObject.kind=InferenceService,involvedObject.name={name}"
    return {
        e.reason for e in kube.core.list_namespaced_event(namespace, field_selector=selector).items
    }


def test_a_passing_probe_keeps_fp8_and_its_job_goes(
    kube: Kube, namespace: str, operator: OperatorProcess
) -> None:
    name = "gate-pass"
    create_isvc(kube, namespace, gated(name, "completed", report("Pass", 0.97)))
    wait_until(
        lambda: condition(kube, namespace, name, "QualityVerified") == ("True", "Passed"),
        what="QualityVerified=True after the probe Job",
        timeout=120,
        describe=operator.log_tail,
    )
    status = status_of(kube, namespace, name)
    assert status["quality"]["verdict"] == "Pass"
    assert status["quality"]["scores"]["needle.accuracy"] == 0.97
    assert status["effective"]["kvCacheDtype"] == "fp8"
    assert status["fallback"]["attempts"] == []
    wait_until(
        lambda: not probe_jobs(kube, namespace),
        what="the probe Job pruned once its verdict is on record",
        timeout=60,
        describe=operator.log_tail,
    )
    assert "QualityPassed" in reasons(kube, namespace, name)
    # One verdict per rendering: no second Job for the same Deployment.
    assert condition(kube, namespace, name, "Ready")[0] == "True"
    assert not probe_jobs(kube, namespace)


def test_a_failing_probe_falls_back_to_auto_and_says_why(
    kube: Kube, namespace: str, operator: OperatorProcess
) -> None:
    name = "gate-fail"
    create_isvc(kube, namespace, gated(name, "terminated", report("Fail", 0.4)))
    wait_until(
        lambda: (
            (status_of(kube, namespace, name).get("effective") or {}).get("kvCacheDtype") == "auto"
            and condition(kube, namespace, name, "Ready")[0] == "True"
        ),
        what="Ready on auto after the probe failed",
        timeout=180,
        describe=operator.log_tail,
    )
    status = status_of(kube, namespace, name)
    assert [a["cause"] for a in status["fallback"]["attempts"]] == ["QualityRegression"]
    assert status["quality"]["verdict"] == "Fail"
    assert condition(kube, namespace, name, "QualityVerified") == ("False", "QualityRegression")
    assert "QualityRegression" in reasons(kube, namespace, name)
    deployment = kube.apps.read_namespaced_deployment(name, namespace)
    args = deployment.spec.template.spec.containers[0].args or []
    command = deployment.spec.template.spec.containers[0].command or []
    flags = list(command) + list(args)
    assert flags[flags.index("--kv-cache-dtype") + 1] == "auto"
    wait_until(
        lambda: not probe_jobs(kube, namespace),
        what="no probe Job on auto",
        timeout=60,
        describe=operator.log_tail,
    )


def test_an_unanswered_probe_is_unknown_and_moves_nothing(
    kube: Kube, namespace: str, operator: OperatorProcess
) -> None:
    name = "gate-unknown"
    # The probe's pod ends without a summary (it could not reach the engine).
    create_isvc(kube, namespace, gated(name, "terminated", ""))
    wait_until(
        lambda: condition(kube, namespace, name, "QualityVerified") == ("Unknown", "ProbeUnknown"),
        what="QualityVerified=Unknown after a probe without a verdict",
        timeout=120,
        describe=operator.log_tail,
    )
    status = status_of(kube, namespace, name)
    assert status["effective"]["kvCacheDtype"] == "fp8"
    assert status["fallback"]["attempts"] == []


def test_a_known_fp8_accuracy_problem_warns_in_status_and_still_serves(
    kube: Kube, namespace: str, operator: OperatorProcess
) -> None:
    name = "gate-qwen2"
    body = gated(name, "completed", report("Pass", 0.95))
    body["spec"]["model"] = {"uri": "hf://Qwen/Qwen2.5-7B-Instruct"}
    create_isvc(kube, namespace, body)
    wait_until(
        lambda: (
            condition(kube, namespace, name, "KnownAccuracyRisk") == ("True", "ReportedRegression")
            and condition(kube, namespace, name, "QualityVerified") == ("True", "Passed")
        ),
        what="KnownAccuracyRisk=True beside the probe's verdict",
        timeout=120,
        describe=operator.log_tail,
    )
    status = status_of(kube, namespace, name)
    # The API server kept the field (the CRD's schema has it), with the fact's source.
    (risk,) = status["knownAccuracyRisks"]
    assert risk["id"] == "qwen2-fp8-unit-scales"
    assert "https://github.com/vllm-project/vllm/pull/11906" in risk["sources"]
    # A warning only: fp8 is served as asked and nothing moved on the ladder.
    assert status["effective"]["kvCacheDtype"] == "fp8"
    assert status["fallback"]["attempts"] == []
    assert condition(kube, namespace, name, "Ready")[0] == "True"
    assert "KnownAccuracyRisk" in reasons(kube, namespace, name)
