"""The harness itself: a second cluster comes up beside the session's and goes away cleanly,
and one that cannot start says which component failed and which log to read."""

from __future__ import annotations

import dataclasses
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from e2e.devcluster import cluster, pki
from e2e.devcluster.binaries import ensure_binaries
from e2e.devcluster.clients import Kube
from kubernetes import client as k8s

pytestmark = pytest.mark.cluster


# The admin's namespace creations only: what the test makes, none of the control plane's
# own (the API server creates kube-system and the rest at start).
AUDIT_POLICY = cluster.audit_policy(
    users=[pki.ADMIN.name], verbs=["create"], resources=[{"resources": ["namespaces"]}]
)


def test_up_status_down_leaves_no_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVQ_RUN_DIR", str(tmp_path / "run"))
    kubeconfig = tmp_path / "admin.kubeconfig"

    state = cluster.up(
        name="harness",
        profile="single",
        kubeconfig=kubeconfig,
        timeout=180,
        audit_policy=AUDIT_POLICY,
    )
    rest = cluster.admin_rest(state)
    # Usable when up returns: no node still carries the node controller's not-ready taint.
    nodes = rest.get("/api/v1/nodes")["items"]
    taints = [t["key"] for node in nodes for t in node["spec"].get("taints", [])]
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "audited"}}
    rest.post("/api/v1/namespaces", namespace)
    audited = [json.loads(line) for line in cluster.audit_log(state).read_text().splitlines()]
    status = cluster.status("harness")
    stopped = cluster.down("harness")

    assert "node.kubernetes.io/not-ready" not in taints
    assert [(e["objectRef"]["name"], e["responseStatus"]["code"]) for e in audited] == [
        ("audited", 201)
    ]
    assert status["ready"] is True
    assert set(status["components"]) == {
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kwok",
    }
    assert (
        yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"] == state.server
    )
    assert stopped is True
    assert not [p.pid for p in state.processes if Path(f"/proc/{p.pid}").exists()]
    assert cluster.status("harness")["running"] is False
    assert (tmp_path / "run" / "logs" / "kube-apiserver.log").stat().st_size > 0


def test_a_component_that_dies_at_start_is_named_with_its_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVQ_RUN_DIR", str(tmp_path / "run"))
    broken = tmp_path / "kube-apiserver"
    broken.write_text("#!/bin/sh\necho 'Error: unknown flag: --bogus' >&2\nexit 1\n")
    broken.chmod(0o755)
    binaries = dataclasses.replace(ensure_binaries(), kube_apiserver=broken)

    with pytest.raises(cluster.ClusterStartError) as failed:
        cluster.up(name="broken", profile="single", timeout=60, binaries=binaries)

    log = tmp_path / "run" / "logs" / "kube-apiserver.log"
    assert str(failed.value) == (
        f"kube-apiserver exited during start (Error: unknown flag: --bogus); read {log}"
    )
    assert cluster.status("broken")["running"] is False


def test_the_service_range_holds_more_services_than_a_slash_24(kube: Kube, namespace: str) -> None:
    # A fleet of InferenceServices has one Service each; a /24 ran out at 254.
    def create(i: int) -> str:
        service = k8s.V1Service(
            metadata=k8s.V1ObjectMeta(name=f"s{i}"),
            spec=k8s.V1ServiceSpec(selector={"app": f"s{i}"}, ports=[k8s.V1ServicePort(port=80)]),
        )
        return str(kube.core.create_namespaced_service(namespace, service).spec.cluster_ip)

    with ThreadPoolExecutor(max_workers=8) as pool:
        addresses = list(pool.map(create, range(300)))

    assert len(set(addresses)) == 300
    assert all(a.startswith("10.0.") for a in addresses)
