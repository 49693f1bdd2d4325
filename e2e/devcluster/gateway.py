"""The `gateway` add-on: a real Gateway API implementation (Traefik) on the dev cluster.

It installs the Gateway API's standard-channel CRDs (the version Traefik is built against)
and the InferencePool CRD, runs Traefik with its Kubernetes Gateway provider as a process
whose HTTP entry point listens on a loopback port, and creates a GatewayClass and a Gateway
whose one HTTP listener is that entry point, accepting routes from every namespace.

Routing to pods needs endpoints, and the API server refuses loopback endpoint addresses
(KWOK pods have 127.10.x.y). So the add-on also adds an "edge" node whose InternalIP is a
non-loopback address of this machine (when it has one): a `hostNetwork` pod placed there
gets that address as its pod IP, its Service gets a valid EndpointSlice, and a server the
test binds to that address and the pod's port is what Traefik reaches.
"""

from __future__ import annotations

import ipaddress
import os
import re
import urllib.error
from pathlib import Path
from typing import Any

from e2e.devcluster.addons import apply_all, load_manifests, wait_condition
from e2e.devcluster.binaries import build_components, cached_binary, cached_manifests
from e2e.devcluster.cluster import ClusterStartError, ClusterState, launch_component, wait_alive
from e2e.devcluster.kubeconfig import addon_kubeconfig
from e2e.devcluster.pki import Identity
from e2e.devcluster.ports import allocate_ports
from e2e.devcluster.profiles import KWOK_NODE_ANNOTATION
from e2e.devcluster.rest import Rest, get_ok

NAMESPACE = "kvq-gateway"
GATEWAY_CLASS = "traefik"
GATEWAY = "kvq-gateway"
CONTROLLER = "traefik.io/gateway-controller"
LISTENER = "web"
EDGE_NODE = "kvq-edge"
# Taint and label of the edge node: only pods that ask for it land there.
EDGE_KEY = "kvq.dev/edge"
# Traefik watches Services, EndpointSlices, Secrets and every Gateway API kind cluster-wide
# and writes their status; its chart's RBAC is not the dev cluster's concern.
TRAEFIK_IDENTITY = Identity("kvq-traefik", ("system:masters",))


def start_gateway(state: ClusterState, timeout: float) -> dict[str, str]:
    """Build (when missing) and start Traefik with a GatewayClass and a Gateway."""
    build_components(["gateway"])
    root = Path(state.run_dir)
    logs = root / "logs"
    crds = [
        *sorted(cached_manifests("gateway-api-crds", "GATEWAY_API_VERSION").glob("*.yaml")),
        *sorted(
            cached_manifests("inference-extension-crds", "INFERENCE_EXTENSION_VERSION").glob(
                "*.yaml"
            )
        ),
    ]
    apply_all(state, load_manifests(crds), logs / "kube-apiserver.log")

    kubeconfig = addon_kubeconfig(root, state.server, "traefik", TRAEFIK_IDENTITY)
    ports = allocate_ports(["traefik-web", "traefik-ping"])
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    launch_component(state, "traefik", _traefik_args(ports), env)
    ping = f"http://127.0.0.1:{ports['traefik-ping']}/ping"
    wait_alive(state, lambda: get_ok(ping), ping, timeout, "traefik")

    gateway = _gateway(ports["traefik-web"])
    rest = apply_all(state, [_namespace(), _gateway_class(), gateway], logs / "kube-apiserver.log")
    edge = local_address()
    if edge is not None:
        _create_edge_node(rest, edge, logs / "kube-apiserver.log")
    wait_condition(state, rest, gateway, "Programmed", timeout, "traefik")
    return {
        "url": f"http://127.0.0.1:{ports['traefik-web']}",
        "gatewayClass": GATEWAY_CLASS,
        "gateway": GATEWAY,
        "namespace": NAMESPACE,
        "listenerPort": str(ports["traefik-web"]),
        "edgeNode": EDGE_NODE if edge is not None else "",
        "edgeAddress": edge or "",
    }


def local_address() -> str | None:
    """A non-loopback IPv4 address of this machine (from the kernel's local routes), or None."""
    try:
        table = Path("/proc/net/fib_trie").read_text()
    except OSError:
        return None
    for found in sorted(set(re.findall(r"\|-- (\d+\.\d+\.\d+\.\d+)\n\s+/32 host LOCAL", table))):
        address = ipaddress.ip_address(found)
        if not (address.is_loopback or address.is_link_local or address.is_unspecified):
            return str(found)
    return None


def _create_edge_node(rest: Rest, address: str, log: Path) -> None:
    # Created, not applied: a Node's status (its address) is kept on create only.
    try:
        rest.post("/api/v1/nodes", edge_node(address))
    except OSError as error:
        # 409: already there (the add-on ran on this cluster before).
        if not (isinstance(error, urllib.error.HTTPError) and error.code == 409):
            message = f"creating node {EDGE_NODE} failed ({error}); read {log}"
            raise ClusterStartError(message) from error


def edge_node(address: str) -> dict[str, Any]:
    """A KWOK node whose InternalIP is `address`: hostNetwork pods there get it as pod IP."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": EDGE_NODE,
            "labels": {
                "kubernetes.io/hostname": EDGE_NODE,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                EDGE_KEY: "true",
            },
            "annotations": {KWOK_NODE_ANNOTATION[0]: KWOK_NODE_ANNOTATION[1]},
        },
        "spec": {"taints": [{"key": EDGE_KEY, "value": "true", "effect": "NoSchedule"}]},
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": address},
                {"type": "Hostname", "address": EDGE_NODE},
            ],
            "capacity": {"cpu": "16", "memory": "64Gi", "pods": "110"},
            "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"},
        },
    }


def _traefik_args(ports: dict[str, int]) -> list[str]:
    return [
        str(cached_binary("traefik", "TRAEFIK_VERSION")),
        f"--entryPoints.{LISTENER}.address=127.0.0.1:{ports['traefik-web']}",
        f"--entryPoints.traefik.address=127.0.0.1:{ports['traefik-ping']}",
        "--ping=true",
        "--providers.kubernetesgateway=true",
        # What the Gateway's status reports as its address (where clients connect).
        "--providers.kubernetesgateway.statusaddress.ip=127.0.0.1",
        "--global.checkNewVersion=false",
        "--global.sendAnonymousUsage=false",
        "--log.level=INFO",
    ]


def _namespace() -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}


def _gateway_class() -> dict[str, Any]:
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "GatewayClass",
        "metadata": {"name": GATEWAY_CLASS},
        "spec": {"controllerName": CONTROLLER},
    }


def _gateway(port: int) -> dict[str, Any]:
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": GATEWAY, "namespace": NAMESPACE},
        "spec": {
            "gatewayClassName": GATEWAY_CLASS,
            "listeners": [
                {
                    "name": LISTENER,
                    "protocol": "HTTP",
                    "port": port,
                    "allowedRoutes": {"namespaces": {"from": "All"}},
                }
            ],
        },
    }
