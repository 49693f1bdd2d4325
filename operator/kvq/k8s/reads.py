"""Fresh reads the executor's callers need besides kopf's cache (after a conflict)."""

from __future__ import annotations

from typing import Any, cast

from kvq.api.models import GROUP, PLURAL, VERSION
from kvq.k8s.clients import Clients


def read_inference_service(clients: Clients, namespace: str, name: str) -> dict[str, Any]:
    api = clients.custom
    found = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    return cast(dict[str, Any], found)
