"""The Prometheus reader against a local HTTP server speaking Prometheus' query API.

The server is real HTTP (the client library, retries and timeouts all run); it answers
/api/v1/query with what the test sets and records what it was asked.
"""

from __future__ import annotations

import base64
import json
import logging
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from kvq.catalog.engines import load_engine_catalog
from kvq.observe.prometheus import PrometheusReader

METRICS = load_engine_catalog().capability("0.32.0").metrics
GAP = timedelta(seconds=30)
VECTOR = [
    {
        "metric": {"__name__": "vllm:kv_cache_usage_perc", "namespace": "team", "service": "chat"},
        "value": [1764504000.0, "0.5"],
    },
    {
        "metric": {
            "__name__": "vllm:cache_config_info",
            "namespace": "team",
            "service": "chat",
            "cache_dtype": "fp8",
            "kv_cache_size_tokens": "4194304",
        },
        "value": [1764504000.0, "1"],
    },
]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class QueryApi:
    """What the stand-in answers, and what it was asked."""

    def __init__(self) -> None:
        self.status = 200
        self.result: list[dict[str, Any]] = VECTOR
        self.queries: list[str] = []
        self.authorizations: list[str | None] = []


@contextmanager
def serving(state: QueryApi, port: int = 0) -> Iterator[str]:
    """Answers on 127.0.0.1:`port` (0: any free port); yields `host:port`."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urlsplit(self.path)
            state.queries.extend(parse_qs(url.query).get("query", []))
            state.authorizations.append(self.headers.get("Authorization"))
            body = json.dumps(
                {"status": "success", "data": {"resultType": "vector", "result": state.result}}
            ).encode()
            self.send_response(state.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


@pytest.fixture
def api() -> Iterator[tuple[QueryApi, str]]:
    state = QueryApi()
    with serving(state) as address:
        yield state, address


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_reading_comes_from_one_query_per_interval(api: tuple[QueryApi, str]) -> None:
    state, address = api
    clock = FakeClock()
    reader = PrometheusReader(f"http://{address}", min_interval=GAP, clock=clock)

    first = reader.read("team", "chat", METRICS)
    again = reader.read("team", "chat", METRICS)
    clock.now += GAP.total_seconds()
    later = reader.read("team", "chat", METRICS)

    assert first is not None and first.kv_cache_usage == 0.5
    assert (first.cache_dtype, first.kv_tokens) == ("fp8", 4194304)
    assert again is first
    assert later is not None and later is not first
    assert len(state.queries) == 2
    assert 'namespace="team",service="chat"' in state.queries[0]


def test_each_inference_service_has_its_own_interval(api: tuple[QueryApi, str]) -> None:
    state, address = api
    reader = PrometheusReader(f"http://{address}", min_interval=GAP, clock=FakeClock())

    reader.read("team", "chat", METRICS)
    reader.read("team", "summarize", METRICS)

    assert len(state.queries) == 2


def test_no_series_is_no_reading(api: tuple[QueryApi, str]) -> None:
    state, address = api
    state.result = []
    reader = PrometheusReader(f"http://{address}", min_interval=GAP)

    assert reader.read("team", "chat", METRICS) is None


def test_credentials_in_the_url_go_as_basic_auth_and_never_into_the_log(
    api: tuple[QueryApi, str], caplog: pytest.LogCaptureFixture
) -> None:
    state, address = api
    state.status = 500
    reader = PrometheusReader(f"http://kvq:s3cret@{address}/", min_interval=GAP)

    with caplog.at_level(logging.DEBUG, logger="kvq.observe"):
        assert reader.read("team", "chat", METRICS) is None

    assert state.authorizations == ["Basic " + base64.b64encode(b"kvq:s3cret").decode()]
    assert reader.url == f"http://{address}"
    assert "s3cret" not in caplog.text
    assert address in caplog.text


def test_an_unreachable_prometheus_is_no_reading_logged_once_until_it_recovers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = free_port()
    clock = FakeClock()
    reader = PrometheusReader(f"http://127.0.0.1:{port}", min_interval=GAP, clock=clock)

    with caplog.at_level(logging.INFO, logger="kvq.observe"):
        for _ in range(3):
            assert reader.read("team", "chat", METRICS) is None
            clock.now += GAP.total_seconds()
        with serving(QueryApi(), port):
            assert reader.read("team", "chat", METRICS) is not None

    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, caplog.text
    assert "ConnectionError" in warnings[0].getMessage()
    assert "answers again" in caplog.records[-1].getMessage()
