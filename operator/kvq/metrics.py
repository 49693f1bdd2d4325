"""The operator's own Prometheus metrics (served by `kvq run --metrics-port`).

`kvq_writes_total` counts real writes only (dry-runs and reads are not writes), so a test
or a dashboard can prove that a reconcile with nothing changed writes nothing.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server

RECONCILES = Counter(
    "kvq_reconciles",
    "Reconciles of an InferenceService, by result (ok, invalid, deleting, conflict, error).",
    ["result"],
)
RECONCILE_ERRORS = Counter(
    "kvq_reconcile_errors",
    "Reconciles that raised an unexpected error (retried with a back-off).",
)
FALLBACKS = Counter(
    "kvq_fallbacks",
    "Fallback decisions carried out, by Event reason (Fallback...).",
    ["reason"],
)
DECISION_SECONDS = Histogram(
    "kvq_decision_seconds",
    "Time spent in the pure decide() function.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
WRITES = Counter(
    "kvq_writes",
    "Writes kvq made to the API server, by object kind and verb (apply, delete, status, create).",
    ["kind", "verb"],
)
READS = Counter(
    "kvq_reads",
    "Requests kvq made outside its watches, by object kind and verb (get, dry-run, log).",
    ["kind", "verb"],
)
_SLOW_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
QUEUE_WAIT_SECONDS = Histogram(
    "kvq_queue_wait_seconds",
    "Time a service waited in the reconcile queue for a worker (from the change that queued it).",
    buckets=_SLOW_BUCKETS,
)
QUEUE_DEPTH = Gauge(
    "kvq_queue_depth",
    "Services waiting in the reconcile queue for a worker.",
)
WORK_SECONDS = Histogram(
    "kvq_work_seconds",
    "Time one pass held its worker: read, decide and its writes.",
    buckets=_SLOW_BUCKETS,
)
WRITE_WAIT_SECONDS = Histogram(
    "kvq_write_wait_seconds",
    "Time a write waited for a writer (and the write rate limit), by urgency (0 most urgent).",
    ["urgency"],
    buckets=_SLOW_BUCKETS,
)

FALLBACK_REASON_PREFIX = "Fallback"


def count_write(kind: str, verb: str) -> None:
    WRITES.labels(kind=kind, verb=verb).inc()


def count_read(kind: str, verb: str) -> None:
    READS.labels(kind=kind, verb=verb).inc()


def count_event(reason: str) -> None:
    """Every fallback Event carried out is one fallback, counted under its reason."""
    if reason.startswith(FALLBACK_REASON_PREFIX):
        FALLBACKS.labels(reason=reason).inc()


def serve_metrics(port: int, address: str = "0.0.0.0") -> None:
    """Serve /metrics on `port` from a daemon thread (0 disables it)."""
    if port:
        start_http_server(port, addr=address)
