"""The InferenceService status subresource: written only when it changes, never blindly.

The write carries the resourceVersion the reconcile read, so a status computed from a stale
snapshot fails with 409 instead of overwriting newer facts (StatusConflictError: retry).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from kubernetes.client.exceptions import ApiException

from kvq.api import keys
from kvq.api.models import GROUP, KIND, PLURAL, VERSION
from kvq.decide.types import Manifest
from kvq.k8s.clients import Clients
from kvq.metrics import count_write


class StatusConflictError(RuntimeError):
    """The InferenceService changed after it was read; decide again from a fresh read."""


class ObjectGoneError(RuntimeError):
    """The InferenceService was deleted while it was being reconciled: nothing left to do."""


def write_status(clients: Clients, isvc: Mapping[str, Any], desired: Manifest) -> bool:
    """Replace `status` with `desired` unless the server already stores it; True if written."""
    stored = isvc.get("status") or {}
    if without_nulls(desired) == without_nulls(stored):
        return False
    meta = isvc["metadata"]
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "resourceVersion": meta["resourceVersion"],
        },
        "status": desired,
    }
    # Schema defaults or pruning can make `desired` differ in form only: let the server say.
    preview = _replace_status(clients, meta, body, dry_run=True)
    if without_nulls(preview.get("status") or {}) == without_nulls(stored):
        return False
    _replace_status(clients, meta, body, dry_run=False)
    count_write(KIND, "status")
    return True


def without_nulls(value: Any) -> Any:
    """`value` with null and empty members dropped: absent and null mean the same in status."""
    if isinstance(value, Mapping):
        pruned = {k: without_nulls(v) for k, v in value.items()}
        return {k: v for k, v in pruned.items() if v not in (None, {}, [])}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


def _replace_status(
    clients: Clients, meta: Mapping[str, Any], body: Manifest, *, dry_run: bool
) -> Manifest:
    api = clients.custom
    try:
        result = api.replace_namespaced_custom_object_status(
            GROUP,
            VERSION,
            meta["namespace"],
            PLURAL,
            meta["name"],
            body,
            dry_run="All" if dry_run else None,
            field_manager=keys.FIELD_MANAGER,
        )
    except ApiException as error:
        if error.status == 404:
            raise ObjectGoneError(f"{KIND} {meta['namespace']}/{meta['name']} is gone") from error
        if error.status == 409:
            raise StatusConflictError(
                f"{KIND} {meta['namespace']}/{meta['name']} changed since resourceVersion "
                f"{meta['resourceVersion']}"
            ) from error
        raise
    return cast(Manifest, result)
