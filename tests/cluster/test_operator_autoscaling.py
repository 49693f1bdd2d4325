"""Autoscaling with real KEDA: kvq's ScaledObject scales an InferenceService out and back in
through its scale subresource, and an FP8 KV cache needs about half the replicas of `auto`
for the same load.

Two services on the H100 pool, one fp8 and one auto, each autoscaled on the share of its
planned concurrency that is running (status.capacity.maxConcurrentSequences, which fp8
doubles). Each one's engines are KWOK pods, so a real HTTP server stands in for their
/metrics: it serves a real vLLM exposition with `vllm:num_requests_running` set by the test,
and Debian's Prometheus scrapes it with the labels kvq's queries select (namespace,
service). KEDA's operator makes the HPA; the controller manager's HPA controller reads the
metric through the aggregator and writes the InferenceService's spec.replicas; kvq rolls the
Deployment to match.

A third service, auto with a CPU tier (`swapSpaceGiB`: KV offloading) on the H200 pool,
asks to scale on KV-cache usage too, and its engine reports a full KV cache throughout:
kvq leaves that gauge out of its ScaledObject (offloading lets the GPU cache run full), so
it scales out with the running requests and comes back to one replica when they stop,
full cache or not (on the gauge it would keep ceil(1.0 / 0.8) = 2).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from e2e.devcluster.clients import Kube
from e2e.devcluster.waits import wait_until
from e2e.prometheus.server import RunningPrometheus, ScrapeTarget

from tests.cluster.operator_support import (
    OperatorProcess,
    create_isvc,
    inference_service,
    install_kvq_crd,
    operator_on_prometheus,
    read_isvc,
)
from tests.infra.servers import MetricsServer, metrics_server, vllm_exposition
from tests.prometheus_support import require_prometheus

pytestmark = pytest.mark.cluster

SERVICES = {"scale-fp8": "fp8", "scale-auto": "auto"}
OFFLOADED = "scale-offload"
FULL_CACHE = 1.0
FRACTION = 0.8
MAX_REPLICAS = 6
TIMEOUT = 180


@dataclass
class Fleet:
    namespace: str
    engines: dict[str, MetricsServer]
    prometheus: RunningPrometheus
    operator: OperatorProcess


@pytest.fixture
def fleet(kube: Kube, keda: dict[str, str], namespace: str, tmp_path: Path) -> Iterator[Fleet]:
    require_prometheus()
    install_kvq_crd(kube)
    with ExitStack() as stack:
        names = [*SERVICES, OFFLOADED]
        engines = {name: stack.enter_context(metrics_server("127.0.0.1")) for name in names}
        for name, engine in engines.items():
            engine.serve(vllm_exposition(waiting=0, running=0, kv_usage=usage(name)))
        targets = [
            ScrapeTarget(engine.address, {"namespace": namespace, "service": name})
            for name, engine in engines.items()
        ]
        prometheus, operator = stack.enter_context(
            operator_on_prometheus(kube, namespace, tmp_path, targets)
        )
        yield Fleet(namespace, engines, prometheus, operator)


def usage(name: str) -> float:
    """The KV-cache usage each engine reports: the offloaded one's is full, always."""
    return FULL_CACHE if name == OFFLOADED else 0.0


def autoscaled(name: str, dtype: str) -> dict[str, Any]:
    targets: dict[str, float] = {"runningFraction": FRACTION}
    extra: dict[str, Any] = {}
    pool = "gpu-h100"
    if name == OFFLOADED:
        # Its own pool: the H100 node's eight GPUs are the other two services'.
        targets["kvCacheUsage"] = 0.8
        extra["memory"] = {"maxModelLen": 8192, "swapSpaceGiB": 16}
        pool = "gpu-h200"
    return inference_service(
        name,
        kvCache={"dtype": dtype},
        placement={"pools": [pool]},
        autoscaling={
            "minReplicas": 1,
            "maxReplicas": MAX_REPLICAS,
            "targets": targets,
            "pollingSeconds": 5,
            "scaleDownStabilizationSeconds": 0,
        },
        **extra,
    )


def status_of(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = read_isvc(kube, namespace, name).get("status") or {}
    return found


def condition(kube: Kube, namespace: str, name: str, kind: str) -> tuple[str, str]:
    for c in status_of(kube, namespace, name).get("conditions") or []:
        if c["type"] == kind:
            return c["status"], c.get("reason", "")
    return "", ""


def serving(kube: Kube, namespace: str, name: str) -> int:
    """Replicas asked for (spec.replicas, what the HPA writes) once the Deployment has them
    all available; -1 while it does not."""
    wanted = int(read_isvc(kube, namespace, name)["spec"].get("replicas", 1))
    deployment: Any = kube.apps.read_namespaced_deployment(name, namespace)
    available = int(deployment.status.available_replicas or 0)
    matches = int(deployment.spec.replicas) == wanted and available == wanted
    return wanted if matches else -1


def test_keda_scales_an_inference_service_and_fp8_needs_half_the_replicas(
    kube: Kube, fleet: Fleet
) -> None:
    ns = fleet.namespace
    services = {**SERVICES, OFFLOADED: "auto"}
    for name, dtype in services.items():
        create_isvc(kube, ns, autoscaled(name, dtype))

    def describe() -> str:
        lines = [
            f"{name}: spec.replicas={read_isvc(kube, ns, name)['spec'].get('replicas')} "
            f"autoscaling={status_of(kube, ns, name).get('autoscaling')} "
            f"condition={condition(kube, ns, name, 'Autoscaling')}"
            for name in services
        ]
        return "\n".join(lines) + "\n" + fleet.operator.log_tail(15)

    for name in services:
        wait_until(
            lambda name=name: condition(kube, ns, name, "Autoscaling") == ("True", "Active"),
            what=f"{name}: Autoscaling=True (KEDA's ScaledObject ready)",
            timeout=TIMEOUT,
            describe=describe,
        )
    concurrency = {
        name: float(status_of(kube, ns, name)["capacity"]["maxConcurrentSequences"])
        for name in services
    }
    # The same load on both: what auto serves with 3.5 replicas at the target share.
    running = round(FRACTION * concurrency["scale-auto"] * 3.5)
    expected = {name: math.ceil(running / (FRACTION * concurrency[name])) for name in services}
    assert expected["scale-auto"] == 4
    assert expected["scale-fp8"] == 2  # fp8 holds twice the sequences per replica
    assert expected[OFFLOADED] == 2  # the H200 holds about twice the H100's sequences
    offloaded = status_of(kube, ns, OFFLOADED)
    assert offloaded["autoscaling"]["signalsUsed"] == ["runningFraction"]
    assert [i["field"] for i in offloaded["effective"]["ignored"]] == [
        "spec.autoscaling.targets.kvCacheUsage"
    ]
    assert offloaded["capacity"]["cpuTier"]["mode"] == "offload"
    for name in services:
        fleet.engines[name].serve(vllm_exposition(waiting=0, running=running, kv_usage=usage(name)))
    for name in services:
        wait_until(
            lambda name=name: serving(kube, ns, name) == expected[name],
            what=f"{name}: {expected[name]} replicas serving {running} running requests",
            timeout=TIMEOUT,
            describe=describe,
        )
    auto_status = status_of(kube, ns, "scale-fp8")["autoscaling"]
    assert auto_status["desiredReplicas"] == expected["scale-fp8"]
    # What the same load would have cost with the auto cache, said in the fp8 service's status.
    assert auto_status["replicasWithAutoCache"] == expected["scale-auto"]
    # A scale is not a rollout: the ladder and the cache stay as they were.
    for name, dtype in services.items():
        status = status_of(kube, ns, name)
        assert status["effective"]["kvCacheDtype"] == dtype
        assert status["fallback"]["attempts"] == []

    for name, engine in fleet.engines.items():
        engine.serve(vllm_exposition(waiting=0, running=0, kv_usage=usage(name)))
    for name in services:
        wait_until(
            lambda name=name: serving(kube, ns, name) == 1,
            what=f"{name}: back to 1 replica once nothing runs (a full KV cache or not)",
            timeout=TIMEOUT,
            describe=describe,
        )
    assert all(engine.scrapes > 0 for engine in fleet.engines.values())
