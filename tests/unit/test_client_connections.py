"""kvq's writes reuse the client's connections: an answer nobody reads must not cost a new
TLS connection per request (on a busy API server each handshake is CPU on both sides).

A real HTTP/1.1 server with keep-alive, counting the connections it accepts; the client is
kvq's own (`Clients`, the dynamic client and urllib3's pool) pointed at it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from kubernetes import client as k8s

from kvq.decide.types import EventSpec
from kvq.k8s.apply import server_side_apply
from kvq.k8s.clients import Clients
from kvq.k8s.events import post_event

ANSWER = json.dumps({"kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"a": "b" * 4096}})
# The dynamic client's discovery, as little of it as it reads.
DISCOVERY = {
    "/version": {"major": "1", "minor": "36", "gitVersion": "v1.36.3"},
    "/api": {"kind": "APIVersions", "versions": ["v1"]},
    "/apis": {"kind": "APIGroupList", "groups": []},
    "/api/v1": {"kind": "APIResourceList", "groupVersion": "v1", "resources": []},
}
REQUESTS = 6


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: one connection serves many requests

    def setup(self) -> None:
        super().setup()
        with self.server.lock:  # type: ignore[attr-defined]
            self.server.connections += 1  # type: ignore[attr-defined]

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        found = DISCOVERY.get(self.path.split("?")[0])
        body = json.dumps(found).encode() if found else ANSWER.encode()
        self.send_response(200 if found else 201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PATCH = do_POST = do_PUT = _answer  # noqa: N815 (http.server names them so)

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def _server() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.lock = threading.Lock()  # type: ignore[attr-defined]
    server.connections = 0  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _clients(server: ThreadingHTTPServer) -> Clients:
    configuration = k8s.Configuration()
    configuration.host = f"http://127.0.0.1:{server.server_address[1]}"
    return Clients(k8s.ApiClient(configuration))


class _ConfigMaps:
    """The dynamic client's resource, as discovery would give it (no discovery here)."""

    namespaced, group_version, kind = True, "v1", "ConfigMap"

    def path(self, name: str | None = None, namespace: str | None = None) -> str:
        return f"/api/v1/namespaces/{namespace}/configmaps/{name}"


def test_applies_whose_answer_nobody_reads_reuse_one_connection() -> None:
    from kvq.k8s.apply import _server_side_apply

    manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "x", "namespace": "team"},
        "data": {"a": "b"},
    }
    with _server() as server:
        clients = _clients(server)
        for _ in range(REQUESTS):
            assert _server_side_apply(clients, _ConfigMaps(), manifest, "team", dry_run=False) == {}
        assert server.connections == 1  # type: ignore[attr-defined]


def test_events_posted_reuse_one_connection() -> None:
    isvc = {
        "apiVersion": "kvq.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "chat", "namespace": "team", "uid": "u1", "resourceVersion": "7"},
    }
    with _server() as server:
        clients = _clients(server)
        for n in range(REQUESTS):
            post_event(clients, isvc, EventSpec("Normal", "Placed", f"#{n}"), datetime.now(UTC))
        assert server.connections == 1  # type: ignore[attr-defined]


def test_a_dry_run_apply_still_returns_the_servers_answer() -> None:
    with _server() as server:
        clients = _clients(server)
        manifest = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}
        response = server_side_apply(
            clients.dynamic, _ConfigMaps(), manifest, "team", field_manager="kvq", force=True,
            dry_run=True, serialize=False,
        )  # fmt: skip
        assert json.loads(response.data)["data"]["a"] == "b" * 4096
