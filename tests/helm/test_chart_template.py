"""`helm lint` and `helm template` of charts/kvq: what each values mode renders, and the
values the schema refuses. No cluster needed (the API server's view is in test_chart_install)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helm.chart import CHART, find, helm, render, values_file

pytestmark = pytest.mark.helm

NAMESPACED = {"watchNamespaces": ["team-a", "team-b"]}
EVERYTHING = {
    "prometheusRule": {"enabled": True},
    "grafanaDashboard": {"enabled": True},
    "metrics": {"port": 8080, "service": {"port": 8080}, "serviceMonitor": {"enabled": True}},
}
OWNED = {
    "deployments",
    "services",
    "configmaps",
    "poddisruptionbudgets",
    "jobs",  # quality probes
    "persistentvolumeclaims",  # model caches kvq owns
    "scaledobjects",  # KEDA, for spec.autoscaling
    "httproutes",  # Gateway API, for spec.routing
    "inferencepools",
    "leaderworkersets",  # LeaderWorkerSet, for a replica over several nodes
}
WRITES = {"create", "update", "patch", "delete", "deletecollection", "*"}


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = find(docs, "Deployment")
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(only)


def rules_of(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [rule for role in find(docs, kind) for rule in role["rules"]]


@pytest.mark.parametrize("values", [{}, NAMESPACED, {"replicas": 1, **EVERYTHING}])
def test_lint_is_clean_in_strict_mode(tmp_path: Path, values: dict[str, Any]) -> None:
    args = ["lint", str(CHART), "--strict"]
    if values:
        args += ["--values", str(values_file(tmp_path, values))]
    assert "0 chart(s) failed" in helm(*args).stdout


def test_operator_pod_is_locked_down(tmp_path: Path) -> None:
    docs = render(tmp_path)
    (deployment,) = find(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container(docs)["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    probes = {p: container(docs)[p]["httpGet"] for p in ("livenessProbe", "readinessProbe")}
    assert all(p == {"path": "/healthz", "port": "health"} for p in probes.values())
    assert container(docs)["resources"]["limits"]["memory"]


def test_two_replicas_peer_cluster_wide(tmp_path: Path) -> None:
    docs = render(tmp_path)
    assert find(docs, "Deployment")[0]["spec"]["replicas"] == 2
    args = container(docs)["args"]
    assert "--all-namespaces" in args
    assert "--peering=kvq" in args
    assert "--liveness=http://0.0.0.0:8081/healthz" in args
    assert [p["metadata"]["name"] for p in find(docs, "ClusterKopfPeering")] == ["kvq"]
    assert not find(docs, "Role")
    (budget,) = find(docs, "PodDisruptionBudget")
    assert budget["spec"]["maxUnavailable"] == 1


def test_one_replica_runs_standalone_without_peering(tmp_path: Path) -> None:
    docs = render(tmp_path, {"replicas": 1})
    assert "--standalone" in container(docs)["args"]
    # Two unpeered operators would both act: the old pod goes before the new one starts.
    assert find(docs, "Deployment")[0]["spec"]["strategy"] == {"type": "Recreate"}
    assert not [a for a in container(docs)["args"] if a.startswith("--peering")]
    assert not find(docs, "ClusterKopfPeering") and not find(docs, "KopfPeering")
    assert not find(docs, "PodDisruptionBudget")
    assert not [r for r in rules_of(docs, "ClusterRole") if r["apiGroups"] == ["kopf.dev"]]


def test_namespaced_mode_writes_only_in_the_served_namespaces(tmp_path: Path) -> None:
    docs = render(tmp_path, NAMESPACED)
    args = container(docs)["args"]
    assert "--namespace=team-a" in args and "--namespace=team-b" in args
    assert "--all-namespaces" not in args
    roles = find(docs, "Role")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    bindings = find(docs, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    assert {p["metadata"]["namespace"] for p in find(docs, "KopfPeering")} == {"team-a", "team-b"}
    cluster_rules = rules_of(docs, "ClusterRole")
    # Cluster-wide it only reads: Nodes for pool discovery, CRDs for kopf.
    assert {v for r in cluster_rules for v in r["verbs"]} <= {"get", "list", "watch"}
    assert {res for r in cluster_rules for res in r["resources"]} == {
        "nodes",
        "customresourcedefinitions",
    }
    role_resources = {res for r in rules_of(docs, "Role") for res in r["resources"]}
    assert role_resources >= OWNED


@pytest.mark.parametrize("values", [{}, NAMESPACED])
def test_no_rule_grants_secrets_wildcards_or_node_writes(
    tmp_path: Path, values: dict[str, Any]
) -> None:
    docs = render(tmp_path, values)
    rules = rules_of(docs, "ClusterRole") + rules_of(docs, "Role")
    for rule in rules:
        assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], rule
        assert "secrets" not in rule["resources"], rule
        if set(rule["resources"]) & {"nodes", "pods", "pods/log"}:
            assert not set(rule["verbs"]) & WRITES, rule
    written = {
        res for r in rules if set(r["verbs"]) & {"create", "delete"} for res in r["resources"]
    }
    assert written == OWNED | {"events"}


def test_optional_monitoring_objects(tmp_path: Path) -> None:
    assert not find(render(tmp_path), "PrometheusRule")
    docs = render(tmp_path, EVERYTHING)
    (rule,) = find(docs, "PrometheusRule")
    exprs = " ".join(r["expr"] for g in rule["spec"]["groups"] for r in g["rules"])
    for metric in (
        "vllm:kv_cache_usage_perc",
        "vllm:num_requests_waiting",
        "vllm:num_preemptions_total",
        "kvq_fallbacks_total",
    ):
        assert metric in exprs
    assert "> 0.9" in exprs
    (monitor,) = find(docs, "ServiceMonitor")
    (service,) = find(docs, "Service")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    (dashboard,) = find(docs, "ConfigMap")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert '"uid": "kvq-overview"' in dashboard["data"]["kvq-overview.json"]


def test_engine_metrics_wiring_matches_what_kvq_renders(tmp_path: Path) -> None:
    from kvq.api.resource import InferenceService
    from kvq.render import render_manifests
    from tests.unit.render_cases import pool, settings

    values = {
        "engineMetrics": {
            "prometheusUrl": "http://prometheus-operated.monitoring:9090",
            "prometheusUrlSecretRef": {"name": "", "key": "url"},
            "interval": 60,
            "serviceMonitor": {"enabled": True},
        }
    }
    docs = render(tmp_path, values)
    args = container(docs)["args"]
    assert "--prometheus-url=http://prometheus-operated.monitoring:9090" in args
    assert "--metrics-interval=60" in args
    (monitor,) = find(docs, "ServiceMonitor")
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    # The engine Service kvq renders is what the ServiceMonitor selects, on its named port.
    isvc = InferenceService.model_validate(
        {
            "apiVersion": "kvq.dev/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": "m", "namespace": "team"},
            "spec": {"model": {"uri": "hf://meta-llama/Meta-Llama-3-8B"}},
        }
    )
    objects = render_manifests(isvc, pool("H100"), settings(isvc, "H100"))
    service = next(o for o in objects if o["kind"] == "Service")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in service["spec"]["ports"]}


def test_pool_labels_reach_the_operator(tmp_path: Path) -> None:
    values = {"poolLabels": ["team.example.com/gpu-pool", "karpenter.sh/nodepool"]}
    args = container(render(tmp_path, values))["args"]
    assert [a for a in args if a.startswith("--pool-label")] == [
        "--pool-label=team.example.com/gpu-pool",
        "--pool-label=karpenter.sh/nodepool",
    ]


def test_a_prometheus_url_with_credentials_comes_from_a_secret(tmp_path: Path) -> None:
    values = {
        "engineMetrics": {
            "prometheusUrl": "",
            "prometheusUrlSecretRef": {"name": "prom-url", "key": "url"},
            "interval": 60,
            "serviceMonitor": {"enabled": False},
        }
    }
    env = {e["name"]: e for e in container(render(tmp_path, values))["env"]}
    assert env["KVQ_PROMETHEUS_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "prom-url",
        "key": "url",
    }
    assert not any(
        a.startswith("--prometheus-url") for a in container(render(tmp_path, values))["args"]
    )


def test_autoscaling_values_reach_the_operator(tmp_path: Path) -> None:
    values = {
        "autoscaling": {
            "prometheusUrl": "http://prometheus.monitoring:9090",
            "clusterTriggerAuthentication": "prometheus-basic-auth",
        }
    }
    args = container(render(tmp_path, values))["args"]
    assert "--autoscaling-prometheus-url=http://prometheus.monitoring:9090" in args
    assert "--autoscaling-authentication=prometheus-basic-auth" in args
    defaults = container(render(tmp_path, {}))["args"]
    assert not any(a.startswith("--autoscaling") for a in defaults)


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"replicas": 0}, "replicas"),
        ({"watchNamespaces": ["Team_A"]}, "watchNamespaces"),
        ({"watchNamespaces": "team-a"}, "watchNamespaces"),
        ({"image": {"repository": "kvq/operator", "pullPolicy": "Sometimes"}}, "pullPolicy"),
        ({"image": {"repository": "", "pullPolicy": "Always"}}, "repository"),
        ({"image": {"repository": "x", "pullPolicy": "Always", "digest": "latest"}}, "digest"),
        ({"prometheusRule": {"enabled": True, "kvCacheUsageThreshold": 90}}, "kvCacheUsage"),
        ({"replica": 2}, "replica"),
        (
            {
                "autoscaling": {
                    "prometheusUrl": "http://admin:hunter2@prometheus:9090",
                    "clusterTriggerAuthentication": "",
                }
            },
            "prometheusUrl",
        ),
    ],
)
def test_schema_refuses_bad_values(tmp_path: Path, values: dict[str, Any], complaint: str) -> None:
    done = helm(
        "template", "kvq", str(CHART), "--values", str(values_file(tmp_path, values)), check=False
    )
    assert done.returncode != 0
    assert "values don't meet the specifications of the schema" in done.stderr
    assert complaint in done.stderr
