"""GPUs a pod or a pod template asks for: what both bound pods and GPU claims count."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvq.api import keys


def gpus_of(pod_spec: Mapping[str, Any]) -> int:
    """GPUs a pod (or a pod template) asks for: each container's limit, else its request."""
    gpus = 0
    for container in pod_spec.get("containers") or []:
        resources = container.get("resources") or {}
        wanted = (resources.get("limits") or {}).get(keys.GPU_RESOURCE) or (
            resources.get("requests") or {}
        ).get(keys.GPU_RESOURCE)
        gpus += whole_number(wanted)
    return gpus


def whole_number(value: Any) -> int:
    """Whole-number quantities (GPU counts, MiB labels); anything else counts as 0."""
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0
