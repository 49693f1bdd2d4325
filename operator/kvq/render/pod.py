"""The engine pod beyond its command line: model cache and download, environment by
reference, resources, /dev/shm, start-up budget and the pod-level settings.

Sizes are derived from the model when the spec leaves them out (see `EngineResources` and
`ModelCacheSpec` in kvq.api.model_cache for the formulas as users read them):

- memory: 2 GiB + 3 GiB per GPU (API server, engine core, one worker per GPU) + the
  weights (they pass through host memory while loading) + /dev/shm + the KV cache's CPU
  tier (spec.memory.swapSpaceGiB per GPU: pinned host memory, V0 swap or V1 offloading;
  4 GiB per GPU on swap engines when unset); the limit equals the request. CPU: 2 + 2 per
  GPU, no limit.
- /dev/shm: 1 GiB per GPU of the replica.
- cache: every model the cache may hold x 1.2 + 1 GiB (a moved branch keeps its old blobs).
- start-up probe: 5 minutes + loading at 100 MiB/s, at least 10 minutes; when the engine
  downloads (or streams) the model itself, + downloading at 25 MiB/s, at least 30 minutes;
  10 s periods.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvq import __version__
from kvq.api.engine import ResourceAmounts
from kvq.api.environment import EnvFromSource, EnvVar
from kvq.api.model_cache import CacheVolumeClaim
from kvq.api.quantity import quantity_value
from kvq.api.resource import InferenceService
from kvq.fetch.failures import FETCH_CONTAINER
from kvq.fetch.layout import CACHE_MOUNT, FETCH_HOME, MODEL_LINK, MODEL_LINK_DIR
from kvq.planner.host_tier import host_tier_gib_per_gpu
from kvq.render.settings import EffectiveSettings, RenderError

DEFAULT_FETCH_IMAGE = f"kvq/operator:{__version__}"
"""The operator's image, which runs `kvq fetch`; the operator passes its own image in."""
FETCH_USER = 65532
"""The operator image's user (numeric, as its Dockerfile sets it)."""
CACHE_VOLUME = "kvq-cache"
LINK_VOLUME = "kvq-model"
HOME_VOLUME = "kvq-home"
ENGINE_HOME = "/home/kvq"

GIB = 1024**3
MIB = 1024**2
_BASE_MEMORY = 2 * GIB
_MEMORY_PER_GPU = 3 * GIB
_SHM_PER_GPU = 1 * GIB
_BASE_CPU = 2
_CPU_PER_GPU = 2
_CACHE_HEADROOM = 1.2
_STARTUP_PERIOD_S = 10
_STARTUP_BASE_S = 300
_STARTUP_MIN_S = 600
_STARTUP_MIN_DOWNLOAD_S = 1800
_LOAD_BYTES_PER_S = 100 * MIB
_DOWNLOAD_BYTES_PER_S = 25 * MIB
# Without the model's size: 30 minutes, the budget kvq always had.
_STARTUP_UNKNOWN_THRESHOLD = 180


@dataclass
class PodParts:
    """Pieces `_pod_spec` adds to the engine pod."""

    volumes: list[dict[str, Any]] = field(default_factory=list)
    engine_mounts: list[dict[str, Any]] = field(default_factory=list)
    engine_env: list[dict[str, Any]] = field(default_factory=list)
    engine_env_from: list[dict[str, Any]] = field(default_factory=list)
    init_containers: list[dict[str, Any]] = field(default_factory=list)
    objects: list[dict[str, Any]] = field(default_factory=list)
    """Objects besides the pod (the cache's PersistentVolumeClaim)."""
    pod_security: dict[str, Any] = field(default_factory=dict)


def is_cached(isvc: InferenceService, effective: EffectiveSettings) -> bool:
    """The served model is downloaded by the init container (hf:// or s3:// with a cache)."""
    return isvc.spec.model.cache is not None and effective.model_uri.startswith(("hf://", "s3://"))


def pod_parts(
    isvc: InferenceService,
    effective: EffectiveSettings,
    *,
    labels: Mapping[str, str],
    fetch_image: str = DEFAULT_FETCH_IMAGE,
) -> PodParts:
    """Cache, download step and environment of the engine pod (`labels`: kvq's own)."""
    parts = PodParts()
    spec = isvc.spec
    token = spec.model.token_secret_ref
    token_env = (
        [
            {
                "name": "HF_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": token.name, "key": token.key}},
            }
        ]
        if token is not None
        else []
    )
    kvq_env: list[dict[str, Any]] = []
    if is_cached(isvc, effective):
        _add_cache(isvc, effective, parts, labels, fetch_image, token_env)
        # The engine reads the local copy; a stray Hub call fails at once instead of hanging.
        kvq_env.append({"name": "HF_HUB_OFFLINE", "value": "1"})
        model_env: list[dict[str, Any]] = []
        model_env_from: list[dict[str, Any]] = []
    else:
        # The engine downloads (hf://) or streams (s3://) the model itself.
        kvq_env.extend(token_env)
        model_env = [env_var(e) for e in spec.model.env]
        model_env_from = [env_from(e) for e in spec.model.env_from]
    if spec.engine.run_as_user is not None:
        # vllm/vllm-openai writes its caches under $HOME (/root): give another user one.
        kvq_env.append({"name": "HOME", "value": ENGINE_HOME})
        parts.volumes.append({"name": HOME_VOLUME, "emptyDir": {}})
        parts.engine_mounts.append({"name": HOME_VOLUME, "mountPath": ENGINE_HOME})
    parts.engine_env = merged_env([env_var(e) for e in spec.engine.env], model_env, kvq_env)
    parts.engine_env_from = model_env_from + [env_from(e) for e in spec.engine.env_from]
    return parts


def _add_cache(
    isvc: InferenceService,
    effective: EffectiveSettings,
    parts: PodParts,
    labels: Mapping[str, str],
    fetch_image: str,
    token_env: list[dict[str, Any]],
) -> None:
    cache = isvc.spec.model.cache
    assert cache is not None
    volume: dict[str, Any] = {"name": CACHE_VOLUME}
    if cache.claim_name is not None:
        volume["persistentVolumeClaim"] = {"claimName": cache.claim_name}
    elif cache.volume_claim is not None:
        claim = cache_claim(isvc, effective, cache.volume_claim, labels)
        parts.objects.append(claim)
        volume["persistentVolumeClaim"] = {"claimName": claim["metadata"]["name"]}
    else:
        assert cache.empty_dir is not None
        limit = cache.empty_dir.size_limit or default_cache_size(effective)
        volume["emptyDir"] = {"sizeLimit": limit} if limit else {}
    parts.volumes.append(volume)
    # The pod's own link to what this pod fetched, and the fetcher's scratch space.
    parts.volumes.append({"name": LINK_VOLUME, "emptyDir": {"sizeLimit": "1Gi"}})
    parts.engine_mounts += [
        {"name": CACHE_VOLUME, "mountPath": CACHE_MOUNT, "readOnly": True},
        {"name": LINK_VOLUME, "mountPath": MODEL_LINK_DIR, "readOnly": True},
    ]
    # Claims are usually root-owned: the download step writes as the image's user.
    parts.pod_security = {"fsGroup": FETCH_USER, "fsGroupChangePolicy": "OnRootMismatch"}
    parts.init_containers.append(_fetch_container(isvc, effective, fetch_image, token_env))


def _fetch_container(
    isvc: InferenceService,
    effective: EffectiveSettings,
    image: str,
    token_env: list[dict[str, Any]],
) -> dict[str, Any]:
    model = isvc.spec.model
    command = [
        "kvq",
        "fetch",
        "--uri",
        effective.model_uri,
        "--cache-dir",
        CACHE_MOUNT,
        "--link",
        MODEL_LINK,
    ]
    # The revision pins spec.model.uri; the AWQ variant is another repository.
    if model.revision is not None and effective.model_uri == model.uri:
        command += ["--revision", model.revision]
    scratch = [{"name": name, "value": FETCH_HOME} for name in ("HF_HOME", "HOME", "TMPDIR")]
    quiet = [
        {"name": "HF_HUB_DISABLE_PROGRESS_BARS", "value": "1"},
        {"name": "HF_HUB_DISABLE_TELEMETRY", "value": "1"},
        {"name": "HF_XET_CHUNK_CACHE_SIZE_BYTES", "value": "0"},
    ]
    container: dict[str, Any] = {
        "name": FETCH_CONTAINER,
        "image": image,
        "command": command,
        "env": merged_env([env_var(e) for e in model.env], scratch + quiet, token_env),
        "resources": {
            "requests": {"cpu": "1", "memory": "1Gi"},
            "limits": {"memory": "4Gi"},
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
            "runAsGroup": FETCH_USER,
            "runAsNonRoot": True,
            "runAsUser": FETCH_USER,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [
            {"name": CACHE_VOLUME, "mountPath": CACHE_MOUNT},
            {"name": LINK_VOLUME, "mountPath": MODEL_LINK_DIR},
        ],
    }
    env_from_list = [env_from(e) for e in model.env_from]
    if env_from_list:
        container["envFrom"] = env_from_list
    return container


def cache_claim(
    isvc: InferenceService,
    effective: EffectiveSettings,
    claim: CacheVolumeClaim,
    labels: Mapping[str, str],
) -> dict[str, Any]:
    """The PersistentVolumeClaim kvq owns; its name changes with what cannot be edited."""
    size = claim.size or default_cache_size(effective)
    if size is None:
        raise RenderError(
            "spec.model.cache.volumeClaim.size is needed: kvq does not know the size of "
            f"{effective.model_uri} (give spec.model.architecture, or a size)"
        )
    spec: dict[str, Any] = {
        "accessModes": [claim.access_mode],
        "resources": {"requests": {"storage": size}},
    }
    if claim.storage_class_name is not None:
        spec["storageClassName"] = claim.storage_class_name
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:8]
    metadata: dict[str, Any] = {
        "name": f"{isvc.metadata.name}-kvq-cache-{digest}",
        "labels": dict(labels),
    }
    if isvc.metadata.namespace:
        metadata["namespace"] = isvc.metadata.namespace
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata,
        "spec": spec,
    }


def default_cache_size(effective: EffectiveSettings) -> str | None:
    """Every model the cache may hold x 1.2 + 1 GiB, in whole GiB; None when unknown."""
    if effective.footprint is None:
        return None
    size = effective.footprint.cached_weight_bytes * _CACHE_HEADROOM + GIB
    return _gib(size)


def shm_size(isvc: InferenceService, nodes: int = 1) -> str:
    """/dev/shm: spec.engine.shmSize, else 1 GiB per GPU of the pod (a replica over
    `nodes` nodes has a pod on each, with its share of the GPUs)."""
    return isvc.spec.engine.shm_size or _gib(_SHM_PER_GPU * _pod_gpus(isvc, nodes))


def _pod_gpus(isvc: InferenceService, nodes: int) -> int:
    return isvc.spec.placement.gpus_per_replica // max(nodes, 1)


def container_resources(
    isvc: InferenceService, effective: EffectiveSettings, nodes: int = 1
) -> dict[str, Any]:
    """Requests and limits of the engine container: the spec's, else derived; plus GPUs.
    A replica over `nodes` nodes: one pod's (its share of the GPUs and derived memory)."""
    spec = isvc.spec
    tp = _pod_gpus(isvc, nodes)
    asked = spec.engine.resources
    requests = asked.requests if asked and asked.requests else ResourceAmounts()
    limits = asked.limits if asked and asked.limits else ResourceAmounts()
    derived_cpu = str(_BASE_CPU + _CPU_PER_GPU * tp)

    memory_request = _memory_request(isvc, effective, nodes)
    memory_limit = limits.memory or memory_request
    cpu_request = requests.cpu or _at_most(derived_cpu, limits.cpu)
    for name, low, high in (
        ("memory", memory_request, memory_limit),
        ("cpu", cpu_request, limits.cpu),
    ):
        if low is not None and high is not None and quantity_value(low) > quantity_value(high):
            raise RenderError(
                f"engine.resources: requests.{name} {low} is above limits.{name} {high}"
            )
    tier = host_tier_bytes(isvc, effective, nodes)
    if tier and memory_limit is not None and quantity_value(memory_limit) <= tier:
        # The tier is pinned at start-up: the kernel would kill the engine every time.
        raise RenderError(
            f"engine.resources: a memory limit of {memory_limit} cannot hold the KV cache's "
            f"CPU tier ({_gib(tier)}: memory.swapSpaceGiB x gpusPerReplica) besides the "
            "engine itself: raise the limit or lower swapSpaceGiB"
        )
    gpus = str(tp)
    out: dict[str, Any] = {
        "requests": {"cpu": cpu_request},
        # Requests of an extended resource default to its limit.
        "limits": {"nvidia.com/gpu": gpus},
    }
    if memory_request is not None:
        out["requests"]["memory"] = memory_request
    if memory_limit is not None:
        out["limits"]["memory"] = memory_limit
    if limits.cpu is not None:
        out["limits"]["cpu"] = limits.cpu
    return out


def memory_request_bytes(
    isvc: InferenceService, effective: EffectiveSettings, nodes: int = 1
) -> int | None:
    """The engine container's memory request in bytes (None: not derived, none asked):
    what a node of a pool must have allocatable for one replica (for one pod of a replica
    over `nodes` nodes)."""
    request = _memory_request(isvc, effective, nodes)
    return None if request is None else int(quantity_value(request))


def host_tier_bytes(isvc: InferenceService, effective: EffectiveSettings, nodes: int = 1) -> int:
    """Host memory of the KV cache's CPU tier, all GPUs of a pod (0: none)."""
    tier = effective.cpu_tier
    gib = host_tier_gib_per_gpu(tier.mode if tier else None, isvc.spec.memory.swap_space_gib)
    return int(gib * GIB * _pod_gpus(isvc, nodes))


def _memory_request(
    isvc: InferenceService, effective: EffectiveSettings, nodes: int = 1
) -> str | None:
    asked = isvc.spec.engine.resources
    requests = asked.requests if asked and asked.requests else ResourceAmounts()
    limits = asked.limits if asked and asked.limits else ResourceAmounts()
    return requests.memory or _at_most(_derived_memory(isvc, effective, nodes), limits.memory)


def _derived_memory(isvc: InferenceService, effective: EffectiveSettings, nodes: int) -> str | None:
    if effective.footprint is None:
        return None
    tp = _pod_gpus(isvc, nodes)
    # Each pod of a group loads its own pipeline stages: its share of the weights.
    total = (
        _BASE_MEMORY
        + _MEMORY_PER_GPU * tp
        + effective.footprint.served_weight_bytes // max(nodes, 1)
        + quantity_value(shm_size(isvc, nodes))
        + host_tier_bytes(isvc, effective, nodes)
    )
    return _gib(total)


def _at_most(derived: str | None, limit: str | None) -> str | None:
    """The derived request, lowered to a limit the spec sets below it."""
    if derived is None or limit is None:
        return derived
    return limit if quantity_value(limit) < quantity_value(derived) else derived


def startup_failure_threshold(isvc: InferenceService, effective: EffectiveSettings) -> int:
    """Start-up probe failures allowed (10 s apart): the model's load (and download) time."""
    if effective.footprint is None:
        return _STARTUP_UNKNOWN_THRESHOLD
    weights = effective.footprint.served_weight_bytes
    budget = max(_STARTUP_BASE_S + weights / _LOAD_BYTES_PER_S, _STARTUP_MIN_S)
    if not is_cached(isvc, effective) and effective.model_uri.startswith(("hf://", "s3://")):
        budget = max(budget + weights / _DOWNLOAD_BYTES_PER_S, _STARTUP_MIN_DOWNLOAD_S)
    return math.ceil(budget / _STARTUP_PERIOD_S)


def engine_security_context(isvc: InferenceService) -> dict[str, Any]:
    """Non-root when spec.engine.runAsUser says so; every capability dropped either way."""
    context: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    user = isvc.spec.engine.run_as_user
    if user is not None:
        context.update({"runAsNonRoot": True, "runAsUser": user, "runAsGroup": user})
    return context


def pod_settings(isvc: InferenceService, selector: Mapping[str, str]) -> dict[str, Any]:
    """Pod-level fields: identity, pull secrets, affinity, spread, priority."""
    spec = isvc.spec
    out: dict[str, Any] = {
        # Engines never call the Kubernetes API; workload identity mounts its own token.
        "automountServiceAccountToken": False,
    }
    if spec.pod.service_account_name is not None:
        out["serviceAccountName"] = spec.pod.service_account_name
    if spec.pod.image_pull_secrets:
        out["imagePullSecrets"] = [{"name": s.name} for s in spec.pod.image_pull_secrets]
    placement = spec.placement
    if placement.affinity is not None:
        affinity = pruned(placement.affinity.to_kube())
        if affinity:
            out["affinity"] = affinity
    if placement.topology_spread_constraints:
        constraints = []
        for constraint in placement.topology_spread_constraints:
            item = pruned(constraint.to_kube())
            item.setdefault("labelSelector", {"matchLabels": dict(selector)})
            constraints.append(item)
        out["topologySpreadConstraints"] = constraints
    if placement.priority_class_name is not None:
        out["priorityClassName"] = placement.priority_class_name
    return out


def env_var(var: EnvVar) -> dict[str, Any]:
    if var.value_from is not None:
        return {"name": var.name, "valueFrom": pruned(var.value_from.to_kube())}
    if var.value is None:
        return {"name": var.name}
    return {"name": var.name, "value": var.value}


def env_from(source: EnvFromSource) -> dict[str, Any]:
    out: dict[str, Any] = pruned(source.to_kube())
    return out


def merged_env(*layers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per name, later layers winning (kvq's own last), sorted by name."""
    merged: dict[str, dict[str, Any]] = {}
    for layer in layers:
        for var in layer:
            merged[str(var["name"])] = var
    return [merged[name] for name in sorted(merged)]


def pruned(value: Any) -> Any:
    """Without empty lists and maps: what the API server stores, so applies compare equal."""
    if isinstance(value, dict):
        out = {k: pruned(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in ({}, [], None)}
    if isinstance(value, list):
        return [pruned(v) for v in value]
    return value


def _gib(size_bytes: float) -> str:
    return f"{math.ceil(size_bytes / GIB)}Gi"
