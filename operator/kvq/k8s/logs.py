"""Bounded tails of a crashed container's previous log (failure evidence for the classifier)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from kubernetes.client.exceptions import ApiException

from kvq.decide.types import OperatorConfig
from kvq.k8s.clients import Clients

log = logging.getLogger(__name__)


def read_log_tails(
    clients: Clients,
    namespace: str,
    pod_names: Iterable[str],
    pods: Iterable[Mapping[str, Any]],
    config: OperatorConfig,
) -> dict[str, str]:
    """Pod name -> the last lines of its first container's previous run; missing ones left out."""
    containers = {(p.get("metadata") or {}).get("name"): _first_container(p) for p in pods}
    tails: dict[str, str] = {}
    for name in pod_names:
        query = [
            ("previous", "true"),
            ("tailLines", config.log_tail_lines),
            ("limitBytes", config.log_tail_bytes),
        ]
        if containers.get(name):
            query.append(("container", containers[name]))
        try:
            path = f"/api/v1/namespaces/{namespace}/pods/{name}/log"
            response = clients.call("get", path, query=query, accept="text/plain, */*")
        except ApiException as error:
            # No previous container yet, the pod is gone, or the node cannot serve logs:
            # the decision goes on with the termination message alone.
            log.info("no previous log for pod %s/%s: HTTP %s", namespace, name, error.status)
            continue
        tails[name] = response.data.decode(errors="replace")
    return tails


def _first_container(pod: Mapping[str, Any]) -> str | None:
    containers = (pod.get("spec") or {}).get("containers") or []
    return str(containers[0]["name"]) if containers else None
