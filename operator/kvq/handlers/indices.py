"""kopf indices: what reconcile reads instead of listing the API on every pass.

Nodes by name (pool discovery); engine Pods and the objects kvq renders (ConfigMap,
Deployment, Service, PodDisruptionBudget), labelled managed-by kvq, by (namespace,
InferenceService name) from the `kvq.dev/inferenceservice` label.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from kvq.api import keys

EngineKey = tuple[str, str]

MANAGED_BY_KVQ = {keys.LABEL_MANAGED_BY: keys.MANAGED_BY_VALUE}


def kvq_nodes(name: str, body: Mapping[str, Any], **_: Any) -> dict[str, dict[str, Any]]:
    return {name: plain(body)}


def by_inference_service(
    namespace: str | None, labels: Mapping[str, str], body: Mapping[str, Any], **_: Any
) -> dict[EngineKey, dict[str, Any]]:
    owner = labels.get(keys.LABEL_INFERENCESERVICE)
    return {(namespace, owner): plain(body)} if owner and namespace else {}


# Index id (the kwarg name kopf passes it under) -> (group, version, plural).
POD_INDEX = "kvq_pods"
OWNED_INDICES: dict[str, tuple[str, str, str]] = {
    "kvq_configmaps": ("", "v1", "configmaps"),
    "kvq_deployments": ("apps", "v1", "deployments"),
    "kvq_services": ("", "v1", "services"),
    "kvq_pdbs": ("policy", "v1", "poddisruptionbudgets"),
}


def plain(body: Mapping[str, Any]) -> dict[str, Any]:
    """A detached copy: kopf's bodies are live views that change under a running reconcile."""
    return copy.deepcopy(dict(body))
