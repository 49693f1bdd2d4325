"""Debian's Prometheus for the engine and cluster tiers (e2e/prometheus/server.py)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from e2e.devcluster.waits import wait_until
from e2e.prometheus import server as prometheus_server

from kvq.catalog.engines import EngineMetrics
from kvq.decide.metrics import EngineReading
from kvq.observe.prometheus import PrometheusReader

__all__ = ["prometheus_server", "require_prometheus", "wait_for_reading"]


def require_prometheus() -> None:
    if not prometheus_server.installed():
        pytest.skip(
            f"{prometheus_server.BINARY} not installed: run `make prometheus` "
            "(Debian's package, e2e/prometheus/install.sh)"
        )


def wait_for_reading(
    url: str,
    namespace: str,
    service: str,
    metrics: EngineMetrics,
    accept: Callable[[EngineReading], bool],
    *,
    what: str,
    timeout: float = 60.0,
) -> EngineReading:
    """Asks Prometheus through kvq's reader (no rate limit) until `accept` holds."""
    reader = PrometheusReader(url, min_interval=timedelta(0))
    last: list[EngineReading | None] = [None]

    def probe() -> EngineReading | None:
        last[0] = reader.read(namespace, service, metrics)
        return last[0] if last[0] is not None and accept(last[0]) else None

    return wait_until(probe, what=what, timeout=timeout, describe=lambda: f"last: {last[0]}")
