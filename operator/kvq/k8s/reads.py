"""Fresh reads the executor's callers need besides kopf's cache (after a conflict)."""

from __future__ import annotations

from typing import Any, cast

from kubernetes.client.exceptions import ApiException

from kvq.api.models import GROUP, KIND, PLURAL, VERSION
from kvq.k8s.clients import Clients
from kvq.k8s.status import ObjectGoneError


def read_inference_service(clients: Clients, namespace: str, name: str) -> dict[str, Any]:
    try:
        found = clients.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    except ApiException as error:
        if error.status == 404:
            raise ObjectGoneError(f"{KIND} {namespace}/{name} is gone") from error
        raise
    return cast(dict[str, Any], found)
