"""The operator's engine-metrics reader: one instant query to Prometheus per InferenceService.

Rate-limited per InferenceService (a reconcile on every trigger may call it freely), bounded
by a timeout with no retries (the next timer tick is the retry), and it never raises: an
unreachable or erroring Prometheus means no reading (None), logged once until it recovers.
Credentials in the URL (`https://user:pass@host`) are sent as basic auth and never logged.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, cast
from urllib.parse import urlsplit, urlunsplit

import requests
from prometheus_api_client.exceptions import PrometheusApiClientException
from prometheus_api_client.prometheus_connect import PrometheusConnect
from urllib3.util.retry import Retry

from kvq.catalog.engines import EngineMetrics
from kvq.decide.metrics import EngineReading
from kvq.observe.series import parse_vector, reading_from_series, series_query

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 5.0
# Error text can be long (a response body); a log line needs the start.
_ERROR_EXCERPT = 300


@dataclass(frozen=True)
class _Cached:
    at: float
    reading: EngineReading | None


def without_credentials(url: str) -> str:
    """`url` without user, password, query or fragment: safe to log or to hand to KEDA."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host  # IPv6 literal
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


class PrometheusReader:
    """Reads EngineReadings for InferenceServices from one Prometheus."""

    def __init__(
        self,
        url: str,
        *,
        min_interval: timedelta,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        parts = urlsplit(url)
        auth = (parts.username or "", parts.password or "") if parts.username else None
        clean = without_credentials(url)
        self.url = clean
        """The URL without credentials: safe to log."""
        self._client = PrometheusConnect(
            url=clean,
            auth=cast(Any, auth),  # typed as a bare tuple; None means "no auth"
            timeout=cast(Any, timeout_s),  # typed int; requests takes seconds as float
            retry=Retry(total=0),  # bounded: the next tick retries, not this reconcile
        )
        self._min_gap = min_interval.total_seconds()
        self._clock = clock
        self._cache: dict[tuple[str, str], _Cached] = {}
        self._lock = threading.Lock()
        self._failing = False

    def read(self, namespace: str, service: str, metrics: EngineMetrics) -> EngineReading | None:
        """The engines' reading, queried at most once per `min_interval` per service.

        None when Prometheus has no series for the service, or cannot be asked.
        """
        key = (namespace, service)
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None and self._clock() - cached.at < self._min_gap:
                return cached.reading
        reading = self._query(namespace, service, metrics)
        with self._lock:
            self._cache[key] = _Cached(self._clock(), reading)
        return reading

    def _query(self, namespace: str, service: str, metrics: EngineMetrics) -> EngineReading | None:
        query = series_query(namespace, service, metrics)
        observed_at = datetime.now(UTC)
        try:
            result = self._client.custom_query(query)
            series = parse_vector(result)
        except (
            requests.RequestException,
            PrometheusApiClientException,
            ValueError,
            KeyError,
            TypeError,
            IndexError,
        ) as error:
            self._report_failure(error)
            return None
        if self._failing:
            logger.info("Prometheus at %s answers again", self.url)
            self._failing = False
        return reading_from_series(series, metrics, observed_at)

    def _report_failure(self, error: Exception) -> None:
        text = str(error)[:_ERROR_EXCERPT]
        if self._failing:
            logger.debug("Prometheus at %s still failing: %s", self.url, text)
            return
        self._failing = True
        logger.warning(
            "cannot read engine metrics from Prometheus at %s (%s: %s); status.metrics keeps "
            "its last value until it answers",
            self.url,
            type(error).__name__,
            text,
        )


def min_query_gap(write_interval: timedelta) -> timedelta:
    """Half the status-write interval: a due write always finds a reading that is fresh."""
    return write_interval / 2
