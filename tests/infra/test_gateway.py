"""A real Gateway API implementation on the local control plane: Traefik routes an HTTPRoute.

Two Services, each backed by one KWOK pod with a real HTTP server on the pod's IP and port;
an HTTPRoute on the add-on's Gateway sends requests with `x-kvq-tier: critical` to one and
everything else to the other. The pods run on the add-on's edge node with `hostNetwork`, so
their IP is a non-loopback address of this machine: the API server refuses loopback
endpoint addresses, and Traefik only routes to what the Services' EndpointSlices list.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest
from e2e.devcluster.clients import Kube
from e2e.devcluster.waits import is_running_and_ready, wait_for_pod, wait_until

from tests.gateway_support import SETTLING, through_gateway
from tests.infra.servers import NamedServer, named_server

pytestmark = pytest.mark.cluster

HEADER = "x-kvq-tier"
CRITICAL, DEFAULT = "critical", "default"
SERVICE_PORT = 80
TIMEOUT = 90


def pod(name: str, port: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "hostNetwork": True,
            "nodeSelector": {"kvq.dev/edge": "true"},
            "tolerations": [{"key": "kvq.dev/edge", "operator": "Exists"}],
            "containers": [
                {
                    "name": "engine",
                    "image": "vllm/vllm-openai:v0.26.0",
                    "ports": [{"containerPort": port, "name": "http"}],
                }
            ],
        },
    }


def service(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {
            "selector": {"app": name},
            "ports": [{"name": "http", "port": SERVICE_PORT, "targetPort": "http"}],
        },
    }


def route(gateway: dict[str, str], host: str) -> dict[str, Any]:
    def backend(name: str) -> list[dict[str, Any]]:
        return [{"name": name, "port": SERVICE_PORT}]

    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "tiers"},
        "spec": {
            "parentRefs": [{"name": gateway["gateway"], "namespace": gateway["namespace"]}],
            # The gateway is shared by the session's tests: on one listener, two routes with
            # the same matches resolve to the older one, so each test routes its own host.
            "hostnames": [host],
            "rules": [
                {
                    "matches": [{"headers": [{"name": HEADER, "value": CRITICAL}]}],
                    "backendRefs": backend(CRITICAL),
                },
                {"backendRefs": backend(DEFAULT)},
            ],
        },
    }


@pytest.fixture
def backends(
    kube: Kube, gateway: dict[str, str], namespace: str
) -> Iterator[dict[str, NamedServer]]:
    edge = gateway["edgeAddress"]
    if not edge:
        pytest.skip("this machine has no non-loopback IPv4 address for the edge node")
    with ExitStack() as stack:
        servers = {
            name: stack.enter_context(named_server(edge, 0, name)) for name in (CRITICAL, DEFAULT)
        }
        for name, server in servers.items():
            port = int(server.address.rsplit(":", 1)[1])
            body: Any = pod(name, port)
            kube.core.create_namespaced_pod(namespace, body)
            svc: Any = service(name)
            kube.core.create_namespaced_service(namespace, svc)
        for name in servers:
            ready = wait_for_pod(
                kube.core,
                namespace,
                is_running_and_ready,
                what=f"the {name} pod ready",
                label_selector=f"app={name}",
            )
            assert ready.status.pod_ip == edge
        yield servers


def test_a_header_match_routes_to_its_service_and_the_rest_to_the_default(
    kube: Kube, gateway: dict[str, str], namespace: str, backends: dict[str, NamedServer]
) -> None:
    host = f"{namespace}.kvq.test"
    kube.custom.create_namespaced_custom_object(
        "gateway.networking.k8s.io", "v1", namespace, "httproutes", route(gateway, host)
    )

    def accepted() -> bool:
        found: Any = kube.custom.get_namespaced_custom_object(
            "gateway.networking.k8s.io", "v1", namespace, "httproutes", "tiers"
        )
        parents = (found.get("status") or {}).get("parents") or []
        conditions = {c["type"]: c["status"] for p in parents for c in p.get("conditions", [])}
        return conditions.get("Accepted") == "True" and conditions.get("ResolvedRefs") == "True"

    wait_until(accepted, what="the HTTPRoute Accepted with its refs resolved", timeout=TIMEOUT)
    url = gateway["url"] + "/v1/models"
    # Programmed: each backend answers through the gateway (before that, Traefik's
    # settling answers are "not yet"; after it, any error fails the test).
    for headers, name in (({HEADER: CRITICAL}, CRITICAL), ({}, DEFAULT)):
        wait_until(
            lambda headers=headers, name=name: (
                through_gateway(url, {"Host": host, **headers}, SETTLING) == name
            ),
            what=f"the route to {name} programmed",
            timeout=TIMEOUT,
        )

    assert through_gateway(url, {"Host": host, HEADER: CRITICAL}) == CRITICAL
    assert through_gateway(url, {"Host": host}) == DEFAULT
    assert through_gateway(url, {"Host": host, HEADER: "other"}) == DEFAULT
    assert [r.get(HEADER) for r in backends[CRITICAL].requests] == [CRITICAL, CRITICAL]
    assert {r.get(HEADER) for r in backends[DEFAULT].requests} == {None, "other"}
