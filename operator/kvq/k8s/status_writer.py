"""The InferenceService status subresource: written only when it changes, never blindly.

The write carries the resourceVersion the reconcile read, so a status computed from a stale
snapshot fails with 409 instead of overwriting newer facts (StatusConflictError: decide
again). Whether it changed is judged against the watch cache, without a request; a status
the server stores in another form than kvq sent (pruned or defaulted fields) is remembered,
so it is not written again and again.
"""

from __future__ import annotations

import copy
import hashlib
import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

from kvq.api import keys
from kvq.api.keys import GROUP, KIND, PLURAL, VERSION
from kvq.decide.types import Manifest
from kvq.k8s.clients import Clients
from kvq.metrics import count_write


class StatusConflictError(RuntimeError):
    """The InferenceService changed after it was read; decide again from a fresh view."""


class ObjectGoneError(RuntimeError):
    """The InferenceService was deleted while it was being reconciled: nothing left to do."""


@dataclass
class StoredForms:
    """Statuses the server holds although the cache does not show them as sent: stored in
    another form (pruned or defaulted fields), or written a moment ago and not yet seen
    through the watch. uid -> (digest of the status sent, what the cache shows for it)."""

    _forms: dict[str, tuple[str, str]] = field(default_factory=dict)
    _after: dict[str, tuple[str, str, Any]] = field(default_factory=dict)
    """uid -> (the resourceVersion a status write replaced, the one it made, the status the
    server returned)."""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def matches(self, uid: str, desired: Manifest, shown: str) -> bool:
        with self._lock:
            return self._forms.get(uid) == (_digest(desired), shown)

    def remember(self, uid: str, desired: Manifest, shown: str) -> None:
        with self._lock:
            self._forms[uid] = (_digest(desired), shown)

    def forget(self, uid: str) -> None:
        with self._lock:
            self._forms.pop(uid, None)
            self._after.pop(uid, None)

    def newest(self, isvc: Mapping[str, Any]) -> Mapping[str, Any]:
        """`isvc`, or the object kvq's own status write made of it when the watch has not
        delivered that yet: deciding from the version a write replaced only earns a 409
        and a second decision."""
        meta = isvc["metadata"]
        with self._lock:
            after = self._after.get(meta["uid"])
            if after is None:
                return isvc
            if after[0] != meta.get("resourceVersion"):
                del self._after[meta["uid"]]  # the watch has caught up (or moved on)
                return isvc
            # Only the status changed (a write from a stale spec would have been a 409).
            return {
                **isvc,
                "metadata": {**meta, "resourceVersion": after[1]},
                "status": copy.deepcopy(after[2]),  # the pass may change its copy
            }

    def written(self, uid: str, replaced: str, returned: Mapping[str, Any]) -> None:
        made = str((returned.get("metadata") or {}).get("resourceVersion", ""))
        with self._lock:
            self._after[uid] = (replaced, made, returned.get("status"))


def write_status(
    clients: Clients, isvc: Mapping[str, Any], desired: Manifest, forms: StoredForms
) -> bool:
    """Replace `status` with `desired` unless the cache already holds it; True if written."""
    meta = isvc["metadata"]
    stored = without_nulls(isvc.get("status") or {})
    wanted = without_nulls(desired)
    uid = meta["uid"]
    if wanted == stored or forms.matches(uid, wanted, _digest(stored)):
        return False
    if forms.matches(uid, wanted, f"rv:{meta['resourceVersion']}"):
        return False  # written from this very version a moment ago; the watch lags
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
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{meta['namespace']}/{PLURAL}/{meta['name']}"
    try:
        response = clients.call(
            "put", f"{path}/status", body=body, query=[("fieldManager", keys.FIELD_MANAGER)]
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
    count_write(KIND, "status")
    result: dict[str, Any] = json.loads(response.data)
    forms.written(uid, meta["resourceVersion"], result)
    written = without_nulls(result.get("status") or {})
    if written != wanted:
        forms.remember(uid, wanted, _digest(written))  # the server's form of `wanted`
    else:
        forms.remember(uid, wanted, f"rv:{meta['resourceVersion']}")
    return True


def without_nulls(value: Any) -> Any:
    """`value` with null and empty members dropped: absent and null mean the same in status."""
    if isinstance(value, Mapping):
        pruned = {k: without_nulls(v) for k, v in value.items()}
        return {k: v for k, v in pruned.items() if v not in (None, {}, [])}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


def _digest(value: Any) -> str:
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()
