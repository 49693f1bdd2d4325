"""The `keda` add-on: KEDA's operator and its external-metrics API server on the dev cluster.

Both are KEDA's own binaries (built from `github.com/kedacore/keda/v2` at KEDA_VERSION) and
its CRDs (the module's config/crd/bases), run as processes on loopback like the control
plane. The metrics server is an extension API server: the API server's aggregator reaches it
through the `v1beta1.external.metrics.k8s.io` APIService, which names a Service. This
cluster has no kube-proxy and no endpoint may be a loopback address, so that Service is of
type ExternalName with the name `127.0.0.1`: the aggregator's default resolver (no
`--enable-aggregator-routing`) dials an ExternalName service's name and the APIService's
port. The aggregator proves itself with the front-proxy client certificate; the metrics
server verifies it against `extension-apiserver-authentication` in kube-system.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

from e2e.devcluster.addons import apply_all, load_manifests, wait_condition
from e2e.devcluster.binaries import build_components, cached_binary, cached_manifests
from e2e.devcluster.cluster import ClusterState, launch_component, wait_alive
from e2e.devcluster.kubeconfig import addon_kubeconfig
from e2e.devcluster.pki import CLIENT_AUTH, SERVER_AUTH, Identity, tls_directory
from e2e.devcluster.ports import allocate_ports
from e2e.devcluster.rest import get_ok, tls_context

NAMESPACE = "keda"
# Upstream's names (config/metrics-server), so KEDA's docs and `kubectl get apiservice` read
# as on any cluster.
METRICS_SERVICE = "keda-metrics-apiserver"
API_SERVICE = "v1beta1.external.metrics.k8s.io"
# KEDA acts cluster-wide (every ScaledObject's namespace, the scale subresource of any
# workload); its chart's RBAC is its own concern, not the dev cluster's.
KEDA_IDENTITY = Identity("kvq-keda", ("system:masters",))
PORTS = ["keda-grpc", "keda-metrics", "keda-probe", "keda-adapter", "keda-adapter-metrics"]


def start_keda(state: ClusterState, timeout: float) -> dict[str, str]:
    """Build (when missing) and start KEDA on the cluster; returns what it exposes."""
    build_components(["keda"])
    root = Path(state.run_dir)
    logs = root / "logs"
    certs = _write_certs(root)
    kubeconfig = addon_kubeconfig(root, state.server, "keda", KEDA_IDENTITY)
    crds = sorted(cached_manifests("keda-crds", "KEDA_VERSION").glob("*.yaml"))
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    apply_all(state, [*load_manifests(crds), namespace], logs / "kube-apiserver.log")

    ports = allocate_ports(PORTS)
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "WATCH_NAMESPACE": "",
        "POD_NAMESPACE": NAMESPACE,
        "KEDA_CLUSTER_OBJECT_NAMESPACE": NAMESPACE,
    }
    launch_component(state, "keda-operator", _operator_args(certs, ports), env)
    probe = f"http://127.0.0.1:{ports['keda-probe']}/readyz"
    wait_alive(state, lambda: get_ok(probe), probe, timeout, "keda-operator")
    launch_component(state, "keda-adapter", _adapter_args(certs, ports, kubeconfig), env)
    serving = f"https://127.0.0.1:{ports['keda-adapter']}"
    ctx = tls_context(certs / "ca.crt")
    wait_alive(state, lambda: get_ok(f"{serving}/readyz", ctx), serving, timeout, "keda-adapter")

    api_service = _api_service(certs / "ca.crt", ports["keda-adapter"])
    rest = apply_all(state, [_metrics_service(), api_service], logs / "kube-apiserver.log")
    wait_condition(state, rest, api_service, "Available", timeout, "keda-adapter")
    return {
        "namespace": NAMESPACE,
        "apiService": API_SERVICE,
        "metricsServer": serving,
        "operatorMetrics": f"http://127.0.0.1:{ports['keda-metrics']}/metrics",
    }


def _write_certs(root: Path) -> Path:
    """One serving and client certificate for both processes (as KEDA's own cert rotation
    makes one for both), with every name they are reached by; KEDA reads tls.crt, tls.key
    and ca.crt from one directory."""
    hosts = [
        "localhost",
        "127.0.0.1",
        f"keda-operator.{NAMESPACE}.svc",
        f"{METRICS_SERVICE}.{NAMESPACE}.svc",
        f"{METRICS_SERVICE}.{NAMESPACE}.svc.cluster.local",
    ]
    return tls_directory(root, "keda", [SERVER_AUTH, CLIENT_AUTH], hosts)


def _operator_args(certs: Path, ports: dict[str, int]) -> list[str]:
    return [
        str(cached_binary("keda", "KEDA_VERSION")),
        "--leader-elect=false",
        "--zap-log-level=info",
        "--zap-encoder=console",
        f"--metrics-bind-address=127.0.0.1:{ports['keda-metrics']}",
        f"--health-probe-bind-address=127.0.0.1:{ports['keda-probe']}",
        f"--metrics-service-bind-address=127.0.0.1:{ports['keda-grpc']}",
        f"--cert-dir={certs}",
        f"--ca-dir={certs}",
        "--enable-cert-rotation=false",
    ]


def _adapter_args(certs: Path, ports: dict[str, int], kubeconfig: Path) -> list[str]:
    return [
        str(cached_binary("keda-adapter", "KEDA_VERSION")),
        "--bind-address=127.0.0.1",
        f"--secure-port={ports['keda-adapter']}",
        f"--tls-cert-file={certs / 'tls.crt'}",
        f"--tls-private-key-file={certs / 'tls.key'}",
        f"--client-ca-file={certs / 'ca.crt'}",
        f"--cert-dir={certs}",
        f"--metrics-service-address=127.0.0.1:{ports['keda-grpc']}",
        # Its own /metrics listens on every interface (KEDA offers no bind address for it).
        f"--port={ports['keda-adapter-metrics']}",
        f"--lister-kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--zap-log-level=info",
    ]


def _metrics_service() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": METRICS_SERVICE, "namespace": NAMESPACE},
        "spec": {"type": "ExternalName", "externalName": "127.0.0.1"},
    }


def _api_service(ca: Path, port: int) -> dict[str, Any]:
    return {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": API_SERVICE},
        "spec": {
            "group": "external.metrics.k8s.io",
            "version": "v1beta1",
            "groupPriorityMinimum": 100,
            "versionPriority": 100,
            "service": {"name": METRICS_SERVICE, "namespace": NAMESPACE, "port": port},
            "caBundle": base64.b64encode(ca.read_bytes()).decode(),
        },
    }
