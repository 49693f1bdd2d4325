"""The live engine workload of a service: its Deployment, or the LeaderWorkerSet of a
replica over several nodes seen as one.

decide() reads rollout and readiness from a Deployment's fields (the pod template's spec
hash, replicas, observedGeneration, updated/ready/available replicas). A LeaderWorkerSet
(leaderworkerset.x-k8s.io/v1, controller v0.9.0) reports the same per group: readyReplicas
counts groups whose leader and every worker are ready, updatedReplicas groups on the
current template, and its Available condition says every group is ready and updated
(Progressing while one is not). It has no availableReplicas: the view counts the ready
groups available only while Available is True, so a multi-node service is Ready exactly
when LWS says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvq.render.leaderworkerset import group_name

ENGINE_KINDS = ("Deployment", "LeaderWorkerSet")


def live_engine(owned: Sequence[Mapping[str, Any]], name: str) -> Mapping[str, Any] | None:
    """The engine workload of the objects named for `name`: the Deployment `name`, else
    the LeaderWorkerSet `name-group` as a Deployment would read (None: neither)."""
    group = None
    for obj in owned:
        found = (obj.get("metadata") or {}).get("name")
        if obj.get("kind") == "Deployment" and found == name:
            return obj
        if obj.get("kind") == "LeaderWorkerSet" and found == group_name(name):
            group = obj
    return None if group is None else group_as_deployment(group)


def group_as_deployment(group: Mapping[str, Any]) -> dict[str, Any]:
    """A LeaderWorkerSet in a Deployment's terms: the leader's template, its replicas, and
    its status by group."""
    spec = group.get("spec") or {}
    template = (spec.get("leaderWorkerTemplate") or {}).get("leaderTemplate") or {}
    status = group.get("status") or {}
    ready = int(status.get("readyReplicas") or 0)
    available = any(
        c.get("type") == "Available" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    view_spec: dict[str, Any] = {"template": template}
    if "replicas" in spec:
        view_spec["replicas"] = spec["replicas"]
    return {
        "apiVersion": group.get("apiVersion"),
        "kind": group.get("kind"),
        "metadata": group.get("metadata") or {},
        "spec": view_spec,
        "status": {
            "observedGeneration": int(status.get("observedGeneration") or 0),
            "replicas": int(status.get("replicas") or 0),
            "updatedReplicas": int(status.get("updatedReplicas") or 0),
            "readyReplicas": ready,
            "availableReplicas": ready if available else 0,
        },
    }
