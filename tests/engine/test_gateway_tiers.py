"""Two tiers of one InferenceService behind a real gateway: Traefik routes real OpenAI
requests by kvq's HTTPRoute to real vLLM engines, fp8 for the default tier and auto for the
critical one, and forgets the critical tier when the spec drops it.

kvq places, renders and routes the two tiers on the local control plane (KWOK engine pods).
The engines themselves run here as processes, with the command kvq renders for each tier's
dtype (tests/engine/launch.py), listening on every address of this machine. KWOK's pods
have loopback addresses, which the API server refuses in an EndpointSlice, so the test
lists each engine under its tier's Service in an EndpointSlice of its own (the one part of
the pod network it stands in for), at this machine's non-loopback address; Traefik reads
EndpointSlices as it would in a cluster. Which engine answered is what the engine itself
says: `vllm:cache_config_info{cache_dtype=...}` in its /metrics, and its request counter.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
from e2e.devcluster.clients import Kube
from e2e.devcluster.waits import wait_until
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from kvq.api.keys import GROUP, PLURAL, VERSION
from tests.cluster.operator_support import install_kvq_crd, operator_running, read_isvc
from tests.engine.conftest import EnginePool, require_fp8
from tests.engine.launch import PROBE_MODEL, EngineCase, ServedEngine, cpu_features
from tests.engine.launch import inference_service as engine_service
from tests.gateway_support import SETTLING, through_gateway

pytestmark = [pytest.mark.engine, pytest.mark.cluster]

HEADER = "x-kvq-tier"
CRITICAL = "critical"
NAME = "kvq-probe-llama"  # the engine serves under this name
ROUTES = ("gateway.networking.k8s.io", "v1", "httproutes")
TIMEOUT = 120


@dataclass(frozen=True)
class Tiers:
    namespace: str
    name: str
    url: str
    host: str
    """The route's hostname: the gateway is shared by the session's tests, and two routes
    with the same matches on one listener resolve to the older one."""
    engines: dict[str, ServedEngine]
    """By Service name: the default tier's (the InferenceService's name) and the critical's."""

    def get(self, path: str, headers: dict[str, str], settling: tuple[int, ...] = ()) -> str | None:
        return through_gateway(self.url + path, {"Host": self.host, **headers}, settling)


def two_tiers(gateway: dict[str, str], host: str) -> dict[str, Any]:
    """The engine tier's InferenceService for the probe model (fp8), with a critical tier on
    the auto cache and a route on the add-on's Gateway."""
    spec = engine_service(EngineCase(PROBE_MODEL, "fp8")).spec
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "InferenceService",
        "metadata": {"name": NAME},
        "spec": {
            "model": {
                # On the cluster the engines are KWOK pods: a Hub URI needs no volume there
                # (the engines that answer run here, from the engine tier's model copy).
                "uri": f"hf://kvq-tests/{NAME}",
                # The probe model's shape (e2e/engine/train_model.py's Recipe): kvq plans it.
                "architecture": {
                    "numLayers": 4,
                    "numAttentionHeads": 4,
                    "numKvHeads": 2,
                    "headDim": 32,
                    "hiddenSize": 128,
                    "intermediateSize": 384,
                    "vocabSize": 1024,
                },
            },
            "engine": {"image": spec.engine.image, "extraArgs": list(spec.engine.extra_args)},
            "kvCache": {"dtype": "fp8"},
            "memory": {"maxModelLen": spec.memory.max_model_len},
            "placement": {"pools": ["l4-pool"]},
            "tiers": [{"name": CRITICAL, "kvCache": {"dtype": "auto"}}],
            "routing": {
                "parentRefs": [{"name": gateway["gateway"], "namespace": gateway["namespace"]}],
                "hostnames": [host],
            },
        },
    }


def rendered_dtype(kube: Kube, namespace: str, name: str) -> str:
    deployment: Any = kube.apps.read_namespaced_deployment(name, namespace)
    container = deployment.spec.template.spec.containers[0]
    argv = list(container.command or []) + list(container.args or [])
    return str(argv[argv.index("--kv-cache-dtype") + 1])


def list_under_service(kube: Kube, namespace: str, service: str, address: str, port: int) -> None:
    """An EndpointSlice that puts the engine at address:port behind `service`."""
    live: Any = kube.core.read_namespaced_service(service, namespace)
    port_name = live.spec.ports[0].name
    body: Any = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{service}-engine-on-host",
            "labels": {"kubernetes.io/service-name": service},
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
        "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
    }
    k8s.DiscoveryV1Api(kube.api).create_namespaced_endpoint_slice(namespace, body)


def route_rules(kube: Kube, namespace: str, name: str) -> list[dict[str, Any]]:
    found: Any = kube.custom.get_namespaced_custom_object(*ROUTES[:2], namespace, ROUTES[2], name)
    rules: list[dict[str, Any]] = found["spec"]["rules"]
    return rules


def route_accepted(kube: Kube, namespace: str, name: str) -> bool:
    try:
        found: Any = kube.custom.get_namespaced_custom_object(
            *ROUTES[:2], namespace, ROUTES[2], name
        )
    except ApiException as error:
        if error.status == 404:
            return False
        raise
    parents = (found.get("status") or {}).get("parents") or []
    conditions = {c["type"]: c["status"] for p in parents for c in p.get("conditions", [])}
    return conditions.get("Accepted") == "True" and conditions.get("ResolvedRefs") == "True"


def cache_dtype(metrics: str) -> str | None:
    for family in text_string_to_metric_families(metrics):
        if family.name == "vllm:cache_config_info":
            return str(family.samples[0].labels["cache_dtype"])
    return None


def successes(metrics: str) -> float:
    """Requests the engine finished (any reason), from its own counter."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == "vllm:request_success_total"
    )


@pytest.fixture
def tiers(
    kube: Kube,
    gateway: dict[str, str],
    namespace: str,
    engines: EnginePool,
    cpu_backend: cpu_features.CpuBackend,
    tmp_path: Path,
) -> Iterator[Tiers]:
    edge = gateway["edgeAddress"]
    if not edge:
        pytest.skip("this machine has no non-loopback IPv4 address to list the engines at")
    require_fp8(cpu_backend)
    install_kvq_crd(kube)
    host = f"{namespace}.kvq.test"
    body = two_tiers(gateway, host)
    name = NAME
    services = {name: "fp8", f"{name}-{CRITICAL}": "auto"}
    with operator_running(kube, namespace, tmp_path / "operator.log") as operator:
        kube.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)

        def both_ready() -> bool:
            status = read_isvc(kube, namespace, name).get("status") or {}
            return status.get("tiersReady") == "2/2"

        wait_until(both_ready, what="both tiers Ready", timeout=TIMEOUT, describe=operator.log_tail)
        served = {}
        for service, dtype in services.items():
            # The dtype kvq rendered for the tier is the engine that runs for it.
            assert rendered_dtype(kube, namespace, service) == dtype
            served[service] = engines.serve(EngineCase(PROBE_MODEL, dtype))
            list_under_service(kube, namespace, service, edge, served[service].engine.port)
        # Traefik resolves a backend only once its Service has an EndpointSlice (the
        # controller's own may come late: it backs off on the KWOK pods' loopback IPs).
        wait_until(
            lambda: route_accepted(kube, namespace, name),
            what="kvq's HTTPRoute Accepted by Traefik with its refs resolved",
            timeout=TIMEOUT,
            describe=operator.log_tail,
        )
        tiers = Tiers(namespace, name, gateway["url"], host, served)
        # Accepted is written before Traefik's router has the route: until its next
        # configuration, a rule may name a backend it has not resolved yet and answer 500.
        # Programmed means each tier's engine answers through the gateway; from then on a
        # 500 is a failure (the tests call `get` without tolerating it).
        for headers, dtype in (({HEADER: CRITICAL}, "auto"), ({}, "fp8")):
            wait_until(
                lambda headers=headers, dtype=dtype: (
                    cache_dtype(tiers.get("/metrics", headers, SETTLING) or "") == dtype
                ),
                what=f"the {dtype} tier's engine answering through the gateway",
                timeout=TIMEOUT,
                describe=operator.log_tail,
            )
        yield tiers


def test_the_header_reaches_the_auto_tier_and_the_rest_the_fp8_tier(
    kube: Kube, tiers: Tiers
) -> None:
    critical = {HEADER: CRITICAL}
    # The route is programmed (the fixture saw both engines answer): every answer now is
    # a 200 from the engine of the header's tier, again and again.
    for _ in range(3):
        assert cache_dtype(tiers.get("/metrics", critical) or "") == "auto"
        assert cache_dtype(tiers.get("/metrics", {}) or "") == "fp8"

    before = {s: successes(e.engine.get_text("/metrics")) for s, e in tiers.engines.items()}
    model = tiers.engines[tiers.name].served_model_name
    for headers, sent in ((critical, 2), ({}, 3)):
        client = openai.OpenAI(
            base_url=tiers.url + "/v1",
            api_key="unused",
            default_headers={"Host": tiers.host, **headers},
            timeout=120,
        )
        for _ in range(sent):
            answer = client.completions.create(model=model, prompt="The key is", max_tokens=4)
            assert answer.choices[0].text
    after = {s: successes(e.engine.get_text("/metrics")) for s, e in tiers.engines.items()}
    assert after[f"{tiers.name}-{CRITICAL}"] - before[f"{tiers.name}-{CRITICAL}"] == 2
    assert after[tiers.name] - before[tiers.name] == 3


def test_dropping_the_tier_removes_its_deployment_service_and_rule(
    kube: Kube, tiers: Tiers
) -> None:
    ns, name = tiers.namespace, tiers.name
    assert len(route_rules(kube, ns, name)) == 2
    kube.custom.patch_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL, name, {"spec": {"tiers": []}}
    )

    def gone(read: Any) -> bool:
        try:
            read(f"{name}-{CRITICAL}", ns)
        except ApiException as error:
            return error.status == 404
        return False

    wait_until(
        lambda: gone(kube.apps.read_namespaced_deployment),
        what="the critical tier's Deployment deleted",
        timeout=TIMEOUT,
    )
    wait_until(
        lambda: gone(kube.core.read_namespaced_service),
        what="the critical tier's Service deleted",
        timeout=TIMEOUT,
    )
    wait_until(
        lambda: len(route_rules(kube, ns, name)) == 1,
        what="the route left with the default rule only",
        timeout=TIMEOUT,
    )
    # The header now means nothing: the request reaches the default (fp8) engine. Until
    # Traefik has read the new route, its old rule names a Service that is gone: a 500.
    assert wait_until(
        lambda: cache_dtype(tiers.get("/metrics", {HEADER: CRITICAL}, SETTLING) or "") == "fp8",
        what="the header routed to the default tier",
        timeout=TIMEOUT,
    )
