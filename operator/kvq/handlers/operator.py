"""The kopf registry `kvq run` starts: startup, indices, and one reconcile on every trigger.

Handlers are registered on a registry built at run time (not at import), so the timer's
interval and the watched namespaces come from the command line.
"""

from __future__ import annotations

import faulthandler
import logging
import secrets
import signal
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, cast

import kopf

from kvq.api import keys
from kvq.api.models import GROUP, PLURAL, VERSION
from kvq.catalog.engines import load_engine_catalog
from kvq.catalog.gpus import load_gpu_catalog
from kvq.catalog.models import load_model_catalog
from kvq.decide.types import Catalogs, OperatorConfig
from kvq.handlers import indices
from kvq.handlers.reconcile import Observed, Runtime, reconcile
from kvq.k8s.clients import Clients, load_api_client
from kvq.metrics import serve_metrics
from kvq.observe.prometheus import PrometheusReader, min_query_gap
from kvq.placement.discovery import DEFAULT_POOL_LABELS

DEFAULT_INTERVAL = 10.0
DEFAULT_METRICS_PORT = 8080
DEFAULT_METRICS_INTERVAL = 60.0


@dataclass(frozen=True)
class RunOptions:
    """`kvq run`'s flags."""

    namespaces: tuple[str, ...] = ()
    all_namespaces: bool = False
    peering: str | None = None
    standalone: bool = False
    interval: float = DEFAULT_INTERVAL
    metrics_port: int = DEFAULT_METRICS_PORT
    liveness: str | None = None
    priority: int | None = None
    verbose: bool = False
    prometheus_url: str | None = None
    """Where to read engine metrics for status.metrics (None: no metrics)."""
    metrics_interval: float = DEFAULT_METRICS_INTERVAL
    """Least seconds between two writes of status.metrics of one InferenceService."""
    pool_labels: tuple[str, ...] = ()
    """Node labels naming a GPU pool, tried in order; kvq's defaults when empty."""


def on_startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # kopf's own Events only for problems; kvq posts its decisions itself.
    settings.posting.level = logging.WARNING
    # Status is kvq's API: kopf keeps its bookkeeping in annotations, never in status.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=keys.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=keys.GROUP)
    # kopf blocks deletion while a timer runs on the object; the marker is kvq's own key.
    settings.persistence.finalizer = keys.FINALIZER
    # A deletion that lands while a (sync) timer pass runs waits for that pass to end: give
    # it half a second, then re-check every second. kopf's default re-checks after 60 s,
    # which held deletions for a minute whenever they met a running reconcile.
    settings.background.instant_exit_timeout = 0.5
    settings.background.cancellation_polling = 1.0
    options: RunOptions = memo.get("options") or RunOptions()
    # Given exact namespaces, kopf need not list Namespaces (the chart's namespaced RBAC
    # forbids it, and kopf retried for ~55 s before falling back to the names it had).
    if options.namespaces and not options.all_namespaces:
        settings.scanning.disabled = True
    clients = Clients(load_api_client())
    clients.discover()
    config = OperatorConfig(
        pool_labels=options.pool_labels or DEFAULT_POOL_LABELS,
        metrics_min_interval=timedelta(seconds=options.metrics_interval),
    )
    memo.runtime = Runtime(
        catalogs=Catalogs(
            gpus=load_gpu_catalog(),
            engines=load_engine_catalog(),
            models=load_model_catalog(),
        ),
        config=config,
        clients=clients,
        metrics_reader=_metrics_reader(options, config),
    )


def _metrics_reader(options: RunOptions, config: OperatorConfig) -> PrometheusReader | None:
    if not options.prometheus_url:
        return None
    reader = PrometheusReader(
        options.prometheus_url, min_interval=min_query_gap(config.metrics_min_interval)
    )
    logging.getLogger(__name__).info("reading engine metrics from Prometheus at %s", reader.url)
    return reader


def on_inference_service(body: kopf.Body, memo: kopf.Memo, **kwargs: Any) -> None:
    runtime: Runtime = memo.runtime
    observed = Observed(
        nodes=kwargs["kvq_nodes"],
        pods=kwargs[indices.POD_INDEX],
        owned=[kwargs[index_id] for index_id in indices.OWNED_INDICES],
    )
    reconcile(runtime, body, observed)


def build_registry(interval: float = DEFAULT_INTERVAL) -> kopf.OperatorRegistry:
    # kopf's protocols spell out every kwarg; kvq's handlers take what they use, hence Any.
    registry: Any = kopf.OperatorRegistry()
    # The same login the executor's client uses: in-cluster, else kubeconfig.
    kopf.on.login(registry=registry)(kopf.login_via_client)
    kopf.on.startup(registry=registry)(_handler(on_startup))
    kopf.index("v1", "nodes", registry=registry)(_handler(indices.kvq_nodes))
    managed = indices.MANAGED_BY_KVQ
    by_owner = _handler(indices.by_inference_service)
    kopf.index("v1", "pods", labels=managed, id=indices.POD_INDEX, registry=registry)(by_owner)
    for index_id, (group, version, plural) in indices.OWNED_INDICES.items():
        api = f"{group}/{version}" if group else version
        kopf.index(api, plural, labels=managed, id=index_id, registry=registry)(by_owner)
    handler = _handler(on_inference_service)
    for trigger in (kopf.on.create, kopf.on.update, kopf.on.resume):
        trigger(GROUP, VERSION, PLURAL, id="reconcile", registry=registry)(handler)
    kopf.timer(GROUP, VERSION, PLURAL, id="reconcile-timer", interval=interval, registry=registry)(
        handler
    )
    return cast(kopf.OperatorRegistry, registry)


def _handler(fn: Any) -> Any:
    return fn


def run(options: RunOptions) -> None:
    """Serve metrics and run the operator until a signal stops it."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # kopf reports every handler pass at INFO; at a 10 s timer that drowns kvq's own lines.
    logging.getLogger("kopf.objects").setLevel(logging.INFO if options.verbose else logging.WARNING)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # every liveness probe
    # `kill -USR1 <pid>` prints every thread's stack: how to see where a reconcile hangs.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    serve_metrics(options.metrics_port)
    kopf.run(
        registry=build_registry(options.interval),
        clusterwide=options.all_namespaces,
        namespaces=list(options.namespaces),
        standalone=options.standalone or None,
        peering_name=options.peering,
        # Same-priority peers all pause; a random priority leaves exactly one replica active.
        priority=options.priority if options.priority is not None else secrets.randbelow(2**30),
        liveness_endpoint=options.liveness,
        memo=kopf.Memo(options=options),
    )
