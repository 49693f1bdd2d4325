"""The kopf registry `kvq run` starts: startup, indices, watch events, one daemon per service.

Handlers are registered on a registry built at run time (not at import), so settings and
watched namespaces come from the command line. Watch events only queue a service; the
controller's workers reconcile (handlers.controller), and each InferenceService's daemon
keeps it served while kopf serves it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import faulthandler
import logging
import secrets
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from typing import Any, cast

import kopf

from kvq.api import keys
from kvq.api.keys import GROUP, PLURAL, VERSION
from kvq.catalog.engines import load_engine_catalog
from kvq.catalog.gpus import load_gpu_catalog
from kvq.catalog.models import load_model_catalog
from kvq.decide.engine_workload import ENGINE_KINDS
from kvq.decide.types import DEFAULT_OPERATOR_IMAGE, Catalogs, OperatorConfig
from kvq.fallback.evidence import evidence_from_pod
from kvq.fallback.ladder import LadderPolicy
from kvq.handlers import indices
from kvq.handlers.controller import (
    DEFAULT_RESYNC,
    DEFAULT_WORKERS,
    Controller,
    PassResult,
    owner_of,
)
from kvq.handlers.reconcile import Decided, Observed, Runtime, carry_out, decide_pass
from kvq.handlers.workqueue import Priority
from kvq.k8s.clients import Clients, load_api_client
from kvq.k8s.writers import DEFAULT_BURST, DEFAULT_QPS, WRITERS, WRITES, RateLimit
from kvq.metrics import serve_metrics
from kvq.observe.prometheus import PrometheusReader, min_query_gap, without_credentials
from kvq.placement.discovery import DEFAULT_POOL_LABELS
from kvq.render.autoscaling import PrometheusAccess

DEFAULT_METRICS_PORT = 8080
DEFAULT_METRICS_INTERVAL = 60.0
# kopf stops a daemon by cancelling it; a reconcile in a worker thread finishes on its own.
DAEMON_CANCELLATION_TIMEOUT = 5.0
DEFAULT_PEERING_LIFETIME = 60
DAEMON_ID = "reconcile"


@dataclass(frozen=True)
class RunOptions:
    """`kvq run`'s flags."""

    namespaces: tuple[str, ...] = ()
    all_namespaces: bool = False
    peering: str | None = None
    standalone: bool = False
    resync: float = DEFAULT_RESYNC.total_seconds()
    """Seconds between safety-net reconciles of a service nothing has changed about."""
    workers: int = DEFAULT_WORKERS
    """Passes at once (their writes share the writers: kvq.k8s.writers)."""
    qps: float = DEFAULT_QPS
    """Writes a second kvq sends at most, on average (client-go's QPS)."""
    burst: int = DEFAULT_BURST
    """Writes kvq may send at once above `qps` (client-go's burst)."""
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
    ladder: LadderPolicy = field(default_factory=LadderPolicy)
    autoscaling_prometheus_url: str | None = None
    """Where KEDA reads the engine signals; default: --prometheus-url without credentials."""
    autoscaling_authentication: str | None = None
    """A KEDA ClusterTriggerAuthentication holding Prometheus' credentials, by name."""
    operator_image: str = DEFAULT_OPERATOR_IMAGE
    """kvq's own image, for the model download (kvq fetch) and quality probes (kvq probe)."""
    peering_lifetime: int = DEFAULT_PEERING_LIFETIME
    """Seconds a replica's peering record lives without a heartbeat: how long a standby
    waits before taking over from a replica that died without saying goodbye."""


class EssenceFree(kopf.AnnotationsDiffBaseStorage):
    """kopf's diff base, never built. kopf takes a deep copy of every watched object's body
    on every event (pods, Deployments, nodes: a quarter of the operator's event handling
    during a fleet's rollout) to diff it for change handlers (on.create, on.update,
    on.field); kvq registers none, so the copy is never read."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return cast(kopf.BodyEssence, {})


def on_startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # kopf's own Events only for problems; kvq posts its decisions itself.
    settings.posting.level = logging.WARNING
    # Status is kvq's API: kopf keeps its bookkeeping in annotations, never in status.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=keys.GROUP)
    settings.persistence.diffbase_storage = EssenceFree(prefix=keys.GROUP)
    # kopf keeps a finalizer while a daemon runs on the object; the marker is kvq's own key.
    settings.persistence.finalizer = keys.FINALIZER
    # kopf holds each object's event 0.1 s for more before handling it; kvq's handlers only
    # queue a key, and the queue folds a burst's events into one pass, so a new service's
    # first pass need not wait (a tenth of its time to a Deployment at 100 services: make bench).
    settings.batching.batch_window = 0.01
    settings.background.instant_exit_timeout = 0.5
    settings.background.cancellation_polling = 1.0
    options: RunOptions = memo.get("options") or RunOptions()
    settings.peering.lifetime = options.peering_lifetime
    # Given exact namespaces, kopf need not list Namespaces (the chart's namespaced RBAC
    # forbids it, and kopf retried for ~55 s before falling back to the names it had).
    if options.namespaces and not options.all_namespaces:
        settings.scanning.disabled = True
    clients = Clients(load_api_client())
    WRITES.configure(WRITERS, RateLimit(options.qps, options.burst))
    clients.discover()
    pool_labels = options.pool_labels or DEFAULT_POOL_LABELS
    config = OperatorConfig(
        pool_labels=pool_labels,
        metrics_min_interval=timedelta(seconds=options.metrics_interval),
        ladder=options.ladder,
        autoscaling_prometheus=_autoscaling_prometheus(options),
        operator_image=options.operator_image,
    )
    controller = Controller(
        workers=options.workers,
        resync=timedelta(seconds=options.resync),
        pool_labels=pool_labels,
    )
    controller.start()
    memo.controller = controller
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
    controller.on_gone = memo.runtime.forget
    controller.promote_writes = WRITES.promote
    memo.runtime.memory.detached.settled = controller.write_settled


def on_cleanup(memo: kopf.Memo, **_: Any) -> None:
    controller: Controller | None = memo.get("controller")
    if controller is not None:
        controller.stop()


def _autoscaling_prometheus(options: RunOptions) -> PrometheusAccess | None:
    url = options.autoscaling_prometheus_url or options.prometheus_url
    if not url:
        return None
    # Trigger metadata is not a secret: credentials go through a TriggerAuthentication.
    return PrometheusAccess(without_credentials(url), options.autoscaling_authentication)


def _metrics_reader(options: RunOptions, config: OperatorConfig) -> PrometheusReader | None:
    if not options.prometheus_url:
        return None
    reader = PrometheusReader(
        options.prometheus_url, min_interval=min_query_gap(config.metrics_min_interval)
    )
    logging.getLogger(__name__).info("reading engine metrics from Prometheus at %s", reader.url)
    return reader


async def serve_inference_service(
    body: kopf.Body, namespace: str, name: str, memo: kopf.Memo, **kwargs: Any
) -> None:
    """The daemon of one InferenceService: served by the workers until deleted or stopped."""
    runtime: Runtime = memo.runtime
    controller: Controller = memo.controller
    key = (namespace, name)

    def observe() -> Observed:
        # On the event loop: kopf updates `body` and the indices here, never in between.
        owned = [obj for index in indices.OWNED_INDICES for obj in kwargs[index].get(key, ())]
        return Observed(
            body=indices.plain(body),
            pods=list(kwargs[indices.POD_INDEX].get(key, ())),
            owned=owned,
        )

    await controller.serve(
        key,
        observe,
        partial(decide_pass, runtime),
        partial(_carry_out, runtime),
        uid=str(body["metadata"]["uid"]),
    )


async def _carry_out(runtime: Runtime, decided: Decided, urgency: int) -> PassResult:
    return (await carry_out(runtime, decided, urgency)).passed


def on_inference_service_event(
    namespace: str,
    name: str,
    uid: str,
    body: kopf.Body,
    type: str | None,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    if type == "DELETED":
        memo.controller.deleted((namespace, name), uid)
    else:
        memo.controller.isvc_changed((namespace, name), body)


def on_owned_event(
    namespace: str | None,
    name: str,
    labels: Mapping[str, str],
    body: kopf.Body,
    type: str | None,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    if type == "DELETED" and body.get("kind") in ENGINE_KINDS and namespace:
        memo.runtime.fleet.deployment((namespace, name), None)
    if type == "ADDED":
        # kvq's own create coming back: the pass that applied it knows, and it changes no
        # decision (make bench: a pass each, writing nothing, 3,000 of them in a fleet's
        # rollout). What then changes it (its status, another writer) or deletes it is
        # reconciled; the listing at start-up comes with no type.
        return
    owner = owner_of(labels, namespace)
    if owner is not None:
        memo.controller.notify(owner)


def on_pod_event(
    namespace: str | None,
    labels: Mapping[str, str],
    uid: str,
    body: kopf.Body,
    type: str | None,
    memo: kopf.Memo,
    **_: Any,
) -> None:
    controller: Controller = memo.controller
    owner = owner_of(labels, namespace)
    if owner is not None:
        # A crashed engine first: its pass may move the fallback ladder.
        failure = evidence_from_pod(body) if type != "DELETED" else None
        crashed = failure is not None and failure.crashed
        controller.notify(owner, Priority.FAILURE if crashed else Priority.ROUTINE)
    if type == "DELETED":
        memo.runtime.fleet.pod(uid, None)
    controller.pod_changed(uid, None if type == "DELETED" else body)


def on_node_event(name: str, body: kopf.Body, type: str | None, memo: kopf.Memo, **_: Any) -> None:
    if type == "DELETED":
        memo.runtime.fleet.node(name, None)
    memo.controller.node_changed(name, None if type == "DELETED" else body)


def build_registry() -> kopf.OperatorRegistry:
    # kopf's protocols spell out every kwarg; kvq's handlers take what they use, hence Any.
    registry: Any = kopf.OperatorRegistry()
    # The same login the executor's client uses: in-cluster, else kubeconfig.
    kopf.on.login(registry=registry)(kopf.login_via_client)
    kopf.on.startup(registry=registry)(_handler(on_startup))
    kopf.on.cleanup(registry=registry)(_handler(on_cleanup))
    kopf.index("v1", "nodes", id=indices.NODE_INDEX, registry=registry)(_on_loop(indices.kvq_nodes))
    kopf.on.event("v1", "nodes", registry=registry)(_on_loop(on_node_event))
    managed = indices.MANAGED_BY_KVQ
    by_owner = _on_loop(indices.by_inference_service)
    kopf.index("v1", "pods", labels=managed, id=indices.POD_INDEX, registry=registry)(by_owner)
    # Every pod's GPUs (whoever runs it): what makes a pool full.
    kopf.index("v1", "pods", id=indices.GPU_POD_INDEX, registry=registry)(
        _on_loop(indices.gpu_pods)
    )
    kopf.on.event("v1", "pods", registry=registry)(_on_loop(on_pod_event))
    # kvq's Deployments' GPUs on their pools, bound or not yet: the pools' GPU claims.
    kopf.index("apps/v1", "deployments", labels=managed, id=indices.GPU_CLAIM_INDEX,
               registry=registry)(_on_loop(indices.gpu_claims))  # fmt: skip
    # A replica over several nodes: its LeaderWorkerSet's groups claim whole nodes' GPUs.
    kopf.index(
        "leaderworkerset.x-k8s.io/v1",
        "leaderworkersets",
        labels=managed,
        id=indices.GROUP_CLAIM_INDEX,
        registry=registry,
    )(_on_loop(indices.gpu_claims))
    for index_id, (group, version, plural) in indices.OWNED_INDICES.items():
        api = f"{group}/{version}" if group else version
        kopf.index(api, plural, labels=managed, id=index_id, registry=registry)(by_owner)
        kopf.on.event(api, plural, labels=managed, registry=registry)(_on_loop(on_owned_event))
    kopf.on.event(GROUP, VERSION, PLURAL, registry=registry)(_on_loop(on_inference_service_event))
    kopf.daemon(
        GROUP,
        VERSION,
        PLURAL,
        id=DAEMON_ID,
        cancellation_timeout=DAEMON_CANCELLATION_TIMEOUT,
        registry=registry,
    )(_handler(serve_inference_service))
    _without_finalizer(registry, DAEMON_ID)
    return cast(kopf.OperatorRegistry, registry)


def _without_finalizer(registry: Any, handler_id: str) -> None:
    """kopf puts a finalizer on every object a daemon serves, so that it can stop the daemon
    before the object goes. kvq's loop ends on the deletion event itself (`deleted`), and
    its objects go by their ownerReferences: the finalizer only cost two writes per service
    (a patch when it appears, another when it is deleted), a decision redone on the 409 the
    first patch caused, and a deletion that waited for a running operator. kopf has no
    option for it, so the registered daemon is replaced by the same one without; kopf then
    also removes the finalizer that earlier versions of kvq left on objects."""
    spawning = registry._spawning
    spawning._handlers = [
        dataclasses.replace(h, requires_finalizer=False) if h.id == handler_id else h
        for h in spawning._handlers
    ]


def _handler(fn: Any) -> Any:
    return fn


def _on_loop(fn: Callable[..., Any]) -> Any:
    """`fn` as a coroutine function, so kopf calls it on its event loop. kopf runs a plain
    function in a thread pool: a thread hop per watch event (about a quarter of kopf's time
    in a fleet's rollout) and the controller's asyncio objects touched from another thread.
    kvq's index and event handlers only read the event and signal, so they run inline."""

    async def on_loop(**kwargs: Any) -> Any:
        return fn(**kwargs)

    # kopf names a handler after its function (and unwraps `__wrapped__` to tell a
    # coroutine function, so functools.wraps would send it to the thread pool again).
    on_loop.__name__, on_loop.__qualname__ = fn.__name__, fn.__qualname__
    return on_loop


TRIM_EVERY_S = 30.0


def _trim_heap_periodically(every: float = TRIM_EVERY_S) -> None:
    """Hand freed heap back to the system every `every` seconds (glibc's malloc_trim). A
    fleet's burst decodes hundreds of MB of watch events and answers; glibc keeps what
    Python frees in its arenas (one per writer thread, up to 8 per core), so an idle
    operator held the burst's peak. Without glibc this does nothing."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        logging.getLogger(__name__).info("heap not trimmed: no glibc malloc_trim")
        return

    def loop() -> None:
        while True:
            time.sleep(every)  # a period, not a wait for a condition
            trim(0)

    threading.Thread(target=loop, name="kvq-trim-heap", daemon=True).start()


def run(options: RunOptions) -> None:
    """Serve metrics and run the operator until a signal stops it."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # kopf reports every handler pass at INFO; that drowns kvq's own lines.
    logging.getLogger("kopf.objects").setLevel(logging.INFO if options.verbose else logging.WARNING)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)  # every liveness probe
    # `kill -USR1 <pid>` prints every thread's stack: how to see where a reconcile hangs.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    _trim_heap_periodically()
    serve_metrics(options.metrics_port)
    kopf.run(
        registry=build_registry(),
        clusterwide=options.all_namespaces,
        namespaces=list(options.namespaces),
        standalone=options.standalone or None,
        peering_name=options.peering,
        # Same-priority peers all pause; a random priority leaves exactly one replica active.
        priority=options.priority if options.priority is not None else secrets.randbelow(2**30),
        liveness_endpoint=options.liveness,
        memo=kopf.Memo(options=options),
    )
