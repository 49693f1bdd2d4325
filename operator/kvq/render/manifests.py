"""Kubernetes objects for one InferenceService: ConfigMap, Deployment, Service, PDB.

Pure and deterministic: the same inputs give byte-identical objects (sorted maps,
stable names), and a hash of the pod's inputs on the pod template drives rollouts.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from kvq.api import keys
from kvq.api.models import InferenceService
from kvq.placement.choice import GPU_TAINT_KEYS
from kvq.placement.pool import NodePool
from kvq.render.args import ENGINE_PORT, WRAPPER_DIR, WRAPPER_FILE, container_command
from kvq.render.model_source import resolve_model_source
from kvq.render.settings import EffectiveSettings, RenderError

CONTAINER_NAME = "vllm"
PORT_NAME = "http"
HEALTH_PATH = "/health"
# /health answers only once the weights are loaded: allow 30 minutes (180 x 10 s) for a
# large model to download and load before the kubelet restarts the container.
STARTUP_PERIOD_SECONDS = 10
STARTUP_FAILURE_THRESHOLD = 180
EVIDENCE_VOLUME = "kvq-evidence"
SHM_VOLUME = "dshm"


@cache
def evidence_script() -> str:
    """The failure-evidence wrapper, shipped to the pod in a ConfigMap."""
    return resources.files("kvq.render").joinpath(WRAPPER_FILE).read_text(encoding="utf-8")


def evidence_configmap_name(isvc_name: str) -> str:
    return f"{isvc_name}-kvq-evidence"


def labels_for(isvc: InferenceService) -> dict[str, str]:
    name = isvc.metadata.name
    return {
        keys.LABEL_COMPONENT: keys.COMPONENT_ENGINE,
        keys.LABEL_INFERENCESERVICE: name,
        keys.LABEL_INSTANCE: name,
        keys.LABEL_MANAGED_BY: keys.MANAGED_BY_VALUE,
        keys.LABEL_NAME: keys.NAME_VALUE,
    }


def selector_for(isvc: InferenceService) -> dict[str, str]:
    """Pod selector; Deployment selectors are immutable, so it never changes."""
    return {keys.LABEL_INFERENCESERVICE: isvc.metadata.name, keys.LABEL_NAME: keys.NAME_VALUE}


@dataclass(frozen=True)
class Rollout:
    """The Deployment's rolling-update limits."""

    max_surge: int
    max_unavailable: int


# Keep every replica serving: one new replica first (it needs a free GPU slot).
SURGE = Rollout(max_surge=1, max_unavailable=0)
# No free GPU for a surge replica: replace one at a time (a single replica is briefly down).
ONE_AT_A_TIME = Rollout(max_surge=0, max_unavailable=1)


def render_manifests(
    isvc: InferenceService,
    pool: NodePool,
    effective: EffectiveSettings,
    *,
    rollout: Rollout = SURGE,
    pod_annotations: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """ConfigMap, Deployment, Service (and a PodDisruptionBudget above one replica).

    `pod_annotations` go on the pod template beside the spec hash (decide() names the
    ladder key, rung and pool there); they are part of the hash.
    """
    objects = [
        _evidence_configmap(isvc),
        _deployment(isvc, pool, effective, rollout, pod_annotations or {}),
        _service(isvc),
    ]
    if isvc.spec.desired_replicas() > 1:
        objects.append(_pod_disruption_budget(isvc))
    return objects


def spec_hash(pod_spec: dict[str, Any], annotations: Mapping[str, str] | None = None) -> str:
    """sha256 of the pod's inputs: the pod spec, its annotations and the wrapper it mounts."""
    inputs = {
        "podSpec": pod_spec,
        "annotations": dict(annotations or {}),
        "evidenceScript": evidence_script(),
    }
    canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _metadata(isvc: InferenceService, name: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": labels_for(isvc)}
    if isvc.metadata.namespace:
        meta["namespace"] = isvc.metadata.namespace
    return meta


def _evidence_configmap(isvc: InferenceService) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(isvc, evidence_configmap_name(isvc.metadata.name)),
        "data": {WRAPPER_FILE: evidence_script()},
    }


def _deployment(
    isvc: InferenceService,
    pool: NodePool,
    effective: EffectiveSettings,
    rollout: Rollout,
    pod_annotations: Mapping[str, str],
) -> dict[str, Any]:
    pod_spec = _pod_spec(isvc, pool, effective)
    annotations = dict(sorted(pod_annotations.items()))
    annotations[keys.ANNOTATION_SPEC_HASH] = spec_hash(pod_spec, annotations)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(isvc, isvc.metadata.name),
        "spec": {
            "replicas": isvc.spec.desired_replicas(),
            "selector": {"matchLabels": selector_for(isvc)},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {
                    "maxSurge": rollout.max_surge,
                    "maxUnavailable": rollout.max_unavailable,
                },
            },
            "template": {
                "metadata": {"labels": labels_for(isvc), "annotations": annotations},
                "spec": pod_spec,
            },
        },
    }


def _pod_spec(
    isvc: InferenceService, pool: NodePool, effective: EffectiveSettings
) -> dict[str, Any]:
    source = resolve_model_source(effective.model_uri, None)
    mounts: list[dict[str, Any]] = [
        {"name": SHM_VOLUME, "mountPath": "/dev/shm"},
        {"name": EVIDENCE_VOLUME, "mountPath": WRAPPER_DIR, "readOnly": True},
    ]
    volumes: list[dict[str, Any]] = [
        # NCCL and the engine's worker processes exchange tensors through /dev/shm, which
        # the container runtime otherwise caps at 64 MiB.
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}},
        {
            "name": EVIDENCE_VOLUME,
            "configMap": {"name": evidence_configmap_name(isvc.metadata.name)},
        },
    ]
    if source.volume is not None and source.mount is not None:
        volumes.append(source.volume)
        mounts.append(source.mount)
    gpus = str(isvc.spec.placement.gpus_per_replica)
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": effective.image,
        "command": container_command(isvc, pool, effective),
        "ports": [{"name": PORT_NAME, "containerPort": ENGINE_PORT}],
        # Requests of an extended resource default to its limit.
        "resources": {"limits": {keys.GPU_RESOURCE: gpus}},
        "startupProbe": _probe(STARTUP_PERIOD_SECONDS, STARTUP_FAILURE_THRESHOLD),
        "readinessProbe": _probe(10, 3),
        "livenessProbe": _probe(15, 4),
        # The wrapper writes the root cause to /dev/termination-log; the log tail is only
        # the fallback when it could not (e.g. the wrapper itself was killed).
        "terminationMessagePolicy": "FallbackToLogsOnError",
        # vllm/vllm-openai runs as root and writes its caches under /root, so runAsNonRoot
        # would stop it from starting; take away everything else root could use.
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "volumeMounts": mounts,
    }
    env = _env(isvc)
    if env:
        container["env"] = env
    return {
        "containers": [container],
        # Service links would inject VLLM_PORT=tcp://... for a Service named `vllm`, which
        # vLLM reads as its own port setting and refuses.
        "enableServiceLinks": False,
        "nodeSelector": _node_selector(isvc, pool),
        "tolerations": _tolerations(isvc),
        "volumes": volumes,
    }


def _probe(period_seconds: int, failure_threshold: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": HEALTH_PATH, "port": PORT_NAME},
        "periodSeconds": period_seconds,
        "failureThreshold": failure_threshold,
        "timeoutSeconds": 5,
    }


def _env(isvc: InferenceService) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [{"name": e.name, "value": e.value} for e in isvc.spec.engine.env]
    token = isvc.spec.model.token_secret_ref
    if token is not None:
        env.append(
            {
                "name": "HF_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": token.name, "key": token.key}},
            }
        )
    return sorted(env, key=lambda e: str(e["name"]))


def _node_selector(isvc: InferenceService, pool: NodePool) -> dict[str, str]:
    selector = dict(pool.node_selector)
    for key, value in isvc.spec.placement.node_selector.items():
        if selector.get(key, value) != value:
            raise RenderError(
                f"placement.nodeSelector {key}={value} contradicts pool {pool.name} "
                f"({key}={selector[key]}): no node could match both"
            )
        selector[key] = value
    return dict(sorted(selector.items()))


def _tolerations(isvc: InferenceService) -> list[dict[str, Any]]:
    # The GPU taint always, whatever the pool carries today: the pod template must not
    # change when a node gains or loses a taint (a transient one such as
    # karpenter.sh/disrupted would otherwise roll every replica). Other taints only when
    # the spec tolerates them.
    tolerations: list[dict[str, Any]] = [
        {"key": key, "operator": "Exists"} for key in sorted(GPU_TAINT_KEYS)
    ]
    for extra in isvc.spec.placement.tolerations:
        tolerations.append(extra.model_dump(by_alias=True, exclude_none=True))
    unique = {json.dumps(t, sort_keys=True): t for t in tolerations}
    return [unique[k] for k in sorted(unique)]


def _service(isvc: InferenceService) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(isvc, isvc.metadata.name),
        "spec": {
            "selector": selector_for(isvc),
            "ports": [{"name": PORT_NAME, "port": ENGINE_PORT, "targetPort": PORT_NAME}],
        },
    }


def _pod_disruption_budget(isvc: InferenceService) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(isvc, isvc.metadata.name),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_for(isvc)}},
    }
