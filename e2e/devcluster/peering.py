"""kopf's peering resources: how two `kvq run` replicas agree that one of them works.

Each replica keeps a heartbeat in the status of one peering object (KopfPeering in a
namespace, ClusterKopfPeering for a cluster-wide operator); the highest priority wins and
the others pause until its heartbeat expires. kopf does not create these objects: the chart
installs the CRDs (charts/kvq/crds/kopf-peerings.yaml, held equal to `peering_crds()` by
tests/helm/test_chart_crds.py) and one object named like `kvq run --peering NAME`; the
tests and `make chaos` create them here on the dev cluster.
"""

from __future__ import annotations

from typing import Any

PEERING_GROUP = "kopf.dev"
PEERING_VERSION = "v1"


def peering_crds() -> list[dict[str, Any]]:
    """The two CRDs, as in kopf's own peering.yaml (status is free-form, kopf owns it)."""
    return [_crd("Cluster", "ClusterKopfPeering"), _crd("Namespaced", "KopfPeering")]


def peering_object(name: str, namespace: str | None) -> dict[str, Any]:
    """The peering object the replicas share; cluster-wide when `namespace` is None."""
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    kind = "KopfPeering" if namespace is not None else "ClusterKopfPeering"
    return {"apiVersion": f"{PEERING_GROUP}/{PEERING_VERSION}", "kind": kind, "metadata": metadata}


def _crd(scope: str, kind: str) -> dict[str, Any]:
    plural = f"{kind.lower()}s"
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{PEERING_GROUP}"},
        "spec": {
            "group": PEERING_GROUP,
            "scope": scope,
            "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
            "versions": [
                {
                    "name": PEERING_VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "status": {
                                    "type": "object",
                                    "x-kubernetes-preserve-unknown-fields": True,
                                }
                            },
                        }
                    },
                }
            ],
        },
    }
