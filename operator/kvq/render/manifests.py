"""Kubernetes objects for one InferenceService: ConfigMap, Deployment, Service, PDB; a
replica over several nodes runs as a LeaderWorkerSet instead of the Deployment (one group
of pods per replica, render.leaderworkerset), with no PDB.

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
from kvq.api.resource import InferenceService
from kvq.api.tiers import TierSpec
from kvq.placement.choice import GPU_TAINT_KEYS
from kvq.placement.pool import NodePool, nodes_per_replica
from kvq.placement.topology import group_topology_key
from kvq.planner.layout import Layout
from kvq.render.args import ENGINE_PORT, WRAPPER_DIR, WRAPPER_FILE, container_command
from kvq.render.leaderworkerset import LeaderWorkerSetError, leader_service, leader_worker_set
from kvq.render.model_source import resolve_model_source
from kvq.render.pod import (
    DEFAULT_FETCH_IMAGE,
    PodParts,
    container_resources,
    engine_security_context,
    pod_parts,
    pod_settings,
    shm_size,
    startup_failure_threshold,
)
from kvq.render.settings import EffectiveSettings, RenderError

CONTAINER_NAME = "vllm"
PORT_NAME = "http"
HEALTH_PATH = "/health"
# /health answers only once the weights are loaded: the start-up probe's budget scales with
# the model's size (kvq.render.pod.startup_failure_threshold).
STARTUP_PERIOD_SECONDS = 10
EVIDENCE_VOLUME = "kvq-evidence"
SHM_VOLUME = "dshm"


@cache
def evidence_script() -> str:
    """The failure-evidence wrapper, shipped to the pod in a ConfigMap."""
    return resources.files("kvq.render").joinpath(WRAPPER_FILE).read_text(encoding="utf-8")


def evidence_configmap_name(isvc_name: str) -> str:
    return f"{isvc_name}-kvq-evidence"


def workload_name(isvc: InferenceService, tier: TierSpec | None = None) -> str:
    """The name of a tier's objects: the InferenceService's, then `-<tier>` for extra tiers."""
    return isvc.metadata.name if tier is None else f"{isvc.metadata.name}-{tier.name}"


def labels_for(isvc: InferenceService, tier: TierSpec | None = None) -> dict[str, str]:
    """Every object and pod names its InferenceService (kvq's indices key on it); an extra
    tier's also names the tier and a name of its own, so the default tier's selector
    (immutable, set before tiers existed) never matches them."""
    labels = {
        keys.LABEL_COMPONENT: keys.COMPONENT_ENGINE,
        keys.LABEL_INFERENCESERVICE: isvc.metadata.name,
        keys.LABEL_INSTANCE: workload_name(isvc, tier),
        keys.LABEL_MANAGED_BY: keys.MANAGED_BY_VALUE,
        keys.LABEL_NAME: keys.NAME_VALUE if tier is None else keys.TIER_NAME_VALUE,
    }
    if tier is not None:
        labels[keys.LABEL_TIER] = tier.name
    return labels


def selector_for(isvc: InferenceService, tier: TierSpec | None = None) -> dict[str, str]:
    """Pod selector; Deployment selectors are immutable, so it never changes."""
    selector = {keys.LABEL_INFERENCESERVICE: isvc.metadata.name}
    if tier is None:
        selector[keys.LABEL_NAME] = keys.NAME_VALUE
    else:
        selector[keys.LABEL_NAME] = keys.TIER_NAME_VALUE
        selector[keys.LABEL_TIER] = tier.name
    return selector


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
    tier: TierSpec | None = None,
    replicas_owned_elsewhere: bool = False,
    fetch_image: str = DEFAULT_FETCH_IMAGE,
) -> list[dict[str, Any]]:
    """ConfigMap, Deployment, Service (and a PodDisruptionBudget above one replica, and the
    model cache's PersistentVolumeClaim when kvq owns one).

    `pod_annotations` go on the pod template beside the spec hash (decide() names the
    ladder key, rung and pool there); they are part of the hash. `tier`: an extra tier of
    the service (its spec already in `isvc`): its objects are named and labelled apart.
    `replicas_owned_elsewhere`: an autoscaler scales this Deployment itself, so kvq leaves
    `replicas` out (and does not fight it). `fetch_image`: the image of the model download
    step (the operator's own).
    """
    parts = pod_parts(isvc, effective, labels=labels_for(isvc), fetch_image=fetch_image)
    nodes = replica_nodes(isvc, pool)
    deployment = _deployment(
        isvc, pool, effective, rollout, pod_annotations or {}, tier, parts, nodes
    )
    objects = [_evidence_configmap(isvc, tier), deployment, _service(isvc, tier)]
    if nodes > 1:
        # A lost rank breaks the whole group, which LWS recreates: a PDB could only block a
        # drain, never keep a group serving.
        placement = isvc.spec.placement
        layout = Layout(placement.tensor_parallel, placement.pipeline_parallel)
        try:
            group = leader_worker_set(
                deployment,
                layout,
                nodes,
                effective.engine_version,
                group_topology_key(pool, nodes),
            )
        except LeaderWorkerSetError as error:
            raise RenderError(str(error)) from None
        if replicas_owned_elsewhere:
            del group["spec"]["replicas"]
        objects[1:3] = [group, leader_service(objects[2])]
    else:
        if replicas_owned_elsewhere:
            del deployment["spec"]["replicas"]
        if isvc.spec.desired_replicas() > 1:
            objects.append(_pod_disruption_budget(isvc, tier))
    objects.extend(parts.objects)
    return objects


def replica_nodes(isvc: InferenceService, pool: NodePool) -> int:
    """Nodes one replica spans on `pool` (1: a Deployment's pod; more: a LeaderWorkerSet's
    group). A replica that does not split over the pool's nodes is refused by the engine's
    arguments (render.args)."""
    placement = isvc.spec.placement
    found = nodes_per_replica(
        placement.tensor_parallel, placement.pipeline_parallel, pool.gpus_per_node
    )
    return found or 1


def spec_hash(pod_spec: dict[str, Any], annotations: Mapping[str, str] | None = None) -> str:
    """sha256 of the pod's inputs: the pod spec, its annotations and the wrapper it mounts."""
    inputs = {
        "podSpec": pod_spec,
        "annotations": dict(annotations or {}),
        "evidenceScript": evidence_script(),
    }
    canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _metadata(isvc: InferenceService, name: str, tier: TierSpec | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": labels_for(isvc, tier)}
    if isvc.metadata.namespace:
        meta["namespace"] = isvc.metadata.namespace
    return meta


def _evidence_configmap(isvc: InferenceService, tier: TierSpec | None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(isvc, evidence_configmap_name(workload_name(isvc, tier)), tier),
        "data": {WRAPPER_FILE: evidence_script()},
    }


def _deployment(
    isvc: InferenceService,
    pool: NodePool,
    effective: EffectiveSettings,
    rollout: Rollout,
    pod_annotations: Mapping[str, str],
    tier: TierSpec | None,
    parts: PodParts,
    nodes: int = 1,
) -> dict[str, Any]:
    pod_spec = _pod_spec(isvc, pool, effective, tier, parts, nodes)
    # The spec's own pod annotations and labels; kvq's keys win (the CRD refuses them).
    annotations = dict(sorted({**isvc.spec.pod.annotations, **pod_annotations}.items()))
    pod_labels = dict(sorted({**isvc.spec.pod.labels, **labels_for(isvc, tier)}.items()))
    annotations[keys.ANNOTATION_SPEC_HASH] = spec_hash(pod_spec, annotations)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(isvc, workload_name(isvc, tier), tier),
        "spec": {
            "replicas": isvc.spec.desired_replicas(),
            "selector": {"matchLabels": selector_for(isvc, tier)},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {
                    "maxSurge": rollout.max_surge,
                    "maxUnavailable": rollout.max_unavailable,
                },
            },
            "template": {
                "metadata": {"labels": pod_labels, "annotations": annotations},
                "spec": pod_spec,
            },
        },
    }


def _pod_spec(
    isvc: InferenceService,
    pool: NodePool,
    effective: EffectiveSettings,
    tier: TierSpec | None,
    parts: PodParts,
    nodes: int = 1,
) -> dict[str, Any]:
    source = resolve_model_source(effective.model_uri, None)
    mounts: list[dict[str, Any]] = [
        {"name": SHM_VOLUME, "mountPath": "/dev/shm"},
        {"name": EVIDENCE_VOLUME, "mountPath": WRAPPER_DIR, "readOnly": True},
    ]
    volumes: list[dict[str, Any]] = [
        # NCCL and the engine's worker processes exchange tensors through /dev/shm, which
        # the container runtime otherwise caps at 64 MiB. Counted in the memory request.
        {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": shm_size(isvc, nodes)}},
        {
            "name": EVIDENCE_VOLUME,
            "configMap": {"name": evidence_configmap_name(workload_name(isvc, tier))},
        },
    ]
    if source.volume is not None and source.mount is not None:
        volumes.append(source.volume)
        mounts.append(source.mount)
    volumes += parts.volumes
    mounts += parts.engine_mounts
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": effective.image,
        "command": container_command(isvc, pool, effective, alias=_alias(tier)),
        "ports": [{"name": PORT_NAME, "containerPort": ENGINE_PORT}],
        "resources": container_resources(isvc, effective, nodes),
        "startupProbe": _probe(STARTUP_PERIOD_SECONDS, startup_failure_threshold(isvc, effective)),
        "readinessProbe": _probe(10, 3),
        "livenessProbe": _probe(15, 4),
        # The wrapper writes the root cause to /dev/termination-log; the log tail is only
        # the fallback when it could not (e.g. the wrapper itself was killed).
        "terminationMessagePolicy": "FallbackToLogsOnError",
        # vllm/vllm-openai runs as root and writes its caches under /root: runAsNonRoot only
        # with spec.engine.runAsUser (which moves HOME); as root, no capability is left.
        "securityContext": engine_security_context(isvc),
        "volumeMounts": mounts,
    }
    if parts.engine_env:
        container["env"] = parts.engine_env
    if parts.engine_env_from:
        container["envFrom"] = parts.engine_env_from
    pod: dict[str, Any] = {
        "containers": [container],
        # Service links would inject VLLM_PORT=tcp://... for a Service named `vllm`, which
        # vLLM reads as its own port setting and refuses.
        "enableServiceLinks": False,
        "nodeSelector": _node_selector(isvc, pool),
        "tolerations": _tolerations(isvc),
        "volumes": volumes,
        **pod_settings(isvc, selector_for(isvc, tier)),
    }
    if parts.init_containers:
        pod["initContainers"] = parts.init_containers
    if parts.pod_security:
        pod["securityContext"] = parts.pod_security
    return pod


def _probe(period_seconds: int, failure_threshold: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": HEALTH_PATH, "port": PORT_NAME},
        "periodSeconds": period_seconds,
        "failureThreshold": failure_threshold,
        "timeoutSeconds": 5,
    }


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


def _alias(tier: TierSpec | None) -> str | None:
    return tier.model_alias() if tier is not None else None


def _service(isvc: InferenceService, tier: TierSpec | None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(isvc, workload_name(isvc, tier), tier),
        "spec": {
            "selector": selector_for(isvc, tier),
            "ports": [{"name": PORT_NAME, "port": ENGINE_PORT, "targetPort": PORT_NAME}],
        },
    }


def _pod_disruption_budget(isvc: InferenceService, tier: TierSpec | None) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(isvc, workload_name(isvc, tier), tier),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_for(isvc, tier)}},
    }
