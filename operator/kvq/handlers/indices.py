"""kopf indices: what reconcile reads instead of asking the API server.

Engine Pods and the objects kvq renders (ConfigMap, Deployment or LeaderWorkerSet, Service,
PodDisruptionBudget, ...), labelled managed-by kvq, by (namespace, InferenceService name);
bodies are kept without managedFields (the largest part of an object, and nothing kvq
reads). Nodes, every pod's GPUs and the GPUs kvq's Deployments and LeaderWorkerSets claim of
their pools feed the
runtime's Fleet instead (the pools, kept counted): their index handlers keep nothing, and
are index handlers because kopf calls those for the whole first listing before it lets
any handler or daemon run, so the first decisions see every node and pod.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from kvq.api import keys
from kvq.placement.claims import gpu_claim
from kvq.placement.discovery import gpu_pod

EngineKey = tuple[str, str]

MANAGED_BY_KVQ = {keys.LABEL_MANAGED_BY: keys.MANAGED_BY_VALUE}


def kvq_nodes(name: str, body: Mapping[str, Any], memo: Any, **_: Any) -> dict[str, Any]:
    memo.runtime.fleet.node(name, body)
    return {}


def by_inference_service(
    namespace: str | None, labels: Mapping[str, str], body: Mapping[str, Any], **_: Any
) -> dict[EngineKey, dict[str, Any]]:
    owner = labels.get(keys.LABEL_INFERENCESERVICE)
    return {(namespace, owner): stored(body)} if owner and namespace else {}


def gpu_pods(uid: str, body: Mapping[str, Any], memo: Any, **_: Any) -> dict[str, Any]:
    memo.runtime.fleet.pod(uid, gpu_pod(body))
    return {}


def gpu_claims(
    namespace: str, name: str, body: Mapping[str, Any], memo: Any, **_: Any
) -> dict[str, Any]:
    memo.runtime.fleet.deployment((namespace, name), gpu_claim(body))
    return {}


# Index id (the kwarg name kopf passes it under) -> (group, version, plural).
POD_INDEX = "kvq_pods"
GPU_POD_INDEX = "kvq_gpu_pods"
GPU_CLAIM_INDEX = "kvq_gpu_claims"
GROUP_CLAIM_INDEX = "kvq_group_claims"
NODE_INDEX = "kvq_nodes"
OWNED_INDICES: dict[str, tuple[str, str, str]] = {
    "kvq_configmaps": ("", "v1", "configmaps"),
    "kvq_deployments": ("apps", "v1", "deployments"),
    "kvq_services": ("", "v1", "services"),
    "kvq_pdbs": ("policy", "v1", "poddisruptionbudgets"),
    "kvq_jobs": ("batch", "v1", "jobs"),
    "kvq_pvcs": ("", "v1", "persistentvolumeclaims"),
    # KEDA's and the Gateway API's, when installed (kopf watches them once their CRDs are).
    "kvq_scaledobjects": ("keda.sh", "v1alpha1", "scaledobjects"),
    "kvq_httproutes": ("gateway.networking.k8s.io", "v1", "httproutes"),
    "kvq_inferencepools": ("inference.networking.k8s.io", "v1", "inferencepools"),
    # LeaderWorkerSet's, when installed: the engine of a replica over several nodes.
    "kvq_leaderworkersets": ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets"),
}


def stored(body: Mapping[str, Any]) -> dict[str, Any]:
    """What an index keeps of a watched object: its parsed event, without managedFields;
    of a pod, what kvq reads (metadata, status, its containers' names); a ConfigMap's long
    values shared with the other ConfigMaps holding the same text.

    kopf parses every watch event into new dicts and never changes them afterwards (a
    newer event replaces the object whole), so sharing them costs no copy; kvq only reads
    them. The rest of the event is freed with it."""
    kept = dict(body)
    metadata = kept.get("metadata")
    if isinstance(metadata, Mapping) and "managedFields" in metadata:
        kept["metadata"] = {k: v for k, v in metadata.items() if k != "managedFields"}
    kind = kept.get("kind")
    if kind == "Pod":
        # The spec is most of a pod (the engine's command, env, probes, volumes); kvq reads
        # its status, and the first container's name for its log. A fleet's pods: 16 MB.
        spec = kept.get("spec") or {}
        containers = [{"name": c.get("name")} for c in spec.get("containers") or []]
        kept["spec"] = {"nodeName": spec.get("nodeName"), "containers": containers}
    elif kind == "ConfigMap" and isinstance(kept.get("data"), Mapping):
        # Every engine's evidence wrapper is the same 10 KB script: one copy, not 1,000.
        kept["data"] = {k: _shared(v) for k, v in kept["data"].items()}
    return kept


_SHARED_LIMIT = 256
_SHARED_MIN_LENGTH = 1024
_texts: dict[str, str] = {}


def _shared(value: Any) -> Any:
    if not isinstance(value, str) or len(value) < _SHARED_MIN_LENGTH:
        return value
    if value not in _texts and len(_texts) >= _SHARED_LIMIT:
        _texts.clear()
    return _texts.setdefault(value, value)


def plain(body: Mapping[str, Any]) -> dict[str, Any]:
    """A detached copy without managedFields: the InferenceService's body is a live view
    that kopf changes under a running reconcile."""
    copied = copy.deepcopy(dict(body))
    metadata = copied.get("metadata")
    if isinstance(metadata, dict):
        metadata.pop("managedFields", None)
    return copied
