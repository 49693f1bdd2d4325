"""Real KEDA on the local control plane: a Prometheus trigger scales a Deployment out and in.

A plain Deployment of KWOK pods; a real HTTP server on the first pod's loopback IP serves a
real vLLM /metrics exposition whose `vllm:num_requests_waiting` the test sets; Debian's
Prometheus scrapes it; a `keda.sh/v1alpha1` ScaledObject asks for one replica per 5 waiting
requests. KEDA's operator makes the HPA, the controller manager's HPA controller reads the
metric through the API server's aggregator from KEDA's metrics server, and scales.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from e2e.devcluster.clients import Kube
from e2e.devcluster.waits import has_condition, is_running_and_ready, wait_for_pod, wait_until
from e2e.prometheus.server import RunningPrometheus, ScrapeTarget, prometheus_running
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from kubernetes.utils import parse_quantity

from tests.infra.servers import MetricsServer, metrics_server, vllm_exposition
from tests.prometheus_support import require_prometheus

pytestmark = pytest.mark.cluster

NAME = "engine"
METRICS_PORT = 8000
WAITING_PER_REPLICA = 5
MAX_REPLICAS = 4
TIMEOUT = 120


@dataclass(frozen=True)
class Scaled:
    namespace: str
    engine: MetricsServer
    prometheus: RunningPrometheus


def deployment() -> dict[str, Any]:
    labels = {"app": NAME}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": NAME},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                    "containers": [
                        {
                            "name": "engine",
                            "image": "vllm/vllm-openai:v0.26.0",
                            "ports": [{"containerPort": METRICS_PORT, "name": "http"}],
                        }
                    ],
                },
            },
        },
    }


def scaled_object(prometheus_url: str, namespace: str) -> dict[str, Any]:
    query = f'sum(vllm:num_requests_waiting{{namespace="{namespace}",service="{NAME}"}})'
    # No waiting on anyone's stabilisation: scale at once both ways, as a test wants.
    immediate = {"stabilizationWindowSeconds": 0, "policies": [_all_per_second()]}
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": NAME},
        "spec": {
            "scaleTargetRef": {"name": NAME},
            "minReplicaCount": 1,
            "maxReplicaCount": MAX_REPLICAS,
            "pollingInterval": 1,
            "cooldownPeriod": 1,
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {"scaleUp": immediate, "scaleDown": immediate}
                }
            },
            "triggers": [
                {
                    "type": "prometheus",
                    "metadata": {
                        "serverAddress": prometheus_url,
                        "query": query,
                        "threshold": str(WAITING_PER_REPLICA),
                    },
                }
            ],
        },
    }


def _all_per_second() -> dict[str, Any]:
    return {"type": "Percent", "value": 100, "periodSeconds": 1}


def external_metric(kube: Kube, namespace: str, metric: str) -> float:
    """The value KEDA's metrics server gives for this ScaledObject, read as the HPA does."""
    found: Any = kube.custom.list_namespaced_custom_object(
        "external.metrics.k8s.io",
        "v1beta1",
        namespace,
        metric,
        label_selector=f"scaledobject.keda.sh/name={NAME}",
    )
    return float(parse_quantity(found["items"][0]["value"]))  # type: ignore[no-untyped-call]


def replicas(kube: Kube, namespace: str) -> int:
    scale: Any = kube.apps.read_namespaced_deployment_scale(NAME, namespace)
    return int(scale.spec.replicas)


@pytest.fixture
def scaled(kube: Kube, keda: dict[str, str], namespace: str, tmp_path: Path) -> Iterator[Scaled]:
    require_prometheus()
    body: Any = deployment()
    kube.apps.create_namespaced_deployment(namespace, body)
    pod = wait_for_pod(kube.core, namespace, is_running_and_ready, what="the engine pod ready")
    # The pod serving the metric is the one the ReplicaSet removes last when scaling in.
    kube.core.patch_namespaced_pod(
        pod.metadata.name,
        namespace,
        {"metadata": {"annotations": {"controller.kubernetes.io/pod-deletion-cost": "1000"}}},
    )
    with metrics_server(pod.status.pod_ip, METRICS_PORT) as engine:
        engine.serve(vllm_exposition(waiting=0))
        target = ScrapeTarget(engine.address, {"namespace": namespace, "service": NAME})
        with prometheus_running(tmp_path / "prometheus", [target], scrape_interval_s=1) as prom:
            yield Scaled(namespace, engine, prom)


def test_a_prometheus_trigger_scales_out_and_back_in(kube: Kube, scaled: Scaled) -> None:
    ns = scaled.namespace
    kube.custom.create_namespaced_custom_object(
        "keda.sh", "v1alpha1", ns, "scaledobjects", scaled_object(scaled.prometheus.url, ns)
    )

    def read_scaled_object() -> Any:
        return kube.custom.get_namespaced_custom_object(
            "keda.sh", "v1alpha1", ns, "scaledobjects", NAME
        )

    ready = wait_until(
        lambda: has_condition(read_scaled_object(), "Ready") and read_scaled_object(),
        what="the ScaledObject Ready",
        timeout=TIMEOUT,
        describe=lambda: str(read_scaled_object().get("status")),
    )
    hpa_name = ready["status"]["hpaName"]
    metric_name = ready["status"]["externalMetricNames"][0]
    autoscaling = k8s.AutoscalingV2Api(kube.api)

    def describe() -> str:
        try:
            status = autoscaling.read_namespaced_horizontal_pod_autoscaler(hpa_name, ns).status
        except ApiException as error:
            return f"HPA {hpa_name}: {error.reason}"
        return f"replicas {replicas(kube, ns)}; HPA {hpa_name}: {status}"

    waiting = 18
    scaled.engine.serve(vllm_exposition(waiting=waiting))
    out = math.ceil(waiting / WAITING_PER_REPLICA)
    wait_until(
        lambda: replicas(kube, ns) == out,
        what=f"{out} replicas for {waiting} waiting requests",
        timeout=TIMEOUT,
        describe=describe,
    )
    # What the HPA controller read: the metric through the API server's aggregator.
    assert external_metric(kube, ns, metric_name) == waiting

    scaled.engine.serve(vllm_exposition(waiting=0))
    wait_until(
        lambda: replicas(kube, ns) == 1,
        what="back to 1 replica once nothing waits",
        timeout=TIMEOUT,
        describe=describe,
    )
    assert scaled.engine.scrapes > 0
