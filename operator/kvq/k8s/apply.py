"""Server-side apply with one field manager, writing only when the server says it would change.

A dry-run apply returns exactly what the server would store (defaults, other managers'
fields, admission included); comparing it with the live object tells "nothing to do" from
"something changed" without ever copying an API default into kvq.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes.dynamic.exceptions import NotFoundError

from kvq.api import keys
from kvq.decide.types import Manifest, ObjectRef
from kvq.k8s.clients import Clients
from kvq.metrics import count_write

# Metadata the server owns or bumps on every write; never a reason to apply.
_COMPARED_METADATA = ("labels", "annotations", "ownerReferences", "finalizers")
_SERVER_OWNED_TOP_LEVEL = ("metadata", "status")


@dataclass(frozen=True)
class ApplyResult:
    kind: str
    name: str
    written: bool
    """True when a real apply was sent (the object was created or changed)."""
    live: Manifest
    """The object as the server stores it after this call (the dry-run view when unchanged)."""


def apply_manifest(clients: Clients, manifest: Manifest) -> ApplyResult:
    """Make the server hold `manifest`'s fields (force: kvq owns what it renders)."""
    kind = manifest["kind"]
    meta = manifest["metadata"]
    name, namespace = meta["name"], meta.get("namespace")
    resource = clients.resource(manifest["apiVersion"], kind)
    live = _read(clients, resource, name, namespace)
    if live is not None:
        preview = _server_side_apply(clients, resource, manifest, namespace, dry_run=True)
        if comparable(preview) == comparable(live):
            return ApplyResult(kind, name, written=False, live=preview)
    stored = _server_side_apply(clients, resource, manifest, namespace, dry_run=False)
    count_write(kind, "apply")
    return ApplyResult(kind, name, written=True, live=stored)


def delete_object(clients: Clients, ref: ObjectRef) -> bool:
    """Delete an object kvq rendered earlier; False when it is gone or not kvq's to delete."""
    resource = clients.resource(ref.api_version, ref.kind)
    live = _read(clients, resource, ref.name, ref.namespace)
    if live is None:
        return False
    labels = (live.get("metadata") or {}).get("labels") or {}
    if labels.get(keys.LABEL_MANAGED_BY) != keys.MANAGED_BY_VALUE:
        # Someone else's object with the same name: never delete what kvq did not create.
        return False
    try:
        clients.dynamic.delete(
            resource,
            name=ref.name,
            namespace=ref.namespace,
            body={
                "propagationPolicy": "Background",
                # Only the object we just read, not one recreated under the same name since.
                "preconditions": {"uid": live["metadata"]["uid"]},
            },
        )
    except NotFoundError:
        return False
    count_write(ref.kind, "delete")
    return True


def comparable(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of an object a write can change on kvq's behalf (no status, no bookkeeping)."""
    meta = obj.get("metadata") or {}
    view: dict[str, Any] = {k: v for k, v in obj.items() if k not in _SERVER_OWNED_TOP_LEVEL}
    view["metadata"] = {k: meta[k] for k in _COMPARED_METADATA if meta.get(k)}
    return view


def _read(clients: Clients, resource: Any, name: str, namespace: str | None) -> Manifest | None:
    try:
        found = clients.dynamic.get(resource, name=name, namespace=namespace)
    except NotFoundError:
        return None
    return _plain(found)


def _server_side_apply(
    clients: Clients, resource: Any, manifest: Manifest, namespace: str | None, *, dry_run: bool
) -> Manifest:
    result = clients.dynamic.server_side_apply(
        resource,
        body=manifest,
        namespace=namespace,
        field_manager=keys.FIELD_MANAGER,
        force_conflicts=True,
        dry_run="All" if dry_run else None,
    )
    return _plain(result)


def _plain(instance: Any) -> Manifest:
    plain: Manifest = instance.to_dict()
    return plain
