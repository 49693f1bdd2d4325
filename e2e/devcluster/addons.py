"""Opt-in add-ons of a running dev cluster: `keda` (autoscaling), `gateway` (Gateway API) and
`lws` (LeaderWorkerSet, multi-node replicas).

None starts with a plain `up`: the default cluster stays as fast as before. An add-on is
started on a running cluster (`python -m e2e.devcluster up --addons keda,gateway`, or a pytest
fixture on the session's cluster); its processes join the cluster's state, so `down` stops
them with the rest. What each add-on exposes (URLs, names) lands in `state.addons[name]`.
"""

from __future__ import annotations

import time
import urllib.error
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml
from e2e.devcluster.cluster import ClusterStartError, ClusterState, admin_rest, wait_alive
from e2e.devcluster.rest import Rest, object_path
from e2e.devcluster.waits import WaitTimeoutError, wait_until

ADDON_NAMES = ("keda", "gateway", "lws")
DEFAULT_ADDON_TIMEOUT = 180.0


def start_addons(
    state: ClusterState, names: Sequence[str], timeout: float = DEFAULT_ADDON_TIMEOUT
) -> None:
    """Start each named add-on (building its binaries first, under the build's own budget)
    unless the cluster already runs it; raises ClusterStartError naming the log to read."""
    unknown = sorted(set(names) - set(ADDON_NAMES))
    if unknown:
        raise ValueError(
            f"unknown add-on(s) {', '.join(unknown)} (known: {', '.join(ADDON_NAMES)})"
        )
    for name in names:
        if name in state.addons:
            continue
        began = time.monotonic()
        state.addons[name] = _starter(name)(state, timeout)
        state.addons[name]["startupSeconds"] = f"{time.monotonic() - began:.1f}"
        state.save()


def _starter(name: str) -> Callable[[ClusterState, float], dict[str, str]]:
    # Imported on use: each add-on module is only needed when asked for.
    if name == "keda":
        from e2e.devcluster.keda import start_keda

        return start_keda
    if name == "lws":
        from e2e.devcluster.lws import start_lws

        return start_lws
    from e2e.devcluster.gateway import start_gateway

    return start_gateway


def load_manifests(files: Iterable[Path]) -> list[dict[str, Any]]:
    """Every document of the YAML files, in file order."""
    return [doc for path in files for doc in yaml.safe_load_all(path.read_text()) if doc]


def apply_all(state: ClusterState, objects: Iterable[dict[str, Any]], log: Path) -> Rest:
    """Server-side apply each object as the admin; CRDs are then waited for (Established)."""
    rest = admin_rest(state)
    crds = []
    for obj in objects:
        what = f"{obj['kind']} {obj['metadata']['name']}"
        try:
            _apply_when_served(rest, obj, what)
        except (OSError, WaitTimeoutError) as error:
            first_line = str(error).splitlines()[0]
            raise ClusterStartError(f"applying {what} failed ({first_line}); read {log}") from error
        if obj["kind"] == "CustomResourceDefinition":
            crds.append(obj)

    def established() -> bool:
        return all(_has_condition(rest.get(object_path(c)), "Established") for c in crds)

    if crds:
        wait_alive(state, established, "the add-on's CRDs Established", 60, "kube-apiserver")
    return rest


def _apply_when_served(rest: Rest, obj: dict[str, Any], what: str) -> None:
    """Apply; a 404 is retried for a while: just after a CRD is Established the API server
    may still be installing the new resource's handler."""

    def applied() -> bool:
        try:
            rest.apply(obj)
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return False
            raise
        return True

    wait_until(applied, what=f"{what} applied (its resource served)", timeout=30, interval=0.5)


def wait_condition(
    state: ClusterState, rest: Rest, obj: dict[str, Any], kind: str, timeout: float, log: str
) -> None:
    """Until the object's status has condition `kind`=True (e.g. an APIService Available)."""
    path = object_path(obj)
    what = f"{obj['kind']} {obj['metadata']['name']} {kind}"
    wait_alive(state, lambda: _has_condition(rest.get(path), kind), what, timeout, log)


def _has_condition(obj: dict[str, Any], kind: str) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)
