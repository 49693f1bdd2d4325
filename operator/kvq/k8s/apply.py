"""Server-side apply with one field manager, sent only when the live object differs.

The live object comes from the operator's watch cache (kopf indices), so a pass that
changes nothing makes no API call. "Differs" means a field kvq renders is missing or has
another value in the live object (fields the server or other managers add are ignored).
When the cache says "differs" but the reason may be only the server's normal form (a
quantity spelled differently), a dry-run apply decides, and the verdict is remembered for
that resourceVersion so it is never asked twice.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes.dynamic.exceptions import NotFoundError

from kvq.api import keys
from kvq.decide.types import Manifest, ObjectRef
from kvq.k8s.clients import Clients
from kvq.metrics import count_read, count_write

# Metadata kvq renders and compares; the rest (uid, resourceVersion, managedFields, ...) is
# the server's.
_COMPARED_METADATA = ("labels", "annotations", "ownerReferences")


@dataclass(frozen=True)
class ApplyResult:
    kind: str
    name: str
    written: bool
    """True when a real apply was sent (the object was created or changed)."""


@dataclass
class SameAsServer:
    """Manifests the server holds already although the cache does not show it: the server
    said so (a dry run), or kvq just applied them and the watch has not caught up. Valid
    while the cache shows the resourceVersion it showed then."""

    _verdicts: dict[tuple[str, str, str, str], tuple[str, str]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def holds(self, manifest: Manifest, live: Mapping[str, Any] | None) -> bool:
        with self._lock:
            return self._verdicts.get(_ident(manifest)) == (_digest(manifest), _version(live))

    def remember(self, manifest: Manifest, live: Mapping[str, Any] | None) -> None:
        with self._lock:
            self._verdicts[_ident(manifest)] = (_digest(manifest), _version(live))

    def forget(self, namespace: str, owner: str) -> None:
        """Drop what was remembered of one InferenceService's objects (it is gone)."""
        with self._lock:
            for ident in [i for i in self._verdicts if i[1] == namespace and i[3] == owner]:
                del self._verdicts[ident]


def apply_manifest(
    clients: Clients,
    manifest: Manifest,
    live: Mapping[str, Any] | None,
    same: SameAsServer,
) -> ApplyResult:
    """Make the server hold `manifest`'s fields (force: kvq owns what it renders).

    `live` is the object as the watch cache has it (None: absent).
    """
    kind = manifest["kind"]
    name = manifest["metadata"]["name"]
    if in_place(manifest, live, same):
        return ApplyResult(kind, name, written=False)
    resource = clients.resource(manifest["apiVersion"], kind)
    namespace = manifest["metadata"].get("namespace")
    if live is not None:
        preview = _server_side_apply(clients, resource, manifest, namespace, dry_run=True)
        if _comparable(preview) == _comparable(live):
            # Only the form differs (defaults, normalised quantities): remember it.
            same.remember(manifest, live)
            return ApplyResult(kind, name, written=False)
    _server_side_apply(clients, resource, manifest, namespace, dry_run=False)
    count_write(kind, "apply")
    same.remember(manifest, live)  # until the watch delivers what was just written
    return ApplyResult(kind, name, written=True)


def in_place(manifest: Manifest, live: Mapping[str, Any] | None, same: SameAsServer) -> bool:
    """The server holds `manifest` already, as far as kvq knows without asking it."""
    return (live is not None and holds(manifest, live)) or same.holds(manifest, live)


def holds(desired: Any, live: Any) -> bool:
    """Every field of `desired` is in `live` with the same value (lists item by item)."""
    if isinstance(desired, Mapping):
        if not isinstance(live, Mapping):
            return False
        return all(k in live and holds(v, live[k]) for k, v in desired.items() if v is not None)
    if isinstance(desired, list):
        if not isinstance(live, list) or len(desired) != len(live):
            return False
        return all(holds(d, x) for d, x in zip(desired, live, strict=True))
    if isinstance(desired, bool) or isinstance(live, bool):
        return desired is live
    return bool(desired == live)


def delete_object(clients: Clients, ref: ObjectRef, live: Mapping[str, Any]) -> bool:
    """Delete an object kvq rendered earlier; False when it is gone or not kvq's."""
    labels = (live.get("metadata") or {}).get("labels") or {}
    if labels.get(keys.LABEL_MANAGED_BY) != keys.MANAGED_BY_VALUE:
        # Someone else's object with the same name: never delete what kvq did not create.
        return False
    resource = clients.resource(ref.api_version, ref.kind)
    try:
        clients.dynamic.delete(
            resource,
            name=ref.name,
            namespace=ref.namespace,
            body={
                "propagationPolicy": "Background",
                # Only the object we saw, not one recreated under the same name since.
                "preconditions": {"uid": live["metadata"]["uid"]},
            },
        )
    except NotFoundError:
        return False
    count_write(ref.kind, "delete")
    return True


def _comparable(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The parts of an object a write can change on kvq's behalf (no status, no bookkeeping)."""
    meta = obj.get("metadata") or {}
    view: dict[str, Any] = {k: v for k, v in obj.items() if k not in ("metadata", "status")}
    view["metadata"] = {k: meta[k] for k in _COMPARED_METADATA if meta.get(k)}
    return view


def _server_side_apply(
    clients: Clients, resource: Any, manifest: Manifest, namespace: str | None, *, dry_run: bool
) -> Manifest:
    if dry_run:
        count_read(manifest["kind"], "dry-run")
    response = server_side_apply(
        clients.dynamic,
        resource,
        manifest,
        namespace,
        field_manager=keys.FIELD_MANAGER,
        force=True,
        dry_run=dry_run,
        serialize=False,
    )
    # Read whole even when nobody needs it (a real apply's answer: the watch brings the
    # object): urllib3 hands the connection back to the pool only at the body's end; unread,
    # every apply opened a new TLS connection (19% of kvq's CPU in `make bench`, and the API
    # server's handshakes).
    answer = response.data
    if not dry_run:
        return {}
    preview: Manifest = json.loads(answer)
    return preview


def server_side_apply(
    dynamic: Any,
    resource: Any,
    manifest: Mapping[str, Any],
    namespace: str | None,
    *,
    field_manager: str,
    force: bool,
    dry_run: bool = False,
    serialize: bool = True,
) -> Any:
    """Server-side apply of `manifest` (with the dynamic client, untyped: Any), its body
    serialized by `apply_body`. `serialize=False` returns the raw HTTP response instead of
    the client's ResourceInstance, whose object-per-field wrapping of the whole answer
    costs more CPU than the request itself."""
    meta = manifest["metadata"]
    body = apply_body(manifest)
    return dynamic.patch(
        resource,
        body=body,
        name=meta["name"],
        namespace=namespace or meta.get("namespace"),
        content_type="application/apply-patch+yaml",
        field_manager=field_manager,
        force_conflicts=True if force else None,
        dry_run="All" if dry_run else None,
        serialize=serialize,
    )


# Characters JSON leaves raw that the API server's YAML reader refuses ("control characters
# are not allowed") or reads as line breaks (NEL, LS, PS), and lone surrogates.
_YAML_UNSAFE = re.compile("[\x7f-\x9f\u2028\u2029\ufffe\uffff\ud800-\udfff]")


def apply_body(manifest: Mapping[str, Any]) -> bytes:
    """An apply patch as the API server reads it: UTF-8 JSON (JSON is YAML, and apply
    patches are decoded as YAML).

    The client's own `server_side_apply` sends json.dumps of the body, which escapes a
    character beyond U+FFFF (an emoji in an env value) as a surrogate pair, and YAML refuses
    surrogate escapes (400). Here such characters are sent as they are; the few a YAML reader
    refuses or folds are escaped as \\uXXXX, which it reads back as the character.
    """
    text = json.dumps(manifest, ensure_ascii=False, separators=(",", ":"))
    return _YAML_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text).encode("utf-8")


def _ident(manifest: Mapping[str, Any]) -> tuple[str, str, str, str]:
    meta = manifest.get("metadata") or {}
    owner = (meta.get("labels") or {}).get(keys.LABEL_INFERENCESERVICE, "")
    return (str(manifest.get("kind")), str(meta.get("namespace")), str(meta.get("name")), owner)


def _digest(manifest: Mapping[str, Any]) -> str:
    canonical = json.dumps(manifest, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def manifest_digest(manifest: Mapping[str, Any]) -> str:
    """Equal for equal manifests (whatever their keys' order)."""
    return _digest(manifest)


def _version(live: Mapping[str, Any] | None) -> str:
    return str(((live or {}).get("metadata") or {}).get("resourceVersion", ""))
