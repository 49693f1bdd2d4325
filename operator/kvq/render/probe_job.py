"""The quality probe's Job: `kvq probe` from the operator image, against the service.

The probe writes its verdict summary (JSON, under 4 KiB) to the termination log, which the
kubelet keeps in the pod's status: the operator reads it from its pod cache, with no log
access and no result store. One Job per rendering probed (and per period run), named after
what it probes, so a restarted operator finds the Job it started instead of starting two.
"""

from __future__ import annotations

import hashlib
from typing import Any

from kvq.api import keys
from kvq.api.resource import InferenceService
from kvq.render.args import ENGINE_PORT
from kvq.render.manifests import labels_for, workload_name

PROBE_CONTAINER = "probe"
COMPONENT_PROBE = "quality-probe"
PROBE_NAME = "kvq-probe"
TERMINATION_LOG = "/dev/termination-log"


def probe_job_name(isvc: InferenceService, probed_hash: str, run: int) -> str:
    """Short, stable and unique per (rendering, run): `<name>-probe-<8 hex>`."""
    digest = hashlib.sha256(f"{probed_hash}/{run}".encode()).hexdigest()[:8]
    return f"{isvc.metadata.name[:46]}-probe-{digest}"


def render_probe_job(
    isvc: InferenceService,
    *,
    image: str,
    probed_hash: str,
    run: int,
) -> dict[str, Any]:
    """The Job for `isvc` (which must have spec.quality)."""
    quality = isvc.spec.quality
    assert quality is not None, "render_probe_job needs spec.quality"
    namespace = isvc.metadata.namespace or "default"
    url = f"http://{workload_name(isvc)}.{namespace}.svc:{ENGINE_PORT}"
    command = [
        "kvq",
        "probe",
        f"--url={url}",
        f"--model={isvc.metadata.name}",
        f"--suite={','.join(quality.suites)}",
        f"--budget-s={max(quality.timeout_seconds - 60, 60)}",
        f"--termination-log={TERMINATION_LOG}",
        "--output=json",
    ]
    if quality.baseline_tier is not None:
        tier = next(t for t in isvc.spec.tiers if t.name == quality.baseline_tier)
        baseline = workload_name(isvc, tier)
        command.append(f"--baseline-url=http://{baseline}.{namespace}.svc:{ENGINE_PORT}")
    command += [f"--require={requirement}" for requirement in quality.require]
    labels = {
        **labels_for(isvc),
        # Not the engines' name: their Deployment's and Service's selectors must never
        # take the probe's pod.
        keys.LABEL_NAME: PROBE_NAME,
        keys.LABEL_COMPONENT: COMPONENT_PROBE,
        keys.LABEL_PROBED_HASH: probed_hash[:16],
    }
    env = [e.model_dump(by_alias=True, exclude_none=True) for e in quality.env]
    container: dict[str, Any] = {
        "name": PROBE_CONTAINER,
        "image": image,
        "command": command,
        "terminationMessagePolicy": "File",
        "resources": {
            "requests": {"cpu": "100m", "memory": "256Mi"},
            "limits": {"memory": "1Gi"},
        },
        "securityContext": {
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    if env:
        container["env"] = env
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "containers": [container],
    }
    if quality.tolerations:
        pod_spec["tolerations"] = [
            t.model_dump(by_alias=True, exclude_none=True) for t in quality.tolerations
        ]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": probe_job_name(isvc, probed_hash, run),
            "namespace": namespace,
            "labels": labels,
        },
        "spec": {
            # One answer per rollout: a probe that fails to run is Unknown, not retried
            # in a loop (the next rollout or period runs a new one).
            "backoffLimit": 0,
            "activeDeadlineSeconds": quality.timeout_seconds,
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }
