"""A minimal JSON-over-HTTPS client for the harness's own few API calls.

The harness avoids the kubernetes client on purpose: importing it costs seconds, and
`up`/`down`/`status` only need to create Nodes and read a few lists.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def tls_context(ca: Path, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    if cert is not None and key is not None:
        ctx.load_cert_chain(str(cert), str(key))
    return ctx


def get_ok(url: str, ctx: ssl.SSLContext | None = None) -> bool:
    """True when `url` answers 200 (a health endpoint); False on any error."""
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@dataclass(frozen=True)
class Rest:
    server: str
    ctx: ssl.SSLContext

    def get(self, path: str) -> Any:
        return self._call("GET", path, None)

    def get_text(self, path: str) -> str:
        """A plain-text endpoint such as /metrics."""
        request = urllib.request.Request(f"{self.server}{path}", headers={"Accept": "text/plain"})
        with urllib.request.urlopen(request, context=self.ctx, timeout=30) as response:
            return str(response.read().decode())

    def post(self, path: str, body: dict[str, Any]) -> Any:
        return self._call("POST", path, body)

    def apply(self, obj: dict[str, Any], field_manager: str = "kvq-dev-cluster") -> Any:
        """Server-side apply of one object (created or updated; conflicts forced)."""
        path = f"{object_path(obj)}?fieldManager={field_manager}&force=true"
        return self._call("PATCH", path, obj, "application/apply-patch+yaml")

    def _call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        content_type: str = "application/json",
    ) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"{self.server}{path}",
            data=data,
            method=method,
            headers={"Content-Type": content_type, "Accept": "application/json"},
        )
        with urllib.request.urlopen(request, context=self.ctx, timeout=10) as response:
            return json.loads(response.read())


# Kinds the harness applies that are not namespaced (everything else is).
_CLUSTER_SCOPED = {
    "APIService",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
    "GatewayClass",
    "MutatingWebhookConfiguration",
    "Namespace",
    "Node",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "ValidatingWebhookConfiguration",
}


def object_path(obj: dict[str, Any]) -> str:
    """The REST path of an object from its apiVersion, kind, namespace and name."""
    api_version, kind, meta = obj["apiVersion"], obj["kind"], obj["metadata"]
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    if kind not in _CLUSTER_SCOPED:
        base += f"/namespaces/{meta.get('namespace', 'default')}"
    return f"{base}/{_plural(kind)}/{meta['name']}"


def _plural(kind: str) -> str:
    lower = kind.lower()
    if lower.endswith("y") and lower[-2:-1] not in ("a", "e", "o", "u"):
        return lower[:-1] + "ies"  # policy -> policies, gateway -> gateways
    if lower.endswith(("s", "x", "ch")):
        return lower + "es"
    return lower + "s"
