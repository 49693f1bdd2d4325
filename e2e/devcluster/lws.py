"""The `lws` add-on: LeaderWorkerSet's controller on the dev cluster (multi-node replicas).

Upstream's one binary (controllers and webhooks, built from `sigs.k8s.io/lws` at
LWS_VERSION), its chart's CRDs and webhook configurations, run as a process on loopback like
the control plane. The webhooks are not optional: the pod webhook labels each pod of a group
(worker index, group key) and injects LWS_LEADER_ADDRESS, which the controller and every
multi-node launch rely on. This cluster has no kube-proxy or cluster DNS, so the chart's
webhook configurations keep their webhooks, rules and paths but reach the controller by URL
(`https://127.0.0.1:PORT/...`, the cluster's CA in caBundle) instead of through the
`lws-webhook-service` Service. The controller's own certificate rotation (it writes a Secret
and patches the configurations) is off: the dev cluster's CA issues its serving certificate.
"""

from __future__ import annotations

import base64
import os
import re
from pathlib import Path
from typing import Any

import yaml
from e2e.devcluster.addons import apply_all, load_manifests
from e2e.devcluster.binaries import build_components, cached_binary, cached_manifests
from e2e.devcluster.cluster import ClusterState, launch_component, wait_alive
from e2e.devcluster.kubeconfig import addon_kubeconfig
from e2e.devcluster.pki import SERVER_AUTH, Identity, tls_directory
from e2e.devcluster.ports import allocate_ports
from e2e.devcluster.rest import get_ok

# Upstream's namespace (its default when not run in a pod), so `kubectl -n lws-system` reads
# as on any cluster.
NAMESPACE = "lws-system"
# LWS acts on every namespace (StatefulSets, Services, Pods of any group); its chart's RBAC
# is its own concern, not the dev cluster's.
LWS_IDENTITY = Identity("kvq-lws", ("system:masters",))
PORTS = ["lws-webhook", "lws-probe"]


def start_lws(state: ClusterState, timeout: float) -> dict[str, str]:
    """Build (when missing) and start the LeaderWorkerSet controller; what it exposes."""
    build_components(["lws"])
    root = Path(state.run_dir)
    logs = root / "logs"
    certs = _write_certs(root)
    kubeconfig = addon_kubeconfig(root, state.server, "lws", LWS_IDENTITY)
    chart = cached_manifests("lws-chart", "LWS_VERSION") / "lws"
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    crds = load_manifests(sorted((chart / "crds").glob("*.yaml")))
    apply_all(state, [*crds, namespace], logs / "kube-apiserver.log")

    ports = allocate_ports(PORTS)
    config = root / "lws-config.yaml"
    config.write_text(yaml.safe_dump(_configuration(certs, ports)))
    env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
    argv = [
        str(cached_binary("lws", "LWS_VERSION")),
        f"--config={config}",
        "--zap-log-level=info",
        "--zap-encoder=console",
    ]
    launch_component(state, "lws-controller", argv, env)
    probe = f"http://127.0.0.1:{ports['lws-probe']}/readyz"
    wait_alive(state, lambda: get_ok(probe), probe, timeout, "lws-controller")
    webhooks = _webhook_configurations(chart, ports["lws-webhook"], certs / "ca.crt")
    apply_all(state, webhooks, logs / "kube-apiserver.log")
    return {
        "namespace": NAMESPACE,
        "webhook": f"https://127.0.0.1:{ports['lws-webhook']}",
        "version": cached_binary("lws", "LWS_VERSION").parent.name,
    }


def _write_certs(root: Path) -> Path:
    """The webhook server's certificate (controller-runtime reads tls.crt and tls.key)."""
    hosts = ["localhost", "127.0.0.1", f"lws-webhook-service.{NAMESPACE}.svc"]
    return tls_directory(root, "lws", [SERVER_AUTH], hosts)


def _configuration(certs: Path, ports: dict[str, int]) -> dict[str, Any]:
    """Upstream's Configuration (config.lws.x-k8s.io/v1alpha1) for one process on loopback."""
    return {
        "apiVersion": "config.lws.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": ports["lws-webhook"], "certDir": str(certs)},
        # Its metrics server (TLS, token review) is not used here.
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['lws-probe']}"},
    }


def _webhook_configurations(chart: Path, port: int, ca: Path) -> list[dict[str, Any]]:
    """The chart's webhook configurations as it ships them, each webhook reached by URL."""
    text = (chart / "templates" / "webhook" / "webhook.yaml").read_text()
    # Its only template logic: the namespace, and DisaggregatedSet's webhook behind a flag
    # that defaults to off (values.yaml).
    text = re.sub(r"\{\{-? if .*?\{\{-? end \}\}", "", text, flags=re.S)
    text = re.sub(r"\{\{ *\.Release\.Namespace *\}\}", NAMESPACE, text)
    assert "{{" not in text, "LWS chart's webhook.yaml has template logic this add-on ignores"
    bundle = base64.b64encode(ca.read_bytes()).decode()
    documents = [doc for doc in yaml.safe_load_all(text) if doc]
    for doc in documents:
        for webhook in doc["webhooks"]:
            path = webhook["clientConfig"]["service"]["path"]
            webhook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle}
    return documents
